"""A run's model: the checkpoint to fine-tune, a converted pretrained one (warm start), a new C-DNPG, or a baseline
(`--architecture bart | bert2bert`); and, after training, the calibration of z that novelty decoding reads and the save."""

import logging
from collections import Counter
from collections.abc import Sequence

import datasets
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Seq2SeqTrainer

from cdnpg.calibration import calibrate_granularity
from cdnpg.convert import convert
from cdnpg.data import model_token_ids
from cdnpg.training.arguments import ModelArguments, UsageError
from cdnpg.training.baselines import bart_like, bert2bert
from cdnpg.training.trainer import run_decoding_config
from cdnpg.training.workarounds import fsdp_root_unsharded
from configuration_cdnpg import CDNPGConfig
from modeling_cdnpg import CDNPGForConditionalGeneration

logger = logging.getLogger("cdnpg.training")
CALIBRATION_TEXTS = 2000  # training sources that calibrate_granularity reads (word frequencies and z): seconds


def build_config(args: ModelArguments, tokenizer: PreTrainedTokenizerBase, **fields: object) -> CDNPGConfig:
    """A new model's config: CDNPGConfig's defaults, the architecture flags given, the tokenizer's vocabulary
    size and special ids ([CLS] starts decoding), and any other `fields`."""
    return CDNPGConfig(**model_token_ids(tokenizer), **args.config_overrides(), **fields)


def load_checkpoint(name_or_path: str) -> CDNPGForConditionalGeneration:
    """The C-DNPG checkpoint to fine-tune or evaluate. One that does not load (weights truncated or corrupt, a
    config it cannot read) is a `UsageError` naming the flag and transformers' reason in one line, as `cdnpg`'s
    `--model` reports it (`cdnpg.inference.load_model`)."""
    try:
        return CDNPGForConditionalGeneration.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--model_name_or_path {name_or_path}: cannot load it: {reason}") from error


def build_model(
    args: ModelArguments, tokenizer: PreTrainedTokenizerBase, train_features: datasets.Dataset | None = None
) -> PreTrainedModel:
    """The checkpoint to fine-tune, the pretrained one converted (warm start), or a new model; a new or converted
    model with `--copy_common_tokens` never copies the training features' most frequent tokens. Any of them builds
    its masks as `--compile_granularity_masks` says, where given. `--architecture bart`: a new BART of the sizes a new
    C-DNPG would have; `bert2bert`: transformers' bert2bert from `--init_from`."""
    if args.architecture == "bart":
        return bart_like(build_config(args, tokenizer))
    if args.architecture == "bert2bert":
        return bert2bert(args.init_from, tokenizer)
    if args.model_name_or_path:
        model = load_checkpoint(args.model_name_or_path)
    else:
        overrides = {}
        if args.copy_common_tokens:
            if train_features is None:
                raise ValueError(
                    "--copy_common_tokens counts the training pairs' tokens: this run has no training split"
                )
            overrides["copy_excluded_token_ids"] = common_tokens(train_features, args.copy_common_tokens)
        if args.init_from:
            model = convert(args.init_from, **args.config_overrides(), **overrides)[0].train()
        else:
            model = CDNPGForConditionalGeneration(build_config(args, tokenizer, **overrides))
    if args.compile_granularity_masks is not None:  # how the masks run, not what they are: any source takes it
        model.config.compile_granularity_masks = args.compile_granularity_masks
    return model


def common_tokens(features: datasets.Dataset, size: int) -> list[int]:
    """The `size` most frequent token ids of the tokenized sources and labels (the special tokens included), most
    frequent first: what `copy_excluded_token_ids` keeps the pointer away from."""
    counts = Counter(i for column in ("input_ids", "labels") for ids in features[column] for i in ids if i >= 0)
    return [token for token, _ in counts.most_common(size)]


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


def save_trained_model(trainer: Seq2SeqTrainer, corpus: datasets.DatasetDict, max_new_tokens: int) -> None:
    """Save the run's model with its decoding defaults, and with z calibrated when it trained. Seq2SeqTrainer leaves
    every generation default in the config (max_length too): only what the run chose is saved."""
    trainer.model.generation_config = run_decoding_config(trainer.model, trainer.args, max_new_tokens)
    if trainer.args.do_train:
        calibrate(trainer.model, trainer.processing_class, corpus["train"]["source"][:CALIBRATION_TEXTS])
    trainer.save_model()
