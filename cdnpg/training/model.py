"""A run's model: the checkpoint to fine-tune, a converted pretrained one (warm start), or a new C-DNPG; and, after
training, the calibration of z that novelty decoding reads."""

import logging
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cdnpg.convert import convert
from cdnpg.data import model_token_ids
from cdnpg.training.arguments import ModelArguments
from cdnpg.training.trainer import fsdp_root_unsharded
from configuration_cdnpg import CDNPGConfig
from modeling_cdnpg import CDNPGForConditionalGeneration
from modeling_cdnpg.generation_cdnpg import calibrate_granularity

logger = logging.getLogger("cdnpg.training")


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
