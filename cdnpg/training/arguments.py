"""The arguments of a training run: the model, the data and `Seq2SeqTrainingArguments` with the paper's recipe.

Architecture flags default to None, which means "CDNPGConfig's default" (the paper's model), so the paper's numbers
live in one place. The data source is inferred from the data flags; flags of two different sources are an error.
"""

import difflib
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from cdnpg.errors import InputError
from cdnpg.hub import resolve_model_source
from configuration_cdnpg import GRANULARITY_MASK_MODES, GRANULARITY_MASKS, CDNPGConfig

logger = logging.getLogger("cdnpg.training")
PAPER = CDNPGConfig()  # the defaults shown in --help
DATASETS = ("template", "files", "quora_raw", "twitter_url_raw", "hub")
# the models a run trains: C-DNPG, and the baselines of transformers' own that the quality benchmark compares it with
ARCHITECTURES = ("cdnpg", "bart", "bert2bert")
SOURCE_FLAGS = {  # the flags that belong to one data source: giving any of them selects it
    "template": ("template_sizes",),
    "files": ("train_file", "validation_file", "test_file"),
    "quora_raw": ("quora_file", "quora_sizes"),
    "twitter_url_raw": ("twitter_train_file", "twitter_test_files"),
    "hub": ("dataset_name",),
}
DATA_FLAGS = ("dataset", *(flag for flags in SOURCE_FLAGS.values() for flag in flags))  # what selects the data
REQUIRED_FLAGS = {
    "files": ("train_file",),
    "quora_raw": ("quora_file",),
    "twitter_url_raw": ("twitter_train_file", "twitter_test_files"),
    "hub": ("dataset_name",),
}
TEMPLATE_SIZES = (6000, 500, 500)  # train, validation, test pairs of the embedded template corpus
QUORA_SIZES = (100_000, 4_000, 20_000)  # train, validation, test duplicate pairs: the paper's split (Section 4.1)
# ModelArguments flag -> the CDNPGConfig fields it sets
ARCHITECTURE_FLAGS = {
    "granularity_mask": ("granularity_mask",),
    "granularity_mask_mode": ("granularity_mask_mode",),
    "cross_attention_granularity": ("cross_attention_granularity",),
    "scope_epsilon": ("scope_epsilon",),
    "d_model": ("d_model",),
    "layers": ("encoder_layers", "decoder_layers"),
    "attention_heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "ffn_dim": ("encoder_ffn_dim", "decoder_ffn_dim"),
    "dropout": ("dropout", "attention_dropout"),
    "copy_mechanism": ("copy_mechanism",),
}
# the flags of C-DNPG's own parts (the granularity heads, the copy gate), which no baseline has
CDNPG_ONLY_FLAGS = (
    "granularity_mask",
    "granularity_mask_mode",
    "cross_attention_granularity",
    "scope_epsilon",
    "copy_mechanism",
    "copy_common_tokens",
    "compile_granularity_masks",
)
WARM_START_FLAGS = (
    "granularity_mask",
    "granularity_mask_mode",
    "cross_attention_granularity",
    "scope_epsilon",
    "dropout",
    "copy_mechanism",
)


def architecture_fields(**flags: object) -> dict[str, object]:
    """The CDNPGConfig fields that architecture flags set, in ARCHITECTURE_FLAGS' order: `layers=2` sets
    encoder_layers and decoder_layers."""
    return {field: flags[name] for name, fields in ARCHITECTURE_FLAGS.items() if name in flags for field in fields}


class UsageError(ValueError):
    """A flag or input the user gave is wrong; `training/run.py` prints the message without a traceback."""


def option(default: object, help: str) -> Any:
    """A field that HfArgumentParser turns into the flag of its name, with this default and help."""
    return field(default=default, metadata={"help": help})


def _default(what: str, value: object) -> str:
    return f"{what}; None takes CDNPGConfig's default, the paper's ({value})."


