"""transformers' BART sized like a given C-DNPG: the baseline a user would otherwise pick, for both benchmarks.

Same dimensions, ReLU feed-forward, dropouts, learned positions, tied embeddings, special tokens and initialisation.
What remains different is BART's own (layernorm_embedding, final_logits_bias) and the attention (no granularity mask).
"""

from transformers import BartConfig, BartForConditionalGeneration

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
