"""The baselines a user would otherwise pick: transformers' BART sized like a given C-DNPG, and transformers'
bert2bert from the checkpoint a warm start converts.

Same dimensions, ReLU feed-forward, dropouts, learned positions, tied embeddings, special tokens and initialisation.
What remains different is BART's own (layernorm_embedding, final_logits_bias) and the attention (no granularity mask).
"""

from transformers import BartConfig, BartForConditionalGeneration, EncoderDecoderModel, PreTrainedTokenizerBase

from cdnpg.convert import BART_FIELDS
from configuration_cdnpg import CDNPGConfig


def bart_config_like(config: CDNPGConfig) -> BartConfig:
    return BartConfig(
        **{theirs: getattr(config, ours) for ours, theirs in BART_FIELDS.items()},
        activation_dropout=config.dropout,  # C-DNPG drops the FFN activations with `dropout` too
        forced_eos_token_id=None,  # BART's default forces token 2 at max length; C-DNPG forces nothing
    )


def bart_like(config: CDNPGConfig) -> BartForConditionalGeneration:
    """A freshly initialised BART of the same size (torch's current seed decides its weights)."""
    return BartForConditionalGeneration(bart_config_like(config))


def bert2bert(checkpoint: str, tokenizer: PreTrainedTokenizerBase) -> EncoderDecoderModel:
    """transformers' bert2bert (Rothe et al. 2020): the checkpoint as encoder and as decoder (new cross-attention and
    prediction head), decoding from [CLS] to [SEP] as a warm-started C-DNPG does."""
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(checkpoint, checkpoint)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    model.config.decoder_start_token_id, model.config.bos_token_id = cls, cls
    model.config.eos_token_id, model.config.pad_token_id = sep, pad
    return model