@dataclass
class ModelArguments:
    """The C-DNPG architecture (None: CDNPGConfig's default, the paper's) or an existing checkpoint to fine-tune; or
    a baseline of transformers' own (`architecture`), trained on the same data with the same recipe and scoring."""

    architecture: str = option(
        "cdnpg",
        f"The model to train, one of {ARCHITECTURES}: 'cdnpg' (C-DNPG, as the flags below say); the "
        "baselines 'bart' (transformers' BART, new, sized by --d_model --layers --attention_heads --ffn_dim "
        "--dropout as C-DNPG would be) and 'bert2bert' (transformers' EncoderDecoderModel from --init_from, a "
        "BERT-family checkpoint, as encoder and decoder).",
    )
    model_name_or_path: str | None = option(None, "Fine-tune this C-DNPG checkpoint instead of training a new model.")
    init_from: str | None = option(
        None,
        "Warm start from a BART or BERT-family checkpoint (folder or Hub id), converted on the fly as "
        "`cdnpg convert` does; the GA flags and --dropout apply, its tokenizer is used (docs/warm_start.md).",
    )
    granularity_mask: str | None = option(
        None, _default(f"Eq. 9 mask, one of {GRANULARITY_MASKS} ('none' = Transformer)", PAPER.granularity_mask)
    )
    granularity_mask_mode: str | None = option(
        None, _default(f"How the mask adjusts attention, one of {GRANULARITY_MASK_MODES}", PAPER.granularity_mask_mode)
    )
    cross_attention_granularity: bool | None = option(
        None, _default("Resonance mask in cross-attention, as in the released code", PAPER.cross_attention_granularity)
    )
    scope_epsilon: float | None = option(
        None, _default("The window epsilon of the scope mask (eq. 8)", PAPER.scope_epsilon)
    )
    d_model: int | None = option(None, _default("Hidden size", PAPER.d_model))
    layers: int | None = option(None, _default("Encoder and decoder layers each", PAPER.encoder_layers))
    attention_heads: int | None = option(None, _default("Attention heads", PAPER.encoder_attention_heads))
    ffn_dim: int | None = option(None, _default("Feed-forward inner size", PAPER.encoder_ffn_dim))
    dropout: float | None = option(None, _default("Dropout on residual branches and attention", PAPER.dropout))
    copy_mechanism: str | None = option(
        None,
        "Copy source tokens: 'learned' (the paper's Transformer+Copy gate) or 'granularity' (copy what z "
        "marks as detail; needs granularity heads); None: no copying (CDNPGConfig.copy_mechanism).",
    )
    compile_granularity_masks: bool | None = option(
        None,
        "Build the granularity masks (and the copy's mixture) with torch.compile, the model staying "
        "eager: about one kernel each way per attention module instead of ~27, for GPUs, where the launches set "
        "the step time (docs/speed.md); for any model source, saved in its config. None: the config's (unset: compiled on CUDA, eager elsewhere).",
    )
    copy_common_tokens: int | None = option(
        None,
        "Never copy the N most frequent tokens of the tokenized training pairs (the template's words "
        "and the special tokens): they are generated, the pointer is left to the details "
        "(CDNPGConfig.copy_excluded_token_ids). Needs --copy_mechanism; None: any source token is copied.",
    )
    tokenizer_name: str | None = option(
        None, "A tokenizer folder or cached name (e.g. bert-base-uncased files); default: train one."
    )
    vocab_size: int = option(8000, "Size of the WordPiece vocabulary trained by default.")

    def __post_init__(self):
        self.check_architecture()
        given = [f"--{name}" for name in ARCHITECTURE_FLAGS if getattr(self, name) is not None]
        if self.model_name_or_path and self.init_from:
            raise UsageError(
                "--model_name_or_path fine-tunes a C-DNPG checkpoint, --init_from converts another: give one"
            )
        if self.model_name_or_path and given:
            raise UsageError(
                f"{', '.join(given)} set the architecture of a new model, but --model_name_or_path "
                f"{self.model_name_or_path} keeps its own: give one or the other"
            )
        if self.copy_common_tokens is not None and (self.copy_mechanism is None or self.copy_common_tokens < 1):
            raise UsageError(
                f"--copy_common_tokens {self.copy_common_tokens} limits what the copy mechanism points at: it needs "
                f"--copy_mechanism (given: {self.copy_mechanism}) and a number of tokens >= 1"
            )
        sizes = [flag for flag in given if flag.removeprefix("--") not in WARM_START_FLAGS]
        if self.init_from and sizes:
            raise UsageError(f"{', '.join(sizes)}: --init_from {self.init_from} brings its own sizes")
        for name in ("model_name_or_path", "init_from"):  # at once, not after the data is loaded or the Hub retried
            if getattr(self, name):
                try:
                    setattr(self, name, resolve_model_source(getattr(self, name)))
                except InputError as error:
                    raise UsageError(f"--{name} {error}") from error
        CDNPGConfig(**self.config_overrides())  # fail now, naming the field, rather than after loading the data

    def check_architecture(self) -> None:
        """`architecture` is one of `ARCHITECTURES`, and a baseline is given only the flags it has: no C-DNPG
        checkpoint or C-DNPG part; BART is new (sized by the size flags), bert2bert is built from --init_from."""
        name = self.architecture
        if name not in ARCHITECTURES:
            raise UsageError(f"--architecture must be one of {', '.join(ARCHITECTURES)}, got {name!r}")
        if name == "cdnpg":
            return
        cdnpg_only = [
            f"--{flag}" for flag in ("model_name_or_path", *CDNPG_ONLY_FLAGS) if getattr(self, flag) is not None
        ]
        if cdnpg_only:
            raise UsageError(
                f"{', '.join(cdnpg_only)}: of C-DNPG (--architecture cdnpg), not of --architecture {name}"
            )
        if name == "bart" and self.init_from:
            raise UsageError(
                f"--architecture bart trains a new BART, sized by the size flags; --init_from {self.init_from} "
                "warm-starts a C-DNPG (--architecture cdnpg)"
            )
        if name == "bert2bert" and not self.init_from:
            raise UsageError("--architecture bert2bert needs --init_from, a BERT-family checkpoint")
        if name == "bert2bert" and self.dropout is not None:
            raise UsageError("--dropout: --architecture bert2bert keeps the dropout of --init_from's checkpoint")

    def config_overrides(self) -> dict[str, object]:
        """The CDNPGConfig fields the flags set; the others keep the config's defaults."""
        given = {name: getattr(self, name) for name in ARCHITECTURE_FLAGS}
        return architecture_fields(**{name: value for name, value in given.items() if value is not None})


