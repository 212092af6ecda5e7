#!/usr/bin/env python
"""Write docs/api.md, the API reference, from the code's docstrings and signatures, so that the two cannot drift.

    python scripts/api_docs.py           # rewrite docs/api.md
    python scripts/api_docs.py --check   # exit 1 if docs/api.md is not what the code gives

Sections: `CDNPGConfig` (every field of its docstring's Args, grouped by CONFIG_GROUPS, defaults from `__init__`),
`CDNPGForConditionalGeneration` and its outputs, `paraphrase()`, `ParaphraseSettings`, `granularity_processors()`
and the text2text pipeline. A docstring line `name: text` or `name, other (type): text` is an argument's entry.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

import modeling_cdnpg
from modeling_cdnpg import configuration_cdnpg, generation_cdnpg, pipeline_cdnpg
from modeling_cdnpg import modeling_cdnpg as modeling

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"

CONFIG_GROUPS = {  # heading -> the fields of CDNPGConfig's docstring under it, in its order
    "Vocabulary and positions": (
        "vocab_size", "max_position_embeddings", "position_offset", "scale_embedding", "layernorm_embedding",
    ),
    "Encoder and decoder (Section 4.2)": (
        "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
        "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "layer_norm_eps", "dropout", "attention_dropout",
        "activation_dropout",
    ),
    "GA-attention: granularity z and its masks (eqs. 4 to 9)": (
        "granularity_mask", "granularity_mask_mode", "scope_epsilon", "cross_attention_granularity",
        "compile_granularity_masks",
    ),
    "Output head and copy mechanism": ("lm_head_transform", "copy_mechanism", "copy_excluded_token_ids"),
    "Initialisation, cache and special tokens": (
        "initializer_range", "use_cache", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id",
        "decoder_start_token_id",
    ),
}  # fmt: skip
NAMES = r"\*{0,2}[a-z_][a-z0-9_]*(?:, \*{0,2}[a-z_][a-z0-9_]*)*"
ENTRY = re.compile(rf"^(?P<names>{NAMES})(?: \((?P<type>.*?)\))?: (?P<text>.*)$")  # `name (type): text`


def entries(doc: str) -> list[tuple[list[str], str, str]]:
    """The argument entries of a docstring's lines: (names, type, text), continuation lines joined."""
    found = []
    for line in doc.splitlines():
        if match := ENTRY.match(line.strip()):
            found.append(
                ([name.lstrip("*") for name in match["names"].split(", ")], match["type"] or "", match["text"])
            )
        elif found and line.startswith(" ") and line.strip():
            names, kind, text = found[-1]
            found[-1] = (names, kind, f"{text} {line.strip()}")
    return found


def config_entries(args: str) -> list[tuple[list[str], list[str], str]]:
    """The config docstring's Args: (names, types, text) per entry. A header is a line at the entries' indentation,
    `name (`type`, defaults to ...), name (`type`, ...):`; the lines below it, indented further, are its text."""
    lines = [line for line in args.splitlines() if line.strip()]
    indent = min(len(line) - len(line.lstrip()) for line in lines)
    found = []
    for line in lines:
        if len(line) - len(line.lstrip()) > indent:
            found[-1][2] = f"{found[-1][2]} {line.strip()}".strip()
            continue
        outside, inside, depth = "", [], 0  # the header's text outside parentheses, and each parenthesis' text
        for char in line.strip().removesuffix(":"):
            depth -= char == ")"
            if depth:
                inside[-1] += char
            elif char not in "()":
                outside += char
            depth += char == "("
            if char == "(" and depth == 1:
                inside.append("")
        types = [re.findall(r"`([^`]*)`", text)[0] for text in inside if "`" in text]
        found.append([[name.strip() for name in outside.split(",") if name.strip()], types, ""])
    return [(names, types, text) for names, types, text in found]


