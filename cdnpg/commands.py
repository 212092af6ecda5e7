"""What each `cdnpg` subcommand does (`cdnpg.cli` parses the command line and reports errors): load the model,
paraphrase sentences, draw the granularity z of a sentence, convert a pretrained checkpoint.

Each subcommand has `check_<name>(args)`, which returns a usage problem (exit code 2) or None before anything is
loaded, and `run_<name>(args)`, which returns the exit code or raises `InputError` (exit code 1). Between the two,
`check_inputs(args)` refuses a missing file or model (exit code 1) before torch is imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import queue
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from cdnpg.augment import paraphrase  # the one batch path: the command's, the library's
from cdnpg.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from cdnpg.ranking import SentenceSimilarity

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
LOGGERS = ("cdnpg", "modeling_cdnpg")  # said on stderr as the command's: its own, and the model's (input warnings)
# stdin quiet this long: paraphrase the lines read so far rather than wait for a full batch (a slow producer's lines
# are printed as they come; a fast one still fills batches)
STDIN_STALL_SECONDS = 0.2
FIRST_PORT, PORTS_TRIED = 7860, 100  # where Gradio looks for a free port when --port is not given
INSTALL_DEMO = "pip install 'cdnpg[demo]' (pip install -e '.[demo]' in a checkout)"


# ---------------------------------------------------------------------------------------------------------------------
# Model loading and the options every subcommand shares
# ---------------------------------------------------------------------------------------------------------------------


def check_inputs(args: argparse.Namespace) -> None:
    """What the command reads is there and where it writes can be written, before torch and transformers are
    imported (seconds): `--input`, the folders of `--output` and `--out`, and the model (`--model`, convert's SOURCE:
    `cdnpg.hub.resolve_model_source`: a Hub id with one request). Raises `InputError` naming the flag."""
    if getattr(args, "input", None) is not None and not Path(args.input).is_file():
        raise InputError(f"--input {args.input}: no such file")
    outputs = [("--output", args.output)] if getattr(args, "output", None) is not None else []
    for flag, out in [*outputs, *(("--out", out) for out in getattr(args, "out", ()))]:
        if not Path(out).resolve().parent.is_dir():
            raise InputError(f"{flag} {out}: its directory does not exist")
        if flag == "--out" and Path(out).suffix.lower() != ".html" and importlib.util.find_spec("matplotlib") is None:
            raise InputError(
                f"--out {out}: the heat map needs matplotlib, which is not installed: pip install matplotlib (or "
                "the train extra, pip install -e '.[train]' in a checkout); .html and --show need nothing more"
            )
    models = [("--model", getattr(args, "model", None))]
    models += [("SOURCE", args.source)] if args.command == "convert" else []
    for flag, model in models:
        if model is not None:
            from cdnpg.hub import resolve_model_source

            try:
                resolve_model_source(model)
            except InputError as err:
                raise InputError(f"{flag} {err}") from err


def check_generation(args: argparse.Namespace) -> str | None:
    """The generation options that paraphrase and granularity share."""
    if args.num_beams is not None and args.num_beams < 1:
        return f"--num-beams must be at least 1, got {args.num_beams}"
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        return f"--max-new-tokens must be at least 1, got {args.max_new_tokens}"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# paraphrase
# ---------------------------------------------------------------------------------------------------------------------


def _batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _stdin_batches(size: int, stall: float = STDIN_STALL_SECONDS) -> Iterator[list[str]]:
    """Batches of stdin lines, in order, each as soon as it is full or the input pauses for `stall` seconds, so
    that `slow_producer | cdnpg paraphrase` prints a line's paraphrase while the producer still works."""
    if sys.stdin.isatty():
        logger.info("reading sentences from stdin, one per line; end with Ctrl-D")
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            lines.put(line.rstrip("\r\n"))
        lines.put(None)  # end of input

    threading.Thread(target=read, daemon=True).start()
    while (line := lines.get()) is not None:
        batch = [line]
        while len(batch) < size:
            try:
                line = lines.get(timeout=stall)
            except queue.Empty:  # the producer is slower than us: paraphrase what is here
                break
            if line is None:
                yield batch
                return
            batch.append(line)
        yield batch


