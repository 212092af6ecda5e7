"""transformers' BART sized like a given C-DNPG: the baseline a user would otherwise pick, for both benchmarks.

Same dimensions, ReLU feed-forward, dropouts, learned positions, tied embeddings, special tokens and initialisation.
What remains different is BART's own (layernorm_embedding, final_logits_bias) and the attention (no granularity mask).
"""

from transformers import BartConfig, BartForConditionalGeneration

from configuration_cdnpg import CDNPGConfig


def bart_config_like(config: CDNPGConfig) -> BartConfig:
    return BartConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        max_position_embeddings=config.max_position_embeddings,
        activation_function=config.activation_function,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.dropout,  # C-DNPG drops the FFN activations with `dropout` too
        scale_embedding=False,
        init_std=config.initializer_range,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=None,  # BART's default forces token 2 at max length; C-DNPG forces nothing
        tie_word_embeddings=True,
    )


def bart_like(config: CDNPGConfig) -> BartForConditionalGeneration:
    """A freshly initialised BART of the same size (torch's current seed decides its weights)."""
    return BartForConditionalGeneration(bart_config_like(config))
