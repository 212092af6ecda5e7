"""The `cdnpg` command line: paraphrase sentences with a C-DNPG model, and draw the paper's Figure 2 (the granularity
z of every layer) for any sentence.

    cdnpg paraphrase --model DIR "how do i learn python ?" "what is the capital of france ?"
    cdnpg paraphrase --model DIR --input questions.txt --output paraphrases.jsonl --num-return-sequences 3
    cdnpg granularity --model DIR "how do i learn python ?" --out figure.png --decoder --show
    cdnpg convert facebook/bart-base checkpoints/bart-resonance --granularity-mask resonance

Exit codes: 0 success; 1 runtime error (a model or input file that is missing or cannot be loaded, a failure while
running); 2 usage error (a malformed command line: unknown option, bad value, options that contradict each other,
an unsupported --out suffix). Errors are one line on stderr; `-v` adds the traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

logger = logging.getLogger("cdnpg.cli")  # not __name__: `python -m cdnpg.cli` runs it as __main__

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class CLIError(Exception):
    """An error the user can act on: reported as one line on stderr, exit code 1."""


# ---------------------------------------------------------------------------------------------------------------------
# Model loading
# ---------------------------------------------------------------------------------------------------------------------


def resolve_device(name: str) -> str:
    """`auto` -> cuda when available, else cpu; a CUDA device that is not there is an error, not a silent fallback."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {name}: CUDA is not available on this machine (use --device cpu or auto)")
    return name