def check_paraphrase(args: argparse.Namespace) -> str | None:
    if args.text and args.input:
        return "give sentences as arguments or with --input FILE, not both"
    if args.batch_size < 1:
        return f"--batch-size must be at least 1, got {args.batch_size}"
    if args.num_return_sequences < 1:
        return f"--num-return-sequences must be at least 1, got {args.num_return_sequences}"
    if args.novelty is not None and not 0 <= args.novelty <= 1:
        return f"--novelty must be between 0 and 1, got {args.novelty}"
    if args.keep_details is not None and not 0 <= args.keep_details <= 1:
        return f"--keep-details must be between 0 and 1, got {args.keep_details}"
    if not args.novelty and args.num_beams is not None and args.num_return_sequences > args.num_beams:
        return (
            f"--num-return-sequences {args.num_return_sequences} cannot exceed --num-beams {args.num_beams} "
            "(beam search returns at most one sequence per beam; with --novelty above 0 it can)"
        )
    if args.candidates is not None and args.candidates < args.num_return_sequences:
        return (
            f"--candidates {args.candidates} must be at least --num-return-sequences {args.num_return_sequences} "
            "(the best -n of the candidates are printed)"
        )
    if not args.novelty and args.num_beams is not None and (args.candidates or 0) > args.num_beams:
        return (
            f"--candidates {args.candidates} cannot exceed --num-beams {args.num_beams} "
            "(beam search returns at most one sequence per beam; with --novelty above 0 it can)"
        )
    if args.rank_by is not None:
        from cdnpg.ranking import needs_similarity, parse_ranking

        try:
            uses_similarity = needs_similarity(parse_ranking(args.rank_by))
        except ValueError as err:
            return f"--rank-by {args.rank_by}: {err}"
        if args.similarity_model is not None and not uses_similarity:
            return f"--similarity-model is for a ranking that weighs similarity, and --rank-by {args.rank_by} does not"
    return check_generation(args)


def load_similarity(args: argparse.Namespace, model: PreTrainedModel) -> SentenceSimilarity | None:
    """The sentence embedder the ranking (--rank-by, else the model's generation_config.rank_by) needs, on the
    model's device: --similarity-model, else `default_similarity_model`; None for a ranking that needs none."""
    from cdnpg.ranking import SentenceSimilarity, default_similarity_model, needs_similarity, parse_ranking
    from modeling_cdnpg.generation_cdnpg import paraphrasing_defaults

    own = paraphrasing_defaults(model.generation_config).get("rank_by")
    ranking = parse_ranking(args.rank_by) if args.rank_by is not None else own
    if not needs_similarity(ranking):
        if args.similarity_model is not None:
            raise InputError(
                f"--similarity-model is for a ranking that weighs similarity, and the model's rank_by {ranking!r} "
                "does not: give --rank-by, or leave --similarity-model out"
            )
        return None
    path = args.similarity_model or default_similarity_model()
    logger.info("loading %s (sentence embedder) on %s", path, model.device)
    try:
        return SentenceSimilarity.from_pretrained(path, device=model.device)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--similarity-model {path}: cannot load it: {reason}") from err