@dataclass
class DataArguments:
    """Where the paraphrase pairs come from and how they are cut."""

    dataset: str | None = option(
        None,
        f"One of {DATASETS}; None infers it from the data flags (--train_file: files, --quora_file: "
        "quora_raw, --twitter_train_file: twitter_url_raw, --dataset_name: hub, none of them: template).",
    )
    train_file: str | None = option(None, "dataset=files: JSONL/CSV/TSV training pairs.")
    validation_file: str | None = option(None, "dataset=files: validation pairs.")
    test_file: str | None = option(None, "dataset=files: test pairs.")
    source_column: str = option("source", "Column holding the input sentence.")
    target_column: str = option("target", "Column holding the paraphrase.")
    quora_file: str | None = option(
        None,
        "dataset=quora_raw: Quora's quora_duplicate_questions.tsv (or Kaggle's train.csv), split as the "
        "paper did: duplicates only, lowercased and BERT-tokenized, shuffled with --data_seed_split.",
    )
    quora_sizes: list[int] | None = option(
        None,
        "dataset=quora_raw: train, valid, test pairs; None takes the paper's "
        f"{' '.join(map(str, QUORA_SIZES))}. The test pairs are cut first, so they stay the same for any train size.",
    )
    twitter_train_file: str | None = option(None, "dataset=twitter_url_raw: auto pairs.")
    twitter_test_files: list[str] | None = option(None, "dataset=twitter_url_raw: the human-labelled files.")
    dataset_name: str | None = option(None, "dataset=hub: a datasets.load_dataset name.")
    template_sizes: list[int] | None = option(
        None, f"dataset=template: train, valid, test sizes; None takes {' '.join(map(str, TEMPLATE_SIZES))}."
    )
    data_seed_split: int = option(0, "Seed of corpus generation and shuffled splits.")
    max_source_length: int = option(20, "Truncate sources to this many tokens (paper: 20).")
    max_target_length: int = option(20, "Truncate targets to this many tokens (paper: 20).")
    max_train_samples: int | None = option(None, "Keep only this many training pairs.")
    both_directions: bool = option(
        False,
        "Also train on every training pair reversed (target -> source), after --max_train_samples: for "
        "symmetric paraphrase data such as Quora's duplicate questions, twice the pairs for free.",
    )
    drop_near_copies: float | None = option(
        None,
        "Leave out the training pairs whose target repeats its source this much or more: sacreBLEU's "
        "sentence BLEU of target against source, 0 to 100 (cdnpg.data.near_copy_bleu), before --both_directions. "
        "Near-copies teach a copy mechanism that copying the whole source is likely.",
    )
    max_eval_samples: int | None = option(None, "Keep only this many validation pairs.")
    max_predict_samples: int | None = option(None, "Keep only this many test pairs.")
    early_stopping_patience: int | None = option(
        None, "Stop after this many evaluations without a better validation loss."
    )

    def __post_init__(self):
        given = {}  # data source -> the flags of it that were given
        for source, flags in SOURCE_FLAGS.items():
            if named := [flag for flag in flags if getattr(self, flag) is not None]:
                given[source] = named
        if self.dataset is None:
            if len(given) > 1:
                (first, a), (second, b) = list(given.items())[:2]
                raise UsageError(
                    f"--{a[0]} (dataset {first}) and --{b[0]} (dataset {second}) select different data: give one"
                )
            self.dataset = next(iter(given), "template")
            selected_by = f"--{given[self.dataset][0]} selects --dataset {self.dataset}, which" if given else ""
        else:
            if self.dataset not in DATASETS:
                raise UsageError(f"--dataset must be one of {DATASETS}, got {self.dataset!r}")
            for source, flags in given.items():
                if source != self.dataset:
                    raise UsageError(
                        f"--dataset {self.dataset} contradicts --{flags[0]}, which belongs to --dataset {source}: "
                        f"give --dataset {source}, or leave --dataset out (the data flags select their source)"
                    )
            selected_by = f"--dataset {self.dataset}"
        for name in REQUIRED_FLAGS.get(self.dataset, ()):
            if not getattr(self, name):
                raise UsageError(f"{selected_by} needs --{name}")
        if self.drop_near_copies is not None and not 0 < self.drop_near_copies <= 100:
            raise UsageError(f"--drop_near_copies takes a BLEU in (0, 100], got {self.drop_near_copies}")
        for name in ("template_sizes", "quora_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and (len(sizes) != 3 or min(sizes) < 1):
                raise UsageError(
                    f"--{name} takes three numbers above 0 (train valid test), got {' '.join(map(str, sizes))}"
                )


@dataclass
class CDNPGTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's recipe (Section 4.2) as defaults."""

    output_dir: str = option("runs/cdnpg", "Checkpoint, predictions and metrics go here.")
    num_train_epochs: float = option(30, "Paper: 30 epochs (--max_steps overrides it).")
    learning_rate: float = option(5e-5, "AdamW learning rate (paper: 5e-5).")
    lr_scheduler_type: str = option("linear", "Paper: linear decay after warm-up.")
    warmup_steps: float = option(5000, "Linear warm-up steps (paper: 5,000).")
    per_device_train_batch_size: int = option(32, "Paper: 32.")
    per_device_eval_batch_size: int = option(64, "Batch size of evaluation/generation.")
    eval_strategy: str = option("epoch", "When to compute the validation loss.")
    save_strategy: str = option("epoch", "Must match eval_strategy for model selection.")
    save_total_limit: int | None = option(2, "Keep the best and the last checkpoints.")
    load_best_model_at_end: bool = option(True, "Paper: selection by validation loss.")
    metric_for_best_model: str | None = option("loss", "Select by validation loss.")
    predict_with_generate: bool = option(True, "Generate on the test split.")
    generation_num_beams: int | None = option(8, "Beam size (paper: 8).")
    generation_novelty: float | None = option(
        None,
        "The checkpoint's default `novelty` (0 to 1; None: plain beam search), kept in its generation_config: "
        "the pipeline and `cdnpg paraphrase` use it when given no decoding arguments, and so does the test split.",
    )
    generation_keep_details: float | None = option(
        None, "As --generation_novelty, for `keep_details` (0 to 1): the input's details pulled back in."
    )
    logging_steps: float = option(50, "Log the training loss this often.")
    use_cache: bool = option(True, "Kept in the saved config: generation uses the cache; the loss never does.")
    granularity_learning_rate: float | None = option(
        None,
        "Peak learning rate of the granularity heads (W_G of eq. 4), on the same schedule; default: "
        "learning_rate. A warm start adds them, new, to pretrained weights fine-tuned at a small rate, at which z "
        "barely leaves the 0.5 it starts from (docs/benchmarks.md, warm start at the recipe's budget).",
    )
    overwrite_output_dir: bool = option(
        False,
        "Replace an earlier run in output_dir: every file of it is removed when training starts (a run "
        "that fails before keeps it). Without it a non-empty output_dir is refused, unless "
        "--resume_from_checkpoint continues the run there.",
    )

    def __post_init__(self):
        if self.max_steps <= 0 and self.max_steps != -1:  # transformers would train --num_train_epochs instead
            raise ValueError(
                f"--max_steps must be a number of steps above 0, or -1 (the default) to train --num_train_epochs "
                f"epochs; got {self.max_steps}"
            )
        for name in ("generation_novelty", "generation_keep_details"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"--{name} must be between 0 and 1, got {value}")
        super().__post_init__()


def configure_logging() -> None:
    """The run's log format on stderr, set before the flags are parsed: parsing logs what it infers from them."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logger.setLevel(logging.INFO)


class ArgumentParser(HfArgumentParser):
    """`HfArgumentParser` that takes a flag only by its full name and reports a wrong one as a `UsageError`.

    argparse completes a prefix by default (`allow_abbrev`), which reads `max_step: 10` in a recipe as `max_steps`:
    a typo that is a prefix of a flag would become that setting without a word."""

    def __init__(self, dataclass_types: Sequence[type]):
        super().__init__(dataclass_types, allow_abbrev=False)
        self.names = [f.name for dtype in dataclass_types for f in fields(dtype) if f.init]

    def error(self, message: str) -> None:  # argparse's hook: it would print the whole usage and exit
        raise UsageError(message)

    def nearest(self, name: str) -> str | None:
        """The real flag closest to a wrong one (difflib's ratio), if any is close."""
        return next(iter(difflib.get_close_matches(name.lstrip("-").replace("-", "_"), self.names, n=1)), None)

    def check_known(self, argv: list[str], source: str | None = None) -> None:
        """Refuse a flag (or, from an argument file, a key) that is not exactly one of the parser's, naming the
        nearest real one."""
        _, unknown = self.parse_known_args(argv)
        for token in unknown:
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                nearest = self.nearest(name)
                what = f"unknown key {name.lstrip('-')!r} in {source}" if source else f"unknown flag {name}"
                hint = (f"did you mean {nearest!r}?" if source else f"did you mean --{nearest}?") if nearest else ""
                raise UsageError(f"{what}; {hint or 'python training/run.py --help lists every flag'}")
        if unknown:
            raise UsageError(f"unexpected value {unknown[0]!r}{f' in {source}' if source else ''}: give it to a flag")


def flag_names(argv: Sequence[str]) -> list[str]:
    """The flags of `argv`, without their dashes and values: `--max_steps 5 --do_train` gives max_steps, do_train."""
    return [token[2:].split("=", 1)[0] for token in argv if token.startswith("--")]


def without_flags(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """`argv` less the flags `names`, with their values."""
    kept, dropping = [], False
    for token in argv:
        if token.startswith("--"):
            dropping = token[2:].split("=", 1)[0] in names
        if not dropping:
            kept.append(token)
    return kept


def file_arguments(path: Path) -> list[str]:
    """The flags a JSON / YAML argument file stands for, in its order: `key: value` is `--key value`."""
    if not path.is_file():
        raise UsageError(f"argument file {path} does not exist")
    values = yaml.safe_load(path.read_text()) if path.suffix != ".json" else json.loads(path.read_text())
    if values is not None and not isinstance(values, dict):
        raise UsageError(f"argument file {path}: expected `flag: value` lines, got a {type(values).__name__}")
    argv = []
    for key, value in (values or {}).items():
        argv += [f"--{key}", *map(str, value if isinstance(value, list) else [value])]
    return argv


def no_accelerator() -> bool:
    """No GPU (or other accelerator) that transformers would train on here."""
    import torch
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return not (torch.cuda.is_available() or is_torch_bf16_gpu_available() or is_torch_xla_available())


def parse_args(
    argv: list[str] | None = None,
) -> tuple[ModelArguments, DataArguments, CDNPGTrainingArguments]:
    """Flags, or a JSON / YAML file given first whose values act as flags placed before the others (which override
    them). A data flag on the command line (`DATA_FLAGS`) replaces the file's data selection as a whole: the file's
    `dataset` and data flags are dropped, so `template_cpu.yaml --train_file my.jsonl` trains on my.jsonl. A wrong
    value, or a flag or key that is not exactly one of the flags, raises `UsageError` naming it.

    Three settings are read as a user means them rather than as TrainingArguments would: `--do_eval false` evaluates
    nowhere (TrainingArguments turns do_eval back on whenever eval_strategy is not "no", the recipe's default),
    `--bf16` on a machine without a GPU trains on the CPU (TrainingArguments asks for `--use_cpu true` there), and a
    machine without a GPU pins no memory unless --dataloader_pin_memory says so (torch warns that pinning needs one;
    TrainingArguments turns it off for --use_cpu only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser((ModelArguments, DataArguments, CDNPGTrainingArguments))
    from_file = []
    if argv and argv[0].endswith((".json", ".yaml", ".yml")):
        path = Path(argv.pop(0))
        from_file = file_arguments(path)
        parser.check_known(from_file, source=str(path))
    parser.check_known(argv)
    named = [name for name in flag_names(argv) if name in DATA_FLAGS]
    if named and (replaced := [name for name in flag_names(from_file) if name in DATA_FLAGS]):
        logger.info("--%s replaces the data of %s (%s)", named[0], path, ", ".join(replaced))
        from_file = without_flags(from_file, DATA_FLAGS)
    argv = from_file + argv
    parser.set_defaults(do_eval=None, dataloader_pin_memory=None)  # tells a setting given from one left out
    given, _ = parser.parse_known_args(argv)
    parser.set_defaults(do_eval=False, dataloader_pin_memory=True)
    if given.do_eval is False:
        if given.early_stopping_patience:
            raise UsageError("--early_stopping_patience stops on the validation loss, which --do_eval false skips")
        logger.info("--do_eval false: no evaluation during or after training; the model of the last step is kept")
        argv += ["--eval_strategy", "no", "--load_best_model_at_end", "false"]
    if given.bf16 and not given.use_cpu and no_accelerator():
        logger.info("--bf16 without a GPU: training on the CPU (--use_cpu true)")
        argv += ["--use_cpu", "true"]
    if given.dataloader_pin_memory is None and no_accelerator():
        argv += ["--dataloader_pin_memory", "false"]  # pinned memory only speeds up copies to a GPU
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except UsageError:
        raise
    except ValueError as error:  # raised by a dataclass's checks (TrainingArguments', CDNPGConfig's), on one line
        raise UsageError(" ".join(line.strip() for line in str(error).splitlines() if line.strip())) from error


def check_stages(model_args: ModelArguments, training_args: CDNPGTrainingArguments) -> None:
    """A run trains, or evaluates a model that exists: never an untrained one, saved as if it were a result.

    As in transformers' example scripts (run_translation.py), the stages are flags: --do_train, --do_eval,
    --do_predict. TrainingArguments turns `do_eval` on by itself whenever `eval_strategy` is not "no" (the default
    here), so a run given no stage flag at all would evaluate and save a freshly initialised model and exit 0.
    """
    if not training_args.do_train and not (model_args.model_name_or_path or model_args.init_from):
        raise UsageError(
            "no --do_train: this run would evaluate and save an untrained model. As in transformers' example "
            "scripts, the stages are flags: add --do_train (and --do_eval --do_predict to evaluate and score it, as "
            "training/configs/paper.yaml does), or give --model_name_or_path to evaluate a trained model"
        )


def check_data_file(flag: str, path: str) -> None:
    """`path`, given to `flag`, is a file: a folder is named as one (with a data file in it, if it holds one, as an
    example of what to give), anything else as missing."""
    folder = Path(path)
    if folder.is_file():
        return
    if folder.is_dir():
        inside = sorted(entry for entry in folder.iterdir() if entry.suffix in (".tsv", ".csv", ".jsonl"))
        example = f", e.g. {flag} {inside[0]}" if inside else ""
        raise UsageError(f"{flag} {path}: is a folder, not a file: give the data file in it{example}")
    raise UsageError(f"{flag} {path}: no such file")


def check_arguments(
    model_args: ModelArguments, data_args: DataArguments, training_args: CDNPGTrainingArguments
) -> None:
    """What the flags must agree on before any data is read: the stages (`check_stages`), the data files exist and,
    for pair files, the split each stage reads is given: an evaluating run needs a validation file (the Trainer
    would stop at its first evaluation, after the data and tokenizer work), --do_predict a test file."""
    check_stages(model_args, training_args)
    for flag in ("train_file", "validation_file", "test_file", "quora_file", "twitter_train_file"):
        if getattr(data_args, flag):
            check_data_file(f"--{flag}", getattr(data_args, flag))
    for path in data_args.twitter_test_files or ():
        check_data_file("--twitter_test_files", path)
    if data_args.dataset != "files":
        return
    if training_args.do_eval and not data_args.validation_file:
        strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
        raise UsageError(
            f"no --validation_file: this run evaluates (do_eval, eval_strategy {strategy}; the model is selected by "
            "validation loss). Give --validation_file, or --do_eval false to train without evaluation"
        )
    if training_args.do_predict and not data_args.test_file:
        raise UsageError("--do_predict needs --test_file: the test pairs to generate for and score")


__all__ = [
    "ARCHITECTURES",
    "DATASETS",
    "CDNPGTrainingArguments",
    "DataArguments",
    "ModelArguments",
    "UsageError",
    "check_arguments",
    "check_stages",
    "parse_args",
]
