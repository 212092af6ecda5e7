"""What `training/run.py` does, as functions the benchmarks reuse: data and tokenizer, model, `Seq2SeqTrainer`, then
train, save, evaluate, generate and score, in that order, so that the weights are on disk before anything that
could fail after training (evaluation, scoring, the model card, the push) runs."""

import copy
import functools
import json
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import datasets
import evaluate
import torch
import transformers
from accelerate import PartialState
from accelerate.utils import DistributedType
from transformers import (
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    TrainerCallback,
    set_seed,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cdnpg.convert import convert
from cdnpg.data import (
    MissingColumnError,
    both_directions,
    load_pair_files,
    load_tokenizer,
    make_tokenizer_config_portable,
    model_token_ids,
    prepare_quora,
    prepare_twitter_url,
    template_corpus,
    train_wordpiece_tokenizer,
)
from cdnpg.hub import checkpoint_name, render_model_card
from cdnpg.training.arguments import (
    TEMPLATE_SIZES,
    CDNPGTrainingArguments,
    DataArguments,
    ModelArguments,
    UsageError,
    check_stages,
    parse_args,
)
from configuration_cdnpg import CDNPGConfig
from modeling_cdnpg import CDNPGForConditionalGeneration
from modeling_cdnpg.generation_cdnpg import calibrate_granularity

logger = logging.getLogger("cdnpg.training")
METRICS_SCRIPT = Path(__file__).with_name("paraphrase_metrics.py")  # an `evaluate` module, shipped in the package
# What a run writes to output_dir. Any of the first marks a folder as an earlier run's, which --overwrite_output_dir
# may remove; the results are what a resumed run replaces, so none of them outlives the run that wrote it.
RUN_FILES = ("config.json", "trainer_state.json", "training_args.bin", "tokenizer", "all_results.json")
RESULT_FILES = (
    "predictions.jsonl", "all_results.json", "train_results.json", "eval_results.json", "test_results.json", "README.md"
)  # fmt: skip
CALIBRATION_TEXTS = 2000  # training sources that calibrate_granularity reads (word frequencies and z): seconds


class PostTrainingError(RuntimeError):
    """A step after the model was saved failed: the message says which, and where the model is."""


def last_complete_checkpoint(folder: Path) -> str | None:
    """The newest checkpoint the Trainer finished writing (its trainer_state.json comes last): Ctrl-C during a save
    leaves a newer folder without it, which cannot be resumed."""
    steps = [
        (int(path.name.removeprefix(PREFIX_CHECKPOINT_DIR + "-")), path)
        for path in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if path.name.removeprefix(PREFIX_CHECKPOINT_DIR + "-").isdigit() and (path / TRAINER_STATE_NAME).is_file()
    ]
    return str(max(steps)[1]) if steps else None


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the message names the last checkpoint and how to resume from it."""

    def __init__(self, output_dir: str, argv: Sequence[str]):
        folder = Path(output_dir)
        last = last_complete_checkpoint(folder)
        if last is None:
            message = f"interrupted before the first checkpoint in {folder}: nothing to resume, run again"
        else:
            given = list(argv)
            if "--resume_from_checkpoint" in given:  # the flag and its value make way for the new checkpoint
                at = given.index("--resume_from_checkpoint")
                del given[at : at + 2]
            given = [arg for arg in given if not arg.startswith("--resume_from_checkpoint=")]
            launcher = "<the same launch command>" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "python"
            command = shlex.join([sys.argv[0], *given, "--resume_from_checkpoint", last])
            message = f"interrupted; the last checkpoint is {last}. Resume with: {launcher} {command}"
        super().__init__(message)


@contextmanager
def model_kept_on_failure(output_dir: str | os.PathLike, step: str) -> Iterator[None]:
    """Run a step that comes after the model was saved; its failure becomes a `PostTrainingError` saying so."""
    try:
        yield
    except Exception as error:
        logger.exception("%s failed", step)
        raise PostTrainingError(
            f"{step} failed ({type(error).__name__}: {error}); the trained model is saved in {output_dir}"
        ) from error


# ---------------------------------------------------------------------------------------------------------------------
# The run's folder
# ---------------------------------------------------------------------------------------------------------------------


def check_distributed_launch(args: CDNPGTrainingArguments) -> None:
    """Processes that a launcher started together must train together. accelerate turns FSDP and multi-GPU configs
    into unconnected single processes where there is no GPU: each would train the whole model on all the data and
    write the same files as the others."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and args.world_size == 1:
        raise UsageError(
            f"{launched} processes were launched but run as {launched} separate single-process runs writing to the "
            "same output_dir. Without GPUs accelerate runs only DDP on CPUs: launch with "
            "--config_file training/configs/accelerate/ddp.yaml (or --multi_gpu --use_cpu true); FSDP needs GPUs"
        )


def distributed_strategy(accelerator) -> str:
    """How accelerate set up this run's processes, as the log and the model card name it."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "DeepSpeed"
    return "DDP" if accelerator.num_processes > 1 else "one process"


def requested_strategy() -> str | None:
    """What the accelerate config asked for, as `accelerate launch` tells the processes it starts."""
    for variable, strategy in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() == "true":
            return strategy
    return None


def report_strategy(trainer: Seq2SeqTrainer) -> None:
    """Say which strategy trains, and warn when the config asked for another: accelerate 1.15 sets FSDP up on GPUs
    only, and trains an FSDP config with --use_cpu true as plain DDP without a word."""
    accelerator = trainer.accelerator
    ran, asked = distributed_strategy(accelerator), requested_strategy()
    processes = accelerator.num_processes
    logger.info("Distributed strategy: %s (%d process%s)", ran, processes, "es" if processes > 1 else "")
    if asked and not ran.startswith(asked) and trainer.is_world_process_zero():
        logger.warning(
            "The accelerate config asks for %s, but these %d processes train as %s%s",
            asked,
            processes,
            ran,
            " (a full copy of the model in each, nothing sharded): accelerate sets up FSDP on GPUs only"
            if accelerator.device.type == "cpu"
            else "",
        )


# Measured (issue 28): minilm_quora.yaml on an AVX2-only AMD EPYC, 38.7 s per step with --bf16, 2.6 s without
BF16_EMULATION_COST = "about 15x slower than without (38.7 s against 2.6 s per step of minilm_quora.yaml)"


def native_bfloat16_cpu(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bfloat16 natively: the AVX512-BF16 or AMX instructions (x86), or Arm's bf16, as the
    kernel lists its flags in /proc/cpuinfo (or the `cpuinfo` text given). None where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) if flags else None


def check_bf16_on_cpu(args: CDNPGTrainingArguments, cpuinfo: str | None = None) -> None:
    """One line before training when --bf16 runs on a CPU that emulates bfloat16: it trains, but many times slower."""
    if args.bf16 and args.device.type == "cpu" and native_bfloat16_cpu(cpuinfo) is False:
        logger.warning(
            "--bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX): torch emulates it, %s. Drop --bf16 "
            "(or bf16: true in the recipe) to train in fp32 at full speed.",
            BF16_EMULATION_COST,
        )


def check_resumable(checkpoint: str) -> None:
    """A checkpoint resumes a run only with the optimizer and schedule state beside the weights; without them the
    Trainer would silently restart warm-up and AdamW's moments from zero."""
    path = Path(checkpoint)
    if not path.is_dir():
        raise UsageError(f"--resume_from_checkpoint {checkpoint}: no such checkpoint folder")
    if not (path / "trainer_state.json").is_file():
        raise UsageError(f"--resume_from_checkpoint {checkpoint}: not a Trainer checkpoint (no trainer_state.json)")
    if not any(path.glob("optimizer*")) or not any(path.glob("scheduler*")):
        raise UsageError(
            f"--resume_from_checkpoint {checkpoint}: the checkpoint holds the model but not the optimizer and "
            "learning-rate schedule (saved with save_only_model), so resuming would restart warm-up and AdamW from "
            f"zero. Start a new run from its weights with --model_name_or_path {checkpoint}, or save checkpoints "
            "with --save_only_model false"
        )


def prepare_output_dir(args: CDNPGTrainingArguments, inputs: Sequence[str | None] = ()) -> None:
    """transformers' convention: a non-empty output_dir is refused unless the run continues (--resume_from_checkpoint)
    or replaces (--overwrite_output_dir) the one there, so nothing of an earlier run is silently reused or mixed in.
    Replacing removes every file of the earlier run; resuming keeps its checkpoints and tokenizer and removes its
    results (predictions, metrics, card), which the resumed run writes anew."""
    if args.resume_from_checkpoint:
        check_resumable(args.resume_from_checkpoint)
    folder = Path(args.output_dir)
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if entries and not args.overwrite_output_dir and not args.resume_from_checkpoint:
        raise UsageError(
            f"--output_dir {folder} is not empty ({', '.join(path.name for path in entries[:4])}"
            f"{', ...' if len(entries) > 4 else ''}): give --overwrite_output_dir to replace the run there (its "
            "files are removed), --resume_from_checkpoint to continue it, or another --output_dir"
        )
    if entries and args.overwrite_output_dir and not args.resume_from_checkpoint:
        for given in filter(None, inputs):  # the model, tokenizer or data this run reads must survive the clean-up
            if Path(given).resolve().is_relative_to(folder.resolve()):
                raise UsageError(
                    f"--overwrite_output_dir would remove {given}, which this run reads: choose another --output_dir"
                )
    if entries and args.overwrite_output_dir and not any((folder / name).exists() for name in RUN_FILES):
        raise UsageError(
            f"--output_dir {folder} holds files but no training run (none of {', '.join(RUN_FILES)}); "
            "--overwrite_output_dir removes only an earlier run's folder: choose another --output_dir"
        )
    PartialState().wait_for_everyone()  # every process has looked before the main one changes anything
    if entries and args.process_index == 0:
        if args.overwrite_output_dir and not args.resume_from_checkpoint:
            logger.info("Removing the earlier run in %s (--overwrite_output_dir)", folder)
            doomed = entries
        else:
            doomed = [folder / name for name in RESULT_FILES if (folder / name).exists()]
        for path in doomed:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    PartialState().wait_for_everyone()


def share_tied_embedding_modules(model: torch.nn.Module) -> None:
    """Make the tied encoder and decoder embeddings the `shared` module itself (as transformers 4.57 ties them; 5.x
    ties the weight of three modules). FSDP2, as accelerate wraps a model, puts the input embedding and the LM head in
    one unit, and refuses a tied weight that another module also holds ("shared with a parameter already managed by
    another FSDP group")."""
    base = getattr(model, "model", None)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(base, "shared"):
        base.encoder.embed_tokens = base.decoder.embed_tokens = base.shared
        base.register_state_dict_post_hook(drop_shared_module_keys)
        base.register_load_state_dict_post_hook(accept_shared_module_keys_missing)


SHARED_MODULE_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # `shared` under two more names


def drop_shared_module_keys(module, state_dict, prefix, local_metadata) -> None:
    """The state dict names the shared embedding once (`shared.weight`), as `named_parameters` does. torch's FSDP
    checkpoint loading lists each parameter under the first module that holds it: a checkpoint that also held
    `encoder.embed_tokens.weight` failed to resume (KeyError in `set_model_state_dict`)."""
    for key in SHARED_MODULE_KEYS:
        state_dict.pop(prefix + key, None)


def accept_shared_module_keys_missing(module, incompatible_keys) -> None:
    """`load_state_dict` fills the shared embedding through `shared.weight`; its other names are not missing."""
    incompatible_keys.missing_keys[:] = [
        key for key in incompatible_keys.missing_keys if not key.endswith(SHARED_MODULE_KEYS)
    ]


@contextmanager
def saved_as_its_own_class(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2 gives a sharded model a class of torch's making (`FSDPCDNPGForConditionalGeneration`, defined in
    torch/distributed/fsdp); `save_pretrained` copies the code of the model's class into the checkpoint and names it
    in config.json's `auto_map`, so FSDP runs saved torch's private FSDP files and an auto_map that could not load.
    While saving, the model has its own class back."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_class = type(model)
    if not isinstance(model, FSDPModule):
        yield
        return
    model.__class__ = next(base for base in fsdp_class.__bases__ if not issubclass(base, FSDPModule))
    try:
        yield
    finally:
        model.__class__ = fsdp_class


def tied_names_aliased(state_dict: dict[str, torch.Tensor], model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A state dict gathered from FSDP shards holds a separate copy of each tied weight; transformers recognizes tied
    weights by their storage, and saved every copy. The tied names point at their source again, so that the
    checkpoint stores the embedding once, as a single process saves it."""
    tied = model.get_expanded_tied_weights_keys(all_submodels=True)  # {tied name: source name}
    return {name: state_dict.get(tied.get(name), tensor) for name, tensor in state_dict.items()}


@contextmanager
def fsdp_root_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Under FSDP2 the root module's own parameters (positions, embedding LayerNorms) are gathered by the hooks of its
    forward; `generate()` and the calibration call the encoder directly, past those hooks, and would meet shards.
    Each layer and the tied embedding are FSDP units of their own, gathered by their own hooks."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def load_pairs(args: DataArguments) -> datasets.DatasetDict:
    """Raw (source, target) splits named train / validation / test, from the source the arguments name."""
    if args.dataset == "template":
        train, valid, test = args.template_sizes or TEMPLATE_SIZES
        corpus = template_corpus(num_train=train, num_valid=valid, num_test=test, seed=args.data_seed_split)
    elif args.dataset == "files":
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        try:
            corpus, report = load_pair_files(
                {k: v for k, v in files.items() if v}, args.source_column, args.target_column
            )
        except MissingColumnError as error:
            raise UsageError(
                f"{error}: name the columns with --source_column and --target_column (now {args.source_column!r} "
                f"and {args.target_column!r})"
            ) from None
        logger.info("Read pair files: %s", report.to_dict())
    elif args.dataset == "quora_raw":
        corpus, report = prepare_quora(args.quora_file, seed=args.data_seed_split)
        logger.info("Prepared Quora: %s", report.to_dict())
    elif args.dataset == "twitter_url_raw":
        corpus, report = prepare_twitter_url(
            args.twitter_train_file, args.twitter_test_files, seed=args.data_seed_split
        )
        logger.info("Prepared Twitter URL: %s", report.to_dict())
    else:
        corpus = datasets.load_dataset(args.dataset_name)
        corpus = corpus.rename_columns({args.source_column: "source", args.target_column: "target"})
    corpus = datasets.DatasetDict({("validation" if k == "valid" else k): v for k, v in corpus.items()})
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples, "test": args.max_predict_samples}
    for split, limit in limits.items():
        if limit is not None and split in corpus:
            corpus[split] = corpus[split].select(range(min(limit, len(corpus[split]))))
    if args.both_directions and "train" in corpus:
        corpus["train"] = both_directions(corpus["train"])
    return corpus


def data_name(args: DataArguments) -> str:
    """The training data as the model card names it: the Hub dataset, the file (with its folder), or the template."""
    path = {"files": args.train_file, "quora_raw": args.quora_file, "twitter_url_raw": args.twitter_train_file}
    if args.dataset in path:
        resolved = Path(path[args.dataset]).resolve()
        return f"{resolved.parent.name}/{resolved.name}"
    return args.dataset_name if args.dataset == "hub" else args.dataset


def tokenize(corpus: datasets.DatasetDict, tokenizer, args: DataArguments) -> datasets.DatasetDict:
    """Sources as `[CLS] tokens [SEP]`; labels as `tokens [SEP]`, since the decoder starts from [CLS] itself."""

    def encode(batch):
        features = tokenizer(batch["source"], max_length=args.max_source_length, truncation=True)
        targets = tokenizer(batch["target"], max_length=args.max_target_length + 1, truncation=True)
        return {
            "input_ids": features["input_ids"],
            "attention_mask": features["attention_mask"],
            "labels": [ids[1:] for ids in targets["input_ids"]],
        }

    return corpus.map(encode, batched=True, remove_columns=corpus["train"].column_names, desc="Tokenizing")


def prepare_data(
    model_args: ModelArguments, data_args: DataArguments, training_args: CDNPGTrainingArguments
) -> tuple[datasets.DatasetDict, PreTrainedTokenizerBase, datasets.DatasetDict]:
    """Pairs, tokenizer and features; the main process first, the others reuse its cache and tokenizer.

    The tokenizer is `--tokenizer_name`'s, the fine-tuned checkpoint's, or WordPiece trained on the training split
    and kept in `output_dir/tokenizer`, so that a resumed run keeps its vocabulary.
    """
    with training_args.main_process_first(desc="data preparation"):
        corpus = load_pairs(data_args)
        logger.info("Splits: %s", {split: len(rows) for split, rows in corpus.items()})
        tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
        if model_args.tokenizer_name or model_args.model_name_or_path or model_args.init_from:
            tokenizer = load_tokenizer(
                model_args.tokenizer_name or model_args.model_name_or_path or model_args.init_from
            )
        elif training_args.process_index == 0 and not tokenizer_dir.is_dir():
            texts = [*corpus["train"]["source"], *corpus["train"]["target"]]
            tokenizer = train_wordpiece_tokenizer(texts, vocab_size=model_args.vocab_size)
            tokenizer.save_pretrained(tokenizer_dir)
        else:
            tokenizer = load_tokenizer(tokenizer_dir)
        features = tokenize(corpus, tokenizer, data_args)
    return corpus, tokenizer, features


# ---------------------------------------------------------------------------------------------------------------------
# Model and Trainer
# ---------------------------------------------------------------------------------------------------------------------


def build_config(args: ModelArguments, tokenizer: PreTrainedTokenizerBase) -> CDNPGConfig:
    """A new model's config: CDNPGConfig's defaults, the architecture flags given, and the tokenizer's vocabulary
    size and special ids ([CLS] starts decoding)."""
    return CDNPGConfig(**model_token_ids(tokenizer), **args.config_overrides())


def build_model(args: ModelArguments, tokenizer: PreTrainedTokenizerBase) -> CDNPGForConditionalGeneration:
    """The checkpoint to fine-tune, the pretrained one converted (warm start), or a new model."""
    if args.model_name_or_path:
        return CDNPGForConditionalGeneration.from_pretrained(args.model_name_or_path)
    if args.init_from:
        model, _ = convert(args.init_from, **args.config_overrides())
        return model.train()
    return CDNPGForConditionalGeneration(build_config(args, tokenizer))


def decoding_config(model: PreTrainedModel, num_beams: int, max_new_tokens: int) -> GenerationConfig:
    """The checkpoint's decoding defaults: the paper's beam search over at most `max_target_length` new tokens."""
    config = GenerationConfig.from_model_config(model.config)
    config.num_beams, config.max_new_tokens, config.use_cache = num_beams, max_new_tokens, True
    return config


class CDNPGTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` that saves tokenizers transformers 4.57 reads too, and whose model card (README.md, also the
    one `push_to_hub` uploads) is the project's C-DNPG card."""

    card: dict | None = None  # `render_model_card`'s keyword arguments, set by `write_model_card`

    def __init__(self, *args, **kwargs) -> None:
        model, training_args = kwargs.get("model"), kwargs.get("args")
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", None)  # None: not C-DNPG (bert2bert)
        if training_args is not None and training_args.ddp_find_unused_parameters is None and tied is not None:
            # DDP searches each step's graph for parameters without a gradient only where there are some (torch warns
            # at every step otherwise): the `shared` embedding of an untied model, which no forward reads
            training_args.ddp_find_unused_parameters = not tied
        super().__init__(*args, **kwargs)
        if self.is_fsdp_enabled:
            share_tied_embedding_modules(self.model)

    @property
    def gather_function(self):
        """`gather_for_metrics`, always. Seq2SeqTrainer's evaluate/predict switch to `gather`, which keeps the samples
        accelerate repeats to give every process a full last batch: 20 test pairs on 2 processes came back as 128
        predictions. `gather_for_metrics` drops them, so predictions and losses are those of a single process."""
        return functools.partial(
            self.accelerator.gather_for_metrics, use_gather_object=self.args.eval_use_gather_object
        )

    @gather_function.setter
    def gather_function(self, value) -> None:  # Trainer and Seq2SeqTrainer assign it; the property decides
        pass

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The Trainer's optimizer; with `granularity_learning_rate`, the granularity heads' parameters move to groups
        of their own at that rate (their weight decay kept), so the schedule scales them as it scales the rest."""
        # transformers 4.57's create_optimizer takes no argument
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        rate = getattr(self.args, "granularity_learning_rate", None)
        if rate is None:
            return optimizer
        heads = {id(p) for name, p in (model or self.model).named_parameters() if ".granularity_head." in name}
        for group in list(optimizer.param_groups):
            moved = [p for p in group["params"] if id(p) in heads]
            if moved:
                group["params"] = [p for p in group["params"] if id(p) not in heads]
                optimizer.add_param_group(
                    {**{k: v for k, v in group.items() if k != "params"}, "params": moved, "lr": rate}
                )
        return optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The Trainer's save; under FSDP as a single process saves: the model's own code and each weight once."""
        if state_dict is not None and self.is_fsdp_enabled:
            state_dict = tied_names_aliased(state_dict, self.accelerator.unwrap_model(self.model))
        with saved_as_its_own_class(self.model):
            super()._save(output_dir, state_dict=state_dict)

    @property
    def fsdp_saves_shards(self) -> bool:
        """FSDP with SHARDED_STATE_DICT: the Trainer's checkpoints hold FSDP's shards only, no model to load."""
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        return self.is_fsdp_enabled and "SHARDED_STATE_DICT" in str(plugin.state_dict_type)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save, with tokenizers that transformers 4.57 reads. With FSDP's SHARDED_STATE_DICT the
        Trainer saves no model at all (checkpoints keep the shards): the run's own model is gathered and saved whole,
        so that the output folder loads in one process."""
        if self.fsdp_saves_shards and not _internal_call:
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))
        else:
            super().save_model(output_dir, _internal_call=_internal_call)
        model_saved = not (self.fsdp_saves_shards and _internal_call)
        if self.args.should_save and self.processing_class is not None and model_saved:  # checkpoints come here too
            make_tokenizer_config_portable(output_dir or self.args.output_dir)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Seq2SeqTrainer's step, with the model's generation config as it was: transformers 5.24 writes
        GenerationConfig's defaults into it after each batch (`max_length` 20 among them), and beside the checkpoint's
        `max_new_tokens` generate() then warned at every later batch that both were set."""
        config = self.model.generation_config
        kept = copy.deepcopy(config)
        try:
            with fsdp_root_unsharded(self.model):
                return super().prediction_step(
                    model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
                )
        finally:
            self.model.generation_config = kept

    def _issue_warnings_after_load(self, load_result) -> None:
        """The Trainer's report of a resumed checkpoint, without the tied copies of the embedding (the encoder's and
        decoder's `embed_tokens` and `lm_head` are one tensor, stored once): only weights that are really missing."""
        parameters = dict(self.model.named_parameters(remove_duplicate=False))
        loaded = [parameters[name] for name in parameters if name not in load_result.missing_keys]
        missing = [
            name
            for name in load_result.missing_keys
            if not any(parameters.get(name) is parameter for parameter in loaded)
        ]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def write_model_card(self, **card) -> None:
        self.card = card
        self.create_model_card()

    def create_model_card(self, *args, **kwargs) -> None:
        if self.is_world_process_zero():
            # the name the card's code loads: the Hub repository when pushing, else the folder as the run named it
            pushed = self.args.push_to_hub and (self.args.hub_model_id or Path(self.args.output_dir).name)
            model_id = pushed or self.args.output_dir
            path = Path(self.args.output_dir) / "README.md"
            card = render_model_card(self.model, model_id, **(self.card or {}))
            path.with_suffix(".md.tmp").write_text(card, encoding="utf-8")
            os.replace(path.with_suffix(".md.tmp"), path)


def make_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    features: datasets.DatasetDict,
    args: CDNPGTrainingArguments,
    max_new_tokens: int,
    callbacks: Sequence[TrainerCallback] = (),
) -> CDNPGTrainer:
    """The Trainer of a run; the model decodes as the paper does (also in the checkpoints saved during training)."""
    model.generation_config = decoding_config(model, args.generation_num_beams, max_new_tokens)
    return CDNPGTrainer(
        model=model,
        args=args,
        train_dataset=features["train"] if args.do_train else None,
        eval_dataset=features.get("validation") if args.do_eval or args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        callbacks=list(callbacks),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Train, save, evaluate, predict, score
# ---------------------------------------------------------------------------------------------------------------------


def load_metric() -> evaluate.EvaluationModule:
    """The paper's metrics through `evaluate`, tried on one sentence: a missing WordNet fails now, not after
    training."""
    metric = evaluate.load(str(METRICS_SCRIPT))
    metric.compute(predictions=["a test"], references=["a test"], sources=["a test"])
    return metric


def predict(trainer: Seq2SeqTrainer, features: datasets.Dataset) -> tuple[list[str], dict[str, float]]:
    """Beam search on a tokenized split with the model's decoding defaults: the texts, and the Trainer's metrics."""
    output = trainer.predict(features, metric_key_prefix="test")
    ids = output.predictions
    ids[ids < 0] = trainer.processing_class.pad_token_id  # the padding between batches of different lengths
    return trainer.processing_class.batch_decode(ids, skip_special_tokens=True), output.metrics


def score(metric: evaluate.EvaluationModule, predictions: Sequence[str], pairs: datasets.Dataset) -> dict[str, float]:
    """The paper's metrics of the predictions against the pairs' targets and sources, as `test_*` keys."""
    scores = metric.compute(predictions=list(predictions), references=pairs["target"], sources=pairs["source"])
    return {f"test_{key}": float(value) for key, value in scores.items()}


def write_predictions(path: str | os.PathLike, pairs: datasets.Dataset, predictions: Sequence[str]) -> None:
    """One JSON line per pair: source, reference, prediction."""
    with Path(path).open("w", encoding="utf-8") as out:
        for source, reference, predicted in zip(pairs["source"], pairs["target"], predictions, strict=True):
            row = {"source": source, "reference": reference, "prediction": predicted}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def record(trainer: Seq2SeqTrainer, split: str, new: dict[str, float], metrics: dict[str, float]) -> None:
    """Log the metrics of a stage, write them to `<split>_results.json` and `all_results.json`, and collect them."""
    trainer.log_metrics(split, new)
    trainer.save_metrics(split, new)
    metrics.update(new)


def train_and_score(
    trainer: Seq2SeqTrainer,
    corpus: datasets.DatasetDict,
    features: datasets.DatasetDict,
    metric: evaluate.EvaluationModule | None,
    max_new_tokens: int,
) -> dict[str, float]:
    """Train (when `do_train`), save the model, evaluate on the validation split, generate and score the test split
    (when `do_predict`), writing `predictions.jsonl`. Returns every metric; a failure after the save raises
    `PostTrainingError`."""
    args, output_dir = trainer.args, trainer.args.output_dir
    metrics: dict[str, float] = {}
    if args.do_train:
        result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        trainer.save_state()
        record(trainer, "train", result.metrics, metrics)
    # Seq2SeqTrainer leaves every generation default in the config (max_length too): save only what was chosen
    trainer.model.generation_config = decoding_config(trainer.model, args.generation_num_beams, max_new_tokens)
    if args.do_train:
        calibrate(trainer.model, trainer.processing_class, corpus["train"]["source"][:CALIBRATION_TEXTS])
    trainer.save_model()
    if "validation" in features and (args.do_eval or args.do_train):
        with model_kept_on_failure(output_dir, "evaluation on the validation split"):
            record(trainer, "eval", trainer.evaluate(features["validation"], metric_key_prefix="eval"), metrics)
    if args.do_predict and "test" in features:
        with model_kept_on_failure(output_dir, "generation and scoring of the test split"):
            predictions, test_metrics = predict(trainer, features["test"])
            if trainer.is_world_process_zero():
                test_metrics.update(score(metric, predictions, corpus["test"]))
                write_predictions(Path(output_dir) / "predictions.jsonl", corpus["test"], predictions)
            record(trainer, "test", test_metrics, metrics)
    return metrics


def calibrate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> None:
    """Choose the encoder layer and orientation of z that novelty decoding reads (`calibrate_granularity`), from the
    training sources, so that the saved checkpoint is calibrated; a model without granularity heads has none."""
    if getattr(model.config, "granularity_mask", "none") == "none" or not texts:
        return
    was_training = model.training
    model.eval()  # z without dropout, as generation sees it
    with torch.no_grad(), fsdp_root_unsharded(model):
        choice = calibrate_granularity(model, tokenizer, list(texts))
    model.train(was_training)
    logger.info(
        "Calibrated z for novelty: encoder layer %s, %s",
        choice["novelty_z_layer"],
        "inverted" if choice["novelty_z_inverted"] else "as learned",
    )


def training_summary(
    trainer: Seq2SeqTrainer, data: str, corpus: datasets.DatasetDict, metrics: dict[str, float]
) -> str:
    """The model card's account of the data, the recipe and which model was kept."""
    args, state = trainer.args, trainer.state
    splits = ", ".join(f"{len(rows):,} {split}" for split, rows in corpus.items())
    if args.load_best_model_at_end and state.best_metric is not None:
        selection = f"the checkpoint with the best validation {args.metric_for_best_model} ({state.best_metric:.4f})"
    else:
        selection = f"the model of the last step ({state.global_step})"
    if "eval_loss" in metrics:
        selection += f", validation loss {metrics['eval_loss']:.4f}"
    return (
        f"{data} ({splits} pairs); AdamW lr {args.learning_rate}, {args.lr_scheduler_type.value} schedule, "
        f"{args.warmup_steps:g} warm-up steps, batch {args.per_device_train_batch_size} per device x "
        f"{args.world_size} devices ({distributed_strategy(trainer.accelerator)}), {state.global_step} steps; kept "
        f"{selection}."
    )


def main(argv: list[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, float]:
    """`training/run.py`: parse the flags (or a JSON / YAML file), train, save, score, write the card, push. Ctrl-C
    raises `TrainingInterrupted`, which names the checkpoint to resume from."""
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_args(argv)
    try:
        return run(model_args, data_args, training_args, callbacks)
    except KeyboardInterrupt:
        raise TrainingInterrupted(training_args.output_dir, argv) from None


def run(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: CDNPGTrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> dict[str, float]:
    """`main` after parsing the flags."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.setLevel(training_args.get_process_log_level())
    check_stages(model_args, training_args)
    check_distributed_launch(training_args)
    check_bf16_on_cpu(training_args)
    prepare_output_dir(
        training_args,
        inputs=[
            model_args.model_name_or_path, model_args.init_from, model_args.tokenizer_name, data_args.train_file,
            data_args.validation_file, data_args.test_file, data_args.quora_file, data_args.twitter_train_file,
        ],
    )  # fmt: skip
    metric = load_metric() if training_args.do_predict else None
    set_seed(training_args.seed)

    corpus, tokenizer, features = prepare_data(model_args, data_args, training_args)
    model = build_model(model_args, tokenizer)
    logger.info("C-DNPG (%s): %s parameters", model.config.granularity_mask, f"{model.num_parameters():,}")
    callbacks = list(callbacks)
    if data_args.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(data_args.early_stopping_patience))
    trainer = make_trainer(model, tokenizer, features, training_args, data_args.max_target_length, callbacks)
    report_strategy(trainer)

    metrics = train_and_score(trainer, corpus, features, metric, data_args.max_target_length)
    output_dir = training_args.output_dir
    with model_kept_on_failure(output_dir, "writing the model card"):
        trainer.write_model_card(
            metrics={k.removeprefix("test_"): v for k, v in metrics.items() if k.startswith("test_")},
            dataset=data_name(data_args),
            training_summary=training_summary(trainer, data_name(data_args), corpus, metrics),
            max_length=data_args.max_source_length,
            warm_start=checkpoint_name(model_args.init_from) if model_args.init_from else None,
        )
    if training_args.push_to_hub:
        with model_kept_on_failure(output_dir, "the push to the Hub"):
            trainer.push_to_hub(commit_message="C-DNPG checkpoint")
    return metrics
