"""Configuration of C-DNPG (Gu et al., "Continuous Decomposition of Granularity for Neural Paraphrase Generation",
COLING 2022). Remote code, copied next to the weights of every saved checkpoint: it imports only `transformers`
(4.57.x and 5.x)."""

import copy

from transformers import PretrainedConfig

GRANULARITY_MASKS = ("resonance", "scope", "product", "mean", "none")
GRANULARITY_MASK_MODES = ("log_bias", "multiply")
COPY_MECHANISMS = (None, "learned", "granularity")
# pipeline_cdnpg.py, which `pipeline("text2text-generation", ...)` finds in the saved config (5.x has none built in)
TEXT2TEXT_PIPELINE = {
    "text2text-generation": {
        "impl": "pipeline_cdnpg.CDNPGText2TextPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "tf": [],
        "type": "text",
    }
}

# --- transformers version shims: each names the version it is for; delete it with that version's support ---
CACHE_OUTPUT_NAMES = ["cache", "past_key_values"]  # the cache's output field: 5.24 renamed past_key_values, 4.57's

CHOICES = {  # the values these fields take
    "granularity_mask": GRANULARITY_MASKS,
    "granularity_mask_mode": GRANULARITY_MASK_MODES,
    "copy_mechanism": COPY_MECHANISMS,
    "compile_granularity_masks": (None, True, False),
}
INTEGER_MINIMUMS = {"max_position_embeddings": 2, "position_offset": 0} | dict.fromkeys(
    ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim"), 1
)
BERT_SPECIAL_TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102, "decoder_start_token_id": 101}