def run_paraphrase(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from cdnpg.inference import load_model

    model, tokenizer = load_model(args.model, args.device, args.trust_remote_code)
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    similarity = load_similarity(args, model)
    from cdnpg.ranking import parse_ranking

    rank_by = parse_ranking(args.rank_by) if args.rank_by is not None else None

    total = None
    if args.text:
        batches = _batched(args.text, args.batch_size)
    elif args.input is not None:
        lines = Path(args.input).read_text(encoding="utf-8").splitlines()
        total = len(lines)
        batches = _batched(lines, args.batch_size)
    else:
        batches = _stdin_batches(args.batch_size)

    out: TextIO = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout  # noqa: SIM115
    progress = tqdm(total=total, unit="sentence", disable=None if total else True, file=sys.stderr)
    written, reported = 0, set()
    try:
        with (
            logging_redirect_tqdm(loggers=[logging.getLogger(name) for name in LOGGERS]),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")  # the model's warnings (e.g. "no z"), once each, as the command's
            for batch in batches:
                results = paraphrase(
                    paraphraser,
                    batch,
                    num_beams=args.num_beams,
                    num_return_sequences=args.num_return_sequences,
                    max_new_tokens=args.max_new_tokens,
                    novelty=args.novelty,
                    first_index=written + 1,
                    keep_details=args.keep_details,
                    rank_by=rank_by,
                    num_candidates=args.candidates,
                    similarity=similarity,
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
    """One output line: the candidates separated by tabs, each followed by its score to 3 decimals (with --novelty,
    --keep-details, --rank-by or --candidates); or JSON, with the scores to 4. Each rounds the score once: -4.00854,
    rounded to 4 decimals and then to 3, would print -4.008."""
    texts = [candidate["generated_text"] for candidate in candidates]
    scores = [candidate["score"] for candidate in candidates if "score" in candidate]
    if jsonl:
        rounded = {"scores": [round(score, 4) for score in scores]} if scores else {}
        return json.dumps({"source": source, "paraphrases": texts, **rounded}, ensure_ascii=False)
    if scores:
        return "\t".join(f"{text}\t{score:.3f}" for text, score in zip(texts, scores))
    return "\t".join(texts)


# ---------------------------------------------------------------------------------------------------------------------
# granularity
# ---------------------------------------------------------------------------------------------------------------------


def check_granularity(args: argparse.Namespace) -> str | None:
    from cdnpg.figures import FIGURE_SUFFIXES

    if not args.out and not args.show:
        return "nothing to do: give --out FILE (.png, .svg, .pdf or .html) and/or --show"
    for out in args.out:
        if Path(out).suffix.lower() not in FIGURE_SUFFIXES:
            allowed = ", ".join(FIGURE_SUFFIXES)
            return f"--out {out}: unsupported file type {Path(out).suffix or '(none)'!r}; use one of {allowed}"
    if not args.text.strip():
        return "the sentence is empty"
    return check_generation(args)


def _use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def run_granularity(args: argparse.Namespace) -> int:
    from cdnpg.figures import HTML_SUFFIXES, render, render_text
    from cdnpg.granularity import GranularityUnavailableError, word_details, word_granularities
    from cdnpg.inference import load_model

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
        details = word_details(model, tokenizer, args.text)  # what novelty and keep_details read, 1 = detail
    except GranularityUnavailableError as err:
        raise InputError(f"--model {args.model}: {err}") from err
    for out in args.out:  # the heat map is the paper's figure, of raw z; the page and the table show the detail first
        page = Path(out).suffix.lower() in HTML_SUFFIXES
        logger.info("wrote %s", render([details, *rows] if page else rows, out))
    if args.show:
        sys.stdout.write(render_text([details, *rows], color=_use_color()))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace) -> int:
    """Load the model, then serve its page (`cdnpg.demo`) until Ctrl-C: a model that does not load, or a missing
    gradio, is one line and exit code 1, and no page is started."""
    try:
        import gradio  # noqa: F401
    except ModuleNotFoundError as err:
        raise InputError(f"the demo needs gradio, which is not installed: {INSTALL_DEMO}") from err
    from cdnpg.demo import build_app, launch, load_demo

    demo = load_demo(args.model, args.device, args.trust_remote_code)
    app = build_app(demo)
    try:
        url = launch(app, port=args.port, share=args.share)
    except OSError as err:  # the port is taken, or cannot be bound: Gradio's advice is for its Python API
        where = f"--port {args.port}: it is taken, or cannot be bound on 127.0.0.1" if args.port else (
            f"no free port from {FIRST_PORT} to {FIRST_PORT + PORTS_TRIED - 1} on 127.0.0.1")  # fmt: skip
        raise InputError(f"{where}: choose another with --port N") from err
    print(url, flush=True)  # stdout: the address, for a user or a script to open
    logger.info("serving %s on %s; Ctrl-C stops it", args.model, url)
    try:
        app.block_thread()  # Gradio's own wait, as its blocking launch() does: until Ctrl-C
    finally:
        app.close()
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------------------
# convert
# ---------------------------------------------------------------------------------------------------------------------


def run_install_wordnet(args: argparse.Namespace) -> int:
    """WordNet 3.0 for METEOR from Debian's packages (`cdnpg.wordnet`), for installs without training/."""
    from cdnpg.wordnet import main as install_wordnet

    options = [
        *(["--target", args.target] if args.target else []),
        *(["--source", args.source] if args.source else []),
    ]
    return install_wordnet(options)


def run_refresh_code(args: argparse.Namespace) -> int:
    """Replace a checkpoint folder's model code with this package's (`cdnpg.hub.refresh_model_code`)."""
    from cdnpg.hub import TESTED_TRANSFORMERS, refresh_model_code

    try:
        changed = refresh_model_code(args.checkpoint)
    except (FileNotFoundError, ValueError) as error:
        raise InputError(str(error)) from None
    tested = " and ".join(TESTED_TRANSFORMERS)
    if changed:
        logger.info("%s: replaced %s (code tested on transformers %s)", args.checkpoint, ", ".join(changed), tested)
    else:
        logger.info("%s: its code is already this package's (tested on transformers %s)", args.checkpoint, tested)
    return 0


def check_convert(args: argparse.Namespace) -> str | None:
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


def run_convert(args: argparse.Namespace) -> int:
    from cdnpg.convert import convert
    from cdnpg.hub import checkpoint_name, save_checkpoint

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
    # new, not from the checkpoint: the granularity heads; from a BERT source (the one that gets BERT's prediction
    # head) also the decoder's cross-attention and that head
    from_bert = model.config.lm_head_transform
    new_parts = ("granularity_head", *(("encoder_attn", "lm_head_transform.", "lm_head.bias") if from_bert else ()))
    new = sum(p.numel() for name, p in model.named_parameters() if any(part in name for part in new_parts))
    logger.info(
        "wrote %s (%s parameters, %s of them new: %s)",
        args.output,
        f"{model.num_parameters():,}",
        f"{new:,}",
        "granularity heads, cross-attention, prediction head" if from_bert else "granularity heads",
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------------------
# augment
# ---------------------------------------------------------------------------------------------------------------------


def check_augment(args: argparse.Namespace) -> str | None:
    """The usage errors of `cdnpg augment`, before anything is loaded."""
    for option, value in (("--batch-size", args.batch_size), ("--chunk-size", args.chunk_size),
                          ("--max-rows", args.max_rows), ("--num-paraphrases", args.num_return_sequences)):  # fmt: skip
        if value is not None and value < 1:
            return f"{option} must be at least 1, got {value}"
    for option, value in (("--novelty", args.novelty), ("--keep-details", args.keep_details)):
        if value is not None and not 0 <= value <= 1:
            return f"{option} must be between 0 and 1, got {value}"
    if not args.novelty and args.num_beams is not None and args.num_return_sequences > args.num_beams:
        return (
            f"--num-paraphrases {args.num_return_sequences} cannot exceed --num-beams {args.num_beams} (beam search "
            "returns at most one sequence per beam; with --novelty above 0 it can)"
        )
    if args.rank_by is not None:
        from cdnpg.ranking import parse_ranking

        try:
            parse_ranking(args.rank_by)
        except ValueError as err:
            return f"--rank-by {args.rank_by}: {err}"
    return check_generation(args)


def run_augment(args: argparse.Namespace) -> int:
    """`cdnpg augment`: `cdnpg.augment.augment_to_folder` with the command's options, whose destinations are
    `AugmentSettings`' names."""
    from cdnpg.augment import AugmentSettings, augment_to_folder

    settings = AugmentSettings(**{setting.name: getattr(args, setting.name) for setting in fields(AugmentSettings)})
    augment_to_folder(
        args.data,
        args.model,
        args.column,
        args.output_dir,
        split=args.split,
        settings=settings,
        chunk_size=args.chunk_size,
        max_rows=args.max_rows,
        device=args.device,
        dtype=None if args.dtype == "float32" else args.dtype,
        trust_remote_code=args.trust_remote_code,
        argv=sys.argv[1:],
    )
    return EXIT_OK