def load_model(
    name_or_path: str, device: str = "auto", trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer through the Auto classes, from a local directory or a Hub repo id, in eval mode.

    A missing model fails at once, naming the path, before torch is imported or the Hub asked
    (`cdnpg.hub.resolve_model_source`).
    """
    from cdnpg.hub import resolve_model_source

    try:
        source = resolve_model_source(name_or_path)
    except FileNotFoundError as err:
        raise CLIError(f"--model {err}") from err
    where = "directory"
    if not Path(source).is_dir():
        logger.info("%s: no such directory, trying it as a Hugging Face Hub repo", name_or_path)
        where = "no such directory; as a Hub repo"

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes: local checkpoints need no remote code)

    device = resolve_device(device)
    logger.info("loading %s on %s", name_or_path, device)
    try:  # the model first: a wrong path or repo fails on its config.json, before any tokenizer file is tried
        model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CLIError(f"--model {name_or_path}: cannot load it ({where}): {reason}") from err
    return model.to(device).eval(), tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# paraphrase
# ---------------------------------------------------------------------------------------------------------------------


def paraphrase(
    paraphraser: CDNPGText2TextPipeline,
    texts: Sequence[str],
    num_beams: int | None = None,
    num_return_sequences: int = 1,
    max_new_tokens: int | None = None,
    novelty: float | None = None,
    first_index: int = 1,
) -> list[list[dict[str, str | float]]]:
    """The candidates of each text, through the text2text pipeline (so the command and the pipeline decode and
    detokenise alike), as one batch: `{"generated_text": ...}`, with `novelty` also `"score"` and its parts.

    A text with nothing to paraphrase (empty, blank, or only unknown tokens: `pipeline_cdnpg.unreadable`) gets none,
    with a warning. Inputs longer than the model takes are truncated to that (not to the paper's 20 tokens), with a
    warning. `first_index` numbers the texts in warnings (their line number in the input).
    """
    from cdnpg.inference import generation_kwargs, input_limit, warn_long_inputs
    from modeling_cdnpg.pipeline_cdnpg import unreadable

    model, tokenizer = paraphraser.model, paraphraser.tokenizer
    todo = []
    for offset, text in enumerate(texts):
        problem = unreadable(tokenizer, text)
        if problem:
            logger.warning("input %d %s: no paraphrase", first_index + offset, problem)
        else:
            todo.append(offset)
    results: list[list[dict[str, str | float]]] = [[] for _ in texts]
    if not todo:
        return results
    sources = [texts[o].strip() for o in todo]
    longest = warn_long_inputs(tokenizer, sources, *input_limit(model, tokenizer), [first_index + o for o in todo])
    diverse = bool(novelty)  # novelty > 0: one beam search per candidate, so the beam size need not reach -n
    settings = generation_kwargs(
        model,
        longest,
        num_beams=num_beams,
        num_return_sequences=1 if diverse else num_return_sequences,
        max_new_tokens=max_new_tokens,
    )
    settings["num_return_sequences"] = num_return_sequences
    if novelty is not None:
        settings["novelty"] = novelty
    for offset, candidates in zip(todo, paraphraser(sources, batch_size=len(sources), **settings)):
        for candidate in candidates:  # one line each: no tabs or newlines inside
            candidate["generated_text"] = " ".join(candidate["generated_text"].split())
        results[offset] = candidates
    return results


def _batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _stdin_lines() -> Iterator[str]:
    if sys.stdin.isatty():
        logger.info("reading sentences from stdin, one per line; end with Ctrl-D")
    for line in sys.stdin:
        yield line.rstrip("\r\n")


def _check_paraphrase(args: argparse.Namespace) -> str | None:
    if args.text and args.input:
        return "give sentences as arguments or with --input FILE, not both"
    if args.batch_size < 1:
        return f"--batch-size must be at least 1, got {args.batch_size}"
    if args.num_return_sequences < 1:
        return f"--num-return-sequences must be at least 1, got {args.num_return_sequences}"
    if args.novelty is not None and not 0 <= args.novelty <= 1:
        return f"--novelty must be between 0 and 1, got {args.novelty}"
    if not args.novelty and args.num_beams is not None and args.num_return_sequences > args.num_beams:
        return (
            f"--num-return-sequences {args.num_return_sequences} cannot exceed --num-beams {args.num_beams} "
            "(beam search returns at most one sequence per beam; with --novelty above 0 it can)"
        )
    return _check_generation(args)


def _run_paraphrase(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    if args.input is not None and not Path(args.input).is_file():
        raise CLIError(f"--input {args.input}: no such file")
    if args.output is not None and not Path(args.output).resolve().parent.is_dir():
        raise CLIError(f"--output {args.output}: its directory does not exist")
    model, tokenizer = load_model(args.model, args.device, args.trust_remote_code)
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)

    total = None
    if args.text:
        lines: Iterable[str] = args.text
    elif args.input is not None:
        lines = Path(args.input).read_text(encoding="utf-8").splitlines()
        total = len(lines)
    else:
        lines = _stdin_lines()

    out: TextIO = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    progress = tqdm(total=total, unit="sentence", disable=None if total else True, file=sys.stderr)
    written, reported = 0, set()
    try:
        with (
            logging_redirect_tqdm(loggers=[logging.getLogger("cdnpg")]),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")  # the model's warnings (e.g. "no z"), once each, as the command's
            for batch in _batched(lines, args.batch_size):
                results = paraphrase(
                    paraphraser,
                    batch,
                    num_beams=args.num_beams,
                    num_return_sequences=args.num_return_sequences,
                    max_new_tokens=args.max_new_tokens,
                    novelty=args.novelty,
                    first_index=written + 1,
                )
                for message in [str(warning.message) for warning in caught]:
                    if message not in reported:
                        logger.warning("%s", message)
                        reported.add(message)
                caught.clear()
                for source, candidates in zip(batch, results):
                    out.write(_format(source, candidates, jsonl=bool(args.output)) + "\n")
                out.flush()  # stream: a pipe sees each batch as soon as it is done
                written += len(batch)
                progress.update(len(batch))
    finally:
        progress.close()
        if out is not sys.stdout:
            out.close()
    if args.output:
        logger.info("wrote %d lines to %s", written, args.output)
    return EXIT_OK


def _format(source: str, candidates: list[dict[str, str | float]], jsonl: bool) -> str:
    """One output line: the candidates separated by tabs, each followed by its score (with --novelty); or JSON."""
    texts = [candidate["generated_text"] for candidate in candidates]
    scores = [round(candidate["score"], 4) for candidate in candidates if "score" in candidate]
    if jsonl:
        return json.dumps(
            {"source": source, "paraphrases": texts, **({"scores": scores} if scores else {})}, ensure_ascii=False
        )
    if scores:
        return "\t".join(f"{text}\t{score:.3f}" for text, score in zip(texts, scores))
    return "\t".join(texts)


# ---------------------------------------------------------------------------------------------------------------------
# granularity
# ---------------------------------------------------------------------------------------------------------------------


def _check_granularity(args: argparse.Namespace) -> str | None:
    from cdnpg.figures import FIGURE_SUFFIXES

    if not args.out and not args.show:
        return "nothing to do: give --out FILE (.png, .svg, .pdf or .html) and/or --show"
    for out in args.out:
        if Path(out).suffix.lower() not in FIGURE_SUFFIXES:
            allowed = ", ".join(FIGURE_SUFFIXES)
            return f"--out {out}: unsupported file type {Path(out).suffix or '(none)'!r}; use one of {allowed}"
    if not args.text.strip():
        return "the sentence is empty"
    return _check_generation(args)


def _use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _run_granularity(args: argparse.Namespace) -> int:
    from cdnpg.figures import render, render_text
    from cdnpg.granularity import GranularityUnavailableError, word_granularities

    for out in args.out:
        if not Path(out).resolve().parent.is_dir():
            raise CLIError(f"--out {out}: its directory does not exist")
    model, tokenizer = load_model(args.model, args.device, args.trust_remote_code)
    try:
        rows = word_granularities(
            model,
            tokenizer,
            args.text,
            decoder=args.decoder,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
        )
    except GranularityUnavailableError as err:
        raise CLIError(f"--model {args.model}: {err}") from err
    for out in args.out:
        logger.info("wrote %s", render(rows, out))
    if args.show:
        sys.stdout.write(render_text(rows, color=_use_color()))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------------------
# convert
# ---------------------------------------------------------------------------------------------------------------------


def _check_convert(args: argparse.Namespace) -> str | None:
    from modeling_cdnpg.configuration_cdnpg import GRANULARITY_MASK_MODES, GRANULARITY_MASKS

    for option, value, allowed in (
        ("--granularity-mask", args.granularity_mask, GRANULARITY_MASKS),
        ("--granularity-mask-mode", args.granularity_mask_mode, GRANULARITY_MASK_MODES),
    ):
        if value not in allowed:
            return f"{option} {value!r}: choose one of {', '.join(allowed)}"
    if Path(args.output).exists() and any(Path(args.output).iterdir()) and not args.overwrite:
        return f"{args.output} exists and is not empty: choose another folder, or pass --overwrite"
    return None


def _run_convert(args: argparse.Namespace) -> int:
    from cdnpg.convert import convert
    from cdnpg.hub import checkpoint_name, resolve_model_source, save_checkpoint

    try:
        resolve_model_source(args.source)
    except FileNotFoundError as err:
        raise CLIError(f"SOURCE {err}") from err
    options = {
        "granularity_mask": args.granularity_mask,
        "granularity_mask_mode": args.granularity_mask_mode,
        "cross_attention_granularity": not args.no_cross_attention_granularity,
    }
    model, tokenizer = convert(args.source, **options)
    summary = (
        f"Converted from `{checkpoint_name(args.source)}` ({model.config.encoder_layers} + {model.config.decoder_layers} layers, "
        f"d {model.config.d_model}) with `cdnpg convert`; not trained for paraphrasing yet."
    )
    save_checkpoint(model, tokenizer, args.output, training_summary=summary, warm_start=checkpoint_name(args.source))
    new = sum(p.numel() for name, p in model.named_parameters() if "granularity_head" in name)
    logger.info(
        "wrote %s (%s parameters, %s of them new granularity heads)",
        args.output,
        f"{model.num_parameters():,}",
        f"{new:,}",
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------------------------------


def _check_generation(args: argparse.Namespace) -> str | None:
    if args.num_beams is not None and args.num_beams < 1:
        return f"--num-beams must be at least 1, got {args.num_beams}"
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        return f"--max-new-tokens must be at least 1, got {args.max_new_tokens}"
    return None


def _device(value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cdnpg")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The `cdnpg` parser: one subcommand per task, each with the shared model and generation options."""
    model_options = argparse.ArgumentParser(add_help=False)
    group = model_options.add_argument_group("model")
    group.add_argument(
        "--model", required=True, metavar="DIR_OR_REPO", help="saved model directory, or a Hub repo id (owner/name)"
    )
    group.add_argument(
        "--device",
        type=_device,
        default="auto",
        metavar="DEVICE",
        help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps",
    )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a Hub repo's own modeling code (not needed where this package is installed)",
    )
    model_options.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks on errors")
    generation = model_options.add_argument_group("generation (granularity: only with --decoder)")
    generation.add_argument(
        "--num-beams",
        type=int,
        default=None,
        metavar="N",
        help="beam size (default: the model's generation_config, 8 for C-DNPG as in the paper)",
    )
    generation.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        metavar="N",
        help="paraphrase length cap in tokens (default: the model's generation_config, 20 for C-DNPG, raised to the "
        "input's length for longer inputs), never more than the model's positions allow",
    )

    parser = argparse.ArgumentParser(
        prog="cdnpg",
        description="C-DNPG (Gu et al., COLING 2022): paraphrase generation, granularity figures, warm starts.",
        epilog="Exit codes: 0 ok, 1 runtime error, 2 usage error. See docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    para = commands.add_parser(
        "paraphrase",
        parents=[model_options],
        help="paraphrase sentences",
        description="Paraphrase sentences given as arguments, read from --input FILE or from stdin (one per line). "
        "Without --output, prints one line per input, its paraphrases separated by tabs (an empty line for "
        "an empty input); with --output, writes JSONL {source, paraphrases}.",
    )
    para.add_argument("text", nargs="*", help="sentences to paraphrase (default: --input FILE, else stdin)")
    para.add_argument("--input", "-i", metavar="FILE", help="text file, one sentence per line")
    para.add_argument(
        "--output", "-o", metavar="FILE", help='JSONL file: one {"source": ..., "paraphrases": [...]} per input line'
    )
    para.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="sentences per generate() call (default 32)"
    )
    para.add_argument(
        "--num-return-sequences", "-n", type=int, default=1, metavar="N", help="paraphrases per sentence (default 1)"
    )
    para.add_argument(
        "--novelty",
        type=float,
        default=None,
        metavar="X",
        help="0 to 1: how far from the input's wording (its template; details are kept); with it, -n diverse "
        "candidates, best first, each followed by its score (default: the model's own decoding). See docs/cli.md",
    )
    para.set_defaults(check=_check_paraphrase, run=_run_paraphrase, parser=para)

    gran = commands.add_parser(
        "granularity",
        parents=[model_options],
        help="draw z per layer for a sentence (the paper's Figure 2)",
        description="The granularity z (eq. 4) of every encoder layer for one sentence, per word (the mean of its "
        "word pieces; [CLS]/[SEP] omitted): 0 = sentence-level template, 1 = phrase-level detail.",
    )
    gran.add_argument("text", help="the sentence (quote it)")
    gran.add_argument(
        "--out",
        "-o",
        action="append",
        default=[],
        metavar="FILE",
        help="output file: .png, .svg or .pdf (matplotlib heat map) or .html; repeat for several",
    )
    gran.add_argument(
        "--decoder",
        action="store_true",
        help="also the decoder layers' self-attention z over the model's own paraphrase of the sentence",
    )
    gran.add_argument("--show", action="store_true", help="print a words x layers table of z to stdout")
    gran.set_defaults(check=_check_granularity, run=_run_granularity, parser=gran)

    conv = commands.add_parser(
        "convert",
        help="put GA-attention on a pretrained BART or BERT-family checkpoint",
        description="Convert a BartForConditionalGeneration or a BERT-family encoder (encoder and decoder both from "
        "it, bert2bert) into a C-DNPG checkpoint: every pretrained weight is kept, the granularity heads are new "
        "(started at z = 0.5, so that a resonance model starts as the pretrained one). See docs/warm_start.md.",
    )
    conv.add_argument("source", metavar="SOURCE", help="checkpoint folder or Hub repo id (owner/name)")
    conv.add_argument("output", metavar="OUTPUT", help="folder to write the C-DNPG checkpoint to")
    conv.add_argument(
        "--granularity-mask", "--granularity_mask", default="resonance", metavar="MASK",
        help="eq. 9 mask: resonance (default), scope, product, mean, or none (the plain pretrained model)",
    )  # fmt: skip
    conv.add_argument(
        "--granularity-mask-mode", "--granularity_mask_mode", default="log_bias", metavar="MODE",
        help="how the mask enters attention: log_bias (default) or multiply",
    )  # fmt: skip
    conv.add_argument(
        "--no-cross-attention-granularity", action="store_true", help="no resonance mask in cross-attention"
    )
    conv.add_argument("--overwrite", action="store_true", help="write into a non-empty OUTPUT folder")
    conv.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks on errors")
    conv.set_defaults(check=_check_convert, run=_run_convert, parser=conv)
    return parser