class CDNPGConfig(PretrainedConfig):
    r"""Configuration of a C-DNPG encoder-decoder; the defaults are the paper's Quora/Twitter setup (Section 4.2).

    Args:
        vocab_size (`int`, defaults to 30522):
            Size of the shared token embedding (bert-base-uncased's WordPiece vocabulary in the paper).
        max_position_embeddings, position_offset (`int`, defaults to 512 and 0):
            Number of learned positions (the paper truncates sentences to 20 tokens); the row that position 0 reads.
        scale_embedding, layernorm_embedding (`bool`, defaults to `False`):
            Token embeddings times sqrt(d_model) (BART); a LayerNorm over token + position embeddings (BART, BERT).
        d_model, encoder_layers, decoder_layers (`int`, defaults to 450, 3 and 3):
            Hidden size, and the number of encoder blocks (eq. 3) and decoder blocks (eq. 10) (Section 4.2).
        encoder_attention_heads, decoder_attention_heads (`int`, defaults to 9):
            Heads of each encoder and decoder attention (Section 4.2). Must divide `d_model`.
        encoder_ffn_dim, decoder_ffn_dim (`int`, defaults to 1024):
            Inner size of the feed-forward blocks (1024 in the released code).
        activation_function (`str`, defaults to `"relu"`), layer_norm_eps (`float`, defaults to 1e-5):
            The feed-forward non-linearity; every LayerNorm's epsilon (BERT checkpoints use 1e-12).
        dropout, attention_dropout (`float`, defaults to 0.1), activation_dropout (`float`, *optional*):
            Dropout on embeddings and every residual branch; on the attention weights of eq. 9; after the
            feed-forward non-linearity (`None`: `dropout`; BERT's is 0).
        granularity_mask (`str`, defaults to `"resonance"`):
            The mask M of encoder and decoder self-attention (eq. 9; Table 4's ablation): `"resonance"` (C, eq. 6, the
            paper's C-DNPG (R)), `"scope"` (S, eq. 8), `"product"` (C ⊙ S), `"mean"` ((C + S) / 2) or `"none"` (a
            plain Transformer, the paper's baseline: no granularity heads).
        granularity_mask_mode (`str`, defaults to `"log_bias"`):
            `"log_bias"` adds log(M) to the attention logits (the released code's renormalised product; M ≤ 1e-32
            gives a weight of exactly 0); `"multiply"` multiplies the softmax output by M (the literal eq. 9).
        scope_epsilon (`float`, defaults to 2.0):
            The window ε of the scope mask (eqs. 7 and 8): a phrase-level token (z = 1) sees neighbours within ε.
        cross_attention_granularity (`bool`, defaults to `True`):
            Cross-attention gets the resonance mask (eq. 6), as in the released code. Needs a GA mask.
        compile_granularity_masks (`bool`, *optional*):
            Run the mask of eqs. 4-9 and the copy formulas compiled alone by `torch.compile` (same values and
            gradients, fewer kernels); `None` (the default): on CUDA only. Falls back to eager after one warning.
        lm_head_transform (`bool`, defaults to `False`):
            BERT's masked-LM head (dense, activation, LayerNorm, vocabulary bias) before the tied output projection;
            not in the paper, it speeds up a warm start from BERT.
        copy_mechanism (`str`, *optional*), copy_excluded_token_ids (`list[int]`, *optional*):
            A pointer over the source tokens, P(y) = (1 - ρ) P_gen(y) + ρ P_copy(y) (Table 2's Transformer+Copy; See
            et al. 2017): `"learned"` (ρ from the decoder state and the copy context) or `"granularity"` (copy
            attention weighted by the source's z, ρ = z of the decoder position); `None`: none. The copy never
            points at the excluded ids.
        initializer_range (`float`, defaults to 0.02):
            Standard deviation of the normal initialisation of all weight matrices and embeddings.
        use_cache, tie_word_embeddings (`bool`, defaults to `True`):
            The decoder returns its cache for incremental decoding; one embedding matrix for the encoder's input, the
            decoder's input and the LM head (Section 4.2).
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`, default 0, 101, 102, 101):
            bert-base-uncased's [PAD], [CLS], [SEP] and [CLS]: decoding starts at [CLS] and ends at [SEP].
    """

    model_type = "cdnpg"
    keys_to_ignore_at_inference = CACHE_OUTPUT_NAMES  # Trainer.prediction_step leaves the cache out of the logits
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "decoder_layers",
    }

    def __init__(
        self,
        vocab_size: int = 30522,
        max_position_embeddings: int = 512,
        position_offset: int = 0,
        scale_embedding: bool = False,
        layernorm_embedding: bool = False,
        d_model: int = 450,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        encoder_attention_heads: int = 9,
        decoder_attention_heads: int = 9,
        encoder_ffn_dim: int = 1024,
        decoder_ffn_dim: int = 1024,
        activation_function: str = "relu",
        layer_norm_eps: float = 1e-5,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float | None = None,
        granularity_mask: str = "resonance",
        granularity_mask_mode: str = "log_bias",
        scope_epsilon: float = 2.0,
        cross_attention_granularity: bool = True,
        compile_granularity_masks: bool | None = None,
        initializer_range: float = 0.02,
        lm_head_transform: bool = False,
        copy_mechanism: str | None = None,
        copy_excluded_token_ids: list[int] | None = None,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.position_offset = position_offset
        self.scale_embedding = scale_embedding
        self.layernorm_embedding = layernorm_embedding
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.activation_function = activation_function
        self.layer_norm_eps = layer_norm_eps
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.granularity_mask = granularity_mask
        self.granularity_mask_mode = granularity_mask_mode
        self.scope_epsilon = scope_epsilon
        self.cross_attention_granularity = cross_attention_granularity
        self.compile_granularity_masks = compile_granularity_masks
        self.initializer_range = initializer_range
        self.lm_head_transform = lm_head_transform
        self.copy_mechanism = copy_mechanism
        self.copy_excluded_token_ids = list(copy_excluded_token_ids) if copy_excluded_token_ids is not None else None
        self.use_cache = use_cache  # set here, as BartConfig does: generate() and the decoder read it
        self.tie_word_embeddings = tie_word_embeddings
        # a copy per config: transformers.pipeline rewrites the class names it reads into classes, in place
        kwargs["custom_pipelines"] = copy.deepcopy(kwargs.get("custom_pipelines") or TEXT2TEXT_PIPELINE)
        self._validate()
        base_kwargs = {**BERT_SPECIAL_TOKEN_IDS, **kwargs, "is_encoder_decoder": True}
        super().__init__(tie_word_embeddings=tie_word_embeddings, **base_kwargs)

    def _validate(self) -> None:
        """Fail at construction, naming the field, rather than with a shape error deep inside a forward pass."""
        for name, allowed in CHOICES.items():  # compared with their types: 1 is not True, nor "1" 1
            value = getattr(self, name)
            if (type(value), value) not in {(type(choice), choice) for choice in allowed}:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        cross_heads = self.granularity_mask != "none" and self.cross_attention_granularity
        if self.copy_mechanism == "granularity" and not cross_heads:
            raise ValueError(
                "copy_mechanism='granularity' reads z of the last decoder layer's cross-attention, which needs "
                f"granularity heads there: granularity_mask={self.granularity_mask!r} and cross_attention_granularity="
                f"{self.cross_attention_granularity!r}; use copy_mechanism='learned' for a model without them"
            )
        if self.copy_excluded_token_ids is not None:
            if self.copy_mechanism is None:
                raise ValueError("copy_excluded_token_ids is set but copy_mechanism is None: no copy to limit")
            ids = self.copy_excluded_token_ids
            if outside := [i for i in ids if not (isinstance(i, int) and 0 <= i < self.vocab_size)]:
                raise ValueError(
                    f"copy_excluded_token_ids must be token ids in [0, vocab_size={self.vocab_size}), got {outside[:5]}"
                )
        for name, minimum in INTEGER_MINIMUMS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, name)
            if not isinstance(heads, int) or heads < 1 or self.d_model % heads:
                raise ValueError(f"{name} must be a positive integer dividing d_model={self.d_model}, got {heads!r}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not ((value is None and name == "activation_dropout") or 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("scope_epsilon", "layer_norm_eps"):  # eq. 8's window; LayerNorm's
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


__all__ = ["COPY_MECHANISMS", "GRANULARITY_MASKS", "GRANULARITY_MASK_MODES", "CDNPGConfig"]