def prose(doc: str) -> str:
    """A docstring as markdown: paragraphs joined into lines, argument entries as a bullet list."""
    blocks, lines = [], []
    for line in [*doc.splitlines(), ""]:
        if not line.strip():
            blocks.append(" ".join(lines)) if lines else None
            lines = []
        elif ENTRY.match(line.strip()):
            blocks.append(" ".join(lines)) if lines else None
            match = ENTRY.match(line.strip())
            kind = f" ({match['type']})" if match["type"] else ""
            names = ", ".join(f"`{name.lstrip('*')}`" for name in match["names"].split(", "))
            lines = [f"- {names}{kind}: {match['text']}"]
        else:
            lines.append(line.strip())
    return "\n".join(block if block.startswith("- ") else f"\n{block}\n" for block in blocks).strip() + "\n"


def signature(name: str, function: Callable) -> str:
    """`name(a, b=1, *, c=None, **kwargs)`: the parameters and their defaults, without annotations."""
    parameters = inspect.signature(function).parameters.values()
    shown = [p.replace(annotation=inspect.Parameter.empty) for p in parameters if p.name != "self"]
    text = f"{name}({', '.join(map(str, shown))})"
    return text if len(text) <= 110 else f"{name}(\n    " + ",\n    ".join(map(str, shown)) + ",\n)"


def function_section(title: str, name: str, function: Callable, doc: str | None = None) -> str:
    return f"## {title}\n\n```text\n{signature(name, function)}\n```\n\n{prose(doc or inspect.getdoc(function))}"


def default(name: str) -> str:
    parameter = inspect.signature(configuration_cdnpg.CDNPGConfig.__init__).parameters.get(name)
    if parameter is not None:
        return repr(parameter.default)
    return repr(configuration_cdnpg.BERT_SPECIAL_TOKEN_IDS[name])  # a token id the config passes to its base


def config_section() -> str:
    config = configuration_cdnpg.CDNPGConfig
    doc = inspect.getdoc(config)
    documented = config_entries(doc.split("Args:", 1)[1])
    grouped = {name for names in CONFIG_GROUPS.values() for name in names}
    if stray := [name for names, _, _ in documented for name in names if name not in grouped]:
        raise SystemExit(f"api_docs.py: add {stray} to CONFIG_GROUPS")
    out = [f"## `CDNPGConfig`\n\n{prose(doc.split('Args:', 1)[0])}"]
    out.append("`from configuration_cdnpg import CDNPGConfig` (or `modeling_cdnpg`); a bad value is a `ValueError`")
    out.append(" naming the field, raised when the config is made. Allowed values:\n\n")
    out += [f"- `{name}`: {', '.join(f'`{value!r}`' for value in values)}\n" for name, values in
            configuration_cdnpg.CHOICES.items()]  # fmt: skip
    for heading, names in CONFIG_GROUPS.items():
        out.append(f"\n### {heading}\n\n| field = default | type | what it is |\n|---|---|---|\n")
        for fields, types, text in documented:
            if fields[0] in names:
                cell = "<br>".join(f"`{field}` = `{default(field)}`" for field in fields)
                kinds = " / ".join(f"`{kind}`" for kind in dict.fromkeys(types))
                out.append(f"| {cell} | {kinds} | {text.replace('|', '&#124;')} |\n")
    return "".join(out)


def output_fields(output: type) -> str:
    names = ", ".join(f"`{field.name}`" for field in dataclasses.fields(output))
    return f"`{output.__name__}`: {prose(inspect.getdoc(output)).strip()} Fields: {names}.\n"