class _Formatter(logging.Formatter):
    """One-line messages a user can tell from the model's output: "cdnpg: ..." for progress, "cdnpg: warning: ..."
    and "cdnpg: error: ..." (argparse's own style) otherwise."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno == logging.INFO:
            return f"cdnpg: {message}"
        return f"cdnpg: {record.levelname.lower()}: {message}"


@contextlib.contextmanager
def _cli_logging(verbose: bool) -> Iterator[None]:
    """One-line messages on stderr for the run, then the logging state as it was: `main` is callable from Python."""
    from transformers.utils import logging as hf_logging

    package, hub = logging.getLogger("cdnpg"), logging.getLogger("huggingface_hub")
    saved = (package.handlers[:], package.level, package.propagate, hub.level)
    hf_saved = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    package.handlers[:] = [handler]
    package.setLevel(logging.DEBUG if verbose else logging.INFO)
    package.propagate = False
    if not verbose:
        hf_logging.set_verbosity_error()  # our own warnings cover what a user of this command needs
        hf_logging.disable_progress_bar()  # "Loading weights" bars: noise on every call
        hub.setLevel(logging.ERROR)  # "Retrying in 4s" lines: the one-line error says what failed
    try:
        yield
    finally:
        package.handlers[:], package.level, package.propagate, hub.level = saved
        hf_logging.set_verbosity(hf_saved[0])
        if hf_saved[1]:
            hf_logging.enable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """Run `cdnpg` with `argv` (default: sys.argv[1:]); return the exit code (0 ok, 1 runtime, 2 usage error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        problem = args.check(args)
        if problem:
            args.parser.error(problem)
    except SystemExit as stop:  # argparse: --help, --version (0) and usage errors (2)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    with _cli_logging(args.verbose):
        try:
            return args.run(args)
        except BrokenPipeError:  # the reader left (`cdnpg paraphrase ... | head`): stop quietly
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            return EXIT_ERROR
        except CLIError as err:
            logger.error("%s", err, exc_info=args.verbose)
        except (OSError, ValueError, RuntimeError) as err:
            logger.error("%s: %s", type(err).__name__, err, exc_info=args.verbose)
        except KeyboardInterrupt:
            logger.error("interrupted")
            return 130
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