def model_section() -> str:
    model = modeling.CDNPGForConditionalGeneration
    return "".join([
        f"## `CDNPGForConditionalGeneration`\n\n{prose(inspect.getdoc(model))}\n",
        f"```text\n{signature('CDNPGForConditionalGeneration.forward', model.forward)}\n```\n\n",
        prose(inspect.getdoc(model.forward)), "\n",
        f"```text\n{signature('CDNPGModel.forward', modeling.CDNPGModel.forward)}\n```\n\n",
        prose(inspect.getdoc(modeling.CDNPGModel.forward)),
        "\n### Outputs: z per layer\n\n",
        *(f"- {output_fields(output)}" for output in (modeling.CDNPGSeq2SeqLMOutput, modeling.CDNPGModelOutput,
                                                     modeling.CDNPGEncoderOutput)),
    ])  # fmt: skip


def pipeline_section() -> str:
    pipeline = pipeline_cdnpg.CDNPGText2TextPipeline
    settings = ", ".join(f"`{name}`" for name in pipeline_cdnpg.PARAPHRASING)
    parts = ", ".join(f"`{key}`" for key in pipeline_cdnpg.PARTS)
    return "".join([
        "## The pipeline: `pipeline(\"text2text-generation\", model=..., trust_remote_code=True)`\n\n",
        f"`{pipeline.__name__}`. {prose(inspect.getdoc(pipeline))}\n",
        f"```text\n{signature('paraphraser', pipeline.__call__)}\n",
        f"{signature('paraphraser._sanitize_parameters', pipeline._sanitize_parameters)}\n```\n\n",
        prose(inspect.getdoc(pipeline.__call__)), prose(inspect.getdoc(pipeline._sanitize_parameters)), "\n",
        f"Paraphrasing keywords (the rest go to `generate()`): {settings}. A candidate's keys besides ",
        f"`generated_text`: {parts}.\n",
    ])  # fmt: skip


def render() -> str:
    settings = generation_cdnpg.ParaphraseSettings
    sections = [
        "# API reference\n\n"
        "<!-- Generated by `python scripts/api_docs.py` from the docstrings of modeling_cdnpg/: edit those, then "
        "rerun it. -->\n\n"
        "The model, its config and the paraphrasing API, as `modeling_cdnpg` exports them (`from modeling_cdnpg import "
        f"{', '.join(sorted(name for name in modeling_cdnpg.__all__ if name[0].isupper() or name == 'paraphrase'))}`"
        "); a checkpoint carries the same code. Usage: [novelty.md](novelty.md), training flags: "
        "[train.md](train.md).\n",
        config_section(),
        model_section(),
        function_section("`paraphrase()`", "paraphrase", generation_cdnpg.paraphrase),
        f"- {output_fields(generation_cdnpg.CDNPGParaphraseOutput)}",
        f"## `ParaphraseSettings`\n\n```text\n{signature('ParaphraseSettings', settings)}\n```\n\n"
        f"{prose(inspect.getdoc(settings))}\n"
        f"- `candidates`: {inspect.getdoc(settings.candidates)}\n- `groups`: {inspect.getdoc(settings.groups)}\n"
        f"- `ranking_weights(rank_by)`: {' '.join(inspect.getdoc(generation_cdnpg.ranking_weights).split())} "
        f"`RANKING_PARTS`: {', '.join(f'`{part}`' for part in generation_cdnpg.RANKING_PARTS)}.\n\n"
        "A generation config may default these fields: "
        f"{', '.join(f'`{name}`' for name in generation_cdnpg.CONFIGURED)} (`from_generation_config`). "
        f"`{signature('paraphrasing_defaults', generation_cdnpg.paraphrasing_defaults)}`: "
        f"{prose(inspect.getdoc(generation_cdnpg.paraphrasing_defaults))}",
        function_section(
            "`granularity_processors()`", "granularity_processors", generation_cdnpg.granularity_processors
        ),
        pipeline_section(),
    ]
    return "\n".join(section.rstrip("\n") + "\n" for section in sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare docs/api.md with the code's, write nothing")
    parser.add_argument("--out", type=Path, default=API_PAGE, help="the page to write (default docs/api.md)")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == page
        print("docs/api.md is up to date" if same else "docs/api.md differs: run python scripts/api_docs.py")
        return 0 if same else 1
    args.out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
