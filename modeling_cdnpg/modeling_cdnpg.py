"""PyTorch C-DNPG: "Continuous Decomposition of Granularity for Neural Paraphrase Generation" (Gu et al., COLING 2022).

A post-LayerNorm Transformer encoder-decoder (eqs. 3 and 10) whose attentions are granularity-aware (GA-attention):

    z_i    = sigmoid(W_G h_i)                                                    eq. 4, one W_G per attention module
    C_ij   = (1 - z_i) max(0, 1 - (z_i + z_j)) + z_i min(1, 1 - z_i + z_j)      eq. 6, resonance mask
    S_ij   = max(0, min(1, (N - eps)^(1 - z_i) + eps - |i - j|))                eq. 8, scope mask
    Ã      = A ⊙ M,   M ∈ {C, S, C ⊙ S, (C + S) / 2}                           eq. 9

z ≈ 1 marks phrase-level detail, z ≈ 0 sentence-level template. Encoder and decoder self-attention get the mask named
by `config.granularity_mask`; cross-attention gets the resonance mask between decoder queries and encoder keys
(`config.cross_attention_granularity`), as in the authors' released code.

Deliberate differences from the released code, each covered by a test:
- N in eq. 8 is the number of keys query i can see: each sentence's own length in the encoder (padding and batch
  composition never change an output), i + 1 in the decoder (so cached decoding equals a full forward).
- (N - eps) is clamped at 0 before the power: eq. 8 is undefined for N < eps, where every key lies inside the window.
- Masks are computed in fp32 and enter attention as the finite bias log(max(M, 1e-32)) ("log_bias" mode, the released
  code's renormalised product), which lets the fused `scaled_dot_product_attention` kernel run. The literal eq. 9
  ("multiply" mode) is available on the eager path.
- Decoding is incremental: the key/value cache (`EncoderDecoderCache`) also carries each cached key's z, stored as one
  extra head of the value cache whose channels all hold z (values: (b, h + 1, j, d_head)).

Shape legend: b batch, h heads, i query positions, j key positions, d model width.
Supported: transformers 4.57.x and 5.x. This file is copied into every saved checkpoint (remote code), so it imports
only torch, transformers and its sibling configuration file.
"""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)

from .configuration_cdnpg import CDNPGConfig

if TYPE_CHECKING:  # never imported here, but transformers copies a model's relative imports with its remote code
    from .pipeline_cdnpg import CDNPGText2TextPipeline  # noqa: F401

MASK_FLOOR = 1e-32  # smallest mask value before the log (released code): log(1e-32) ≈ -73.7, i.e. weight ~ 0


# ------------------------------------------------------------------------------------------------------------------
# The paper's concepts: granularity head (eq. 4), resonance mask (eq. 6), scope mask (eq. 8), their combination (eq. 9)
# ------------------------------------------------------------------------------------------------------------------


class GranularityHead(nn.Module):
    """Eq. 4: z = sigmoid(W_G h), one scalar per token; z ≈ 1 phrase-level detail, z ≈ 0 sentence-level template."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 1)  # W_G (with bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # fp32 so that the masks built from z stay exact under bf16/fp16 autocast
        return torch.sigmoid(self.proj(hidden_states).float()).squeeze(-1)  # (b, t)


def resonance_mask(z_query: torch.Tensor, z_key: torch.Tensor) -> torch.Tensor:
    """Eq. 6, the continuous relaxation of eq. 5 (C_ij = 1 iff z_i = z_j): template tokens (z_i ≈ 0) attend to
    template tokens, detail tokens (z_i ≈ 1) to tokens at least as detailed as themselves.

    z_query (b, i), z_key (b, j) -> C (b, i, j).
    """
    z_i = z_query[:, :, None]
    z_j = z_key[:, None, :]
    return (1 - z_i) * (1 - (z_i + z_j)).clamp(min=0) + z_i * (1 - z_i + z_j).clamp(max=1)


def scope_mask(z_query: torch.Tensor, length: torch.Tensor, distance: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Eq. 8, the continuous relaxation of eq. 7: a template token (z_i = 0) sees all N visible tokens, a detail
    token (z_i = 1) only its neighbours within epsilon.

    z_query (b, i); length N (b, i), the number of keys query i can see; distance |i - j| (i, j) -> S (b, i, j).
    (N - eps) is clamped at the smallest positive float: eq. 8 is undefined for N < eps (every key then lies within
    eps anyway), and the clamp keeps the power's gradient finite.
    """
    base = (length - epsilon).clamp(min=torch.finfo(torch.float32).tiny)
    width = base.pow(1 - z_query) + epsilon  # (b, i)
    return (width[:, :, None] - distance).clamp(min=0, max=1)


def granularity_mask(
    kind: str,
    z_query: torch.Tensor,
    z_key: torch.Tensor,
    length: torch.Tensor | None,
    distance: torch.Tensor | None,
    epsilon: float,
) -> torch.Tensor:
    """The mask M of eq. 9 for one attention module: resonance (R), scope (S), product (R⊙S) or mean ((R+S)/2)."""
    if kind == "resonance":
        return resonance_mask(z_query, z_key)
    scope = scope_mask(z_query, length, distance, epsilon)
    if kind == "scope":
        return scope
    resonance = resonance_mask(z_query, z_key)
    return resonance * scope if kind == "product" else (resonance + scope) / 2


@dataclass
class AttentionLayout:
    """Which keys each query may see, computed once per stack and shared by its layers.

    allowed: (b, 1, i, j) bool; length: (b, i) float, N of eq. 8; distance: (i, j) float, |i - j| of eq. 8.
    """

    allowed: torch.Tensor
    length: torch.Tensor
    distance: torch.Tensor

    @classmethod
    def build(cls, key_padding: torch.Tensor, num_queries: int, past_length: int = 0, causal: bool = False):
        """key_padding (b, j) bool, True for real tokens; queries sit at positions past_length .. past_length + i - 1."""
        device = key_padding.device
        query_pos = torch.arange(past_length, past_length + num_queries, device=device)
        key_pos = torch.arange(key_padding.shape[-1], device=device)
        allowed = key_padding[:, None, None, :].expand(-1, 1, num_queries, -1)  # (b, 1, i, j)
        if causal:
            allowed = allowed & (key_pos[None, :] <= query_pos[:, None])
        length = allowed[:, 0].sum(-1).float()  # (b, i)
        distance = (query_pos[:, None] - key_pos[None, :]).abs().float()  # (i, j)
        return cls(allowed=allowed, length=length, distance=distance)


def attention_bias(allowed: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive float mask (b, 1, i, j): log(max(M, 1e-32)) where a key is visible, the dtype's minimum where not.

    The minimum (not -inf) keeps a fully masked row finite: it attends uniformly instead of producing NaN.
    """
    visible = torch.zeros((), dtype=torch.float32, device=allowed.device)
    if mask is not None:
        visible = mask.clamp(min=MASK_FLOOR).log()[:, None]  # (b, 1, i, j)
    return torch.where(allowed, visible, torch.finfo(dtype).min).to(dtype)


def eager_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    dropout: float,
    multiplier: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention, and the only path for the literal eq. 9 (`multiplier` scales the softmax output).

    query (b, h, i, d), key/value (b, h, j, d), bias (b, 1, i, j) -> output (b, h, i, d), weights (b, h, i, j).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + bias
    weights = F.softmax(scores, dim=-1, dtype=torch.float32)
    if multiplier is not None:  # GA, eq. 9: Ã = A ⊙ M, no renormalisation
        weights = weights * multiplier[:, None]
    weights = F.dropout(weights.to(query.dtype), p=dropout)
    return torch.matmul(weights, value), weights


# ------------------------------------------------------------------------------------------------------------------
# Transformer blocks
# ------------------------------------------------------------------------------------------------------------------


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: decoder inputs are the labels shifted right behind the start token, -100 read as padding."""
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class CDNPGAttention(nn.Module):
    """Multi-head attention with a granularity mask (GA-attention, eqs. 4-9).

    `mask_kind` is fixed by the config at construction: "none" builds no granularity head and is plain attention.
    """

    def __init__(self, config: CDNPGConfig, num_heads: int, layer_idx: int, mask_kind: str, is_cross_attention=False):
        super().__init__()
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.mask_kind = mask_kind
        self.multiply = config.granularity_mask_mode == "multiply"
        self.epsilon = config.scope_epsilon
        self.config = config

        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.granularity_head = GranularityHead(self.embed_dim) if mask_kind != "none" else None

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, t, d_head)

    def _project_keys(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))

    def _cache(self, cache: Cache, key, value, z):
        """Store keys, values and z (as an extra value head); return the full key, value and z seen so far."""
        if z is not None:
            value = torch.cat([value, z.to(value.dtype)[:, None, :, None].expand(-1, 1, -1, self.head_dim)], dim=1)
        key, value = cache.update(key, value, self.layer_idx)
        if z is not None:
            value, z = value[:, : self.num_heads], value[:, self.num_heads, :, 0].float()
        return key, value, z

    def _cached(self, cache: Cache):
        key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        if self.granularity_head is None:
            return key, value, None
        return key, value[:, : self.num_heads], value[:, self.num_heads, :, 0].float()

    def forward(
        self,
        hidden_states: torch.Tensor,
        layout: AttentionLayout,
        key_value_states: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """hidden_states (b, i, d) -> output (b, i, d), attention weights (b, h, i, j) or None, z of the queries (b, i)."""
        query = self._split_heads(self.q_proj(hidden_states))
        z_query = self.granularity_head(hidden_states) if self.granularity_head is not None else None

        if self.is_cross_attention:
            cache = past_key_values.cross_attention_cache if past_key_values is not None else None
            if cache is not None and past_key_values.is_updated.get(self.layer_idx):
                key, value, z_key = self._cached(cache)  # encoder side computed once, at the first decoding step
            else:
                key, value = self._project_keys(key_value_states)
                z_key = self.granularity_head(key_value_states) if self.granularity_head is not None else None
                if cache is not None:
                    key, value, z_key = self._cache(cache, key, value, z_key)
                    past_key_values.is_updated[self.layer_idx] = True
        else:
            key, value = self._project_keys(hidden_states)
            z_key = z_query  # the same tokens: one z per token, eq. 4
            if past_key_values is not None:
                key, value, z_key = self._cache(past_key_values.self_attention_cache, key, value, z_key)

        mask = None
        if z_query is not None:  # GA, eqs. 6-9
            mask = granularity_mask(self.mask_kind, z_query, z_key, layout.length, layout.distance, self.epsilon)
        multiplier = mask if self.multiply else None
        bias = attention_bias(layout.allowed, None if self.multiply else mask, query.dtype)
        dropout = self.dropout if self.training else 0.0

        if output_attentions or multiplier is not None or self.config._attn_implementation == "eager":
            attn_output, attn_weights = eager_attention(query, key, value, bias, self.scaling, dropout, multiplier)
        else:
            attn_output = F.scaled_dot_product_attention(
                query, key, value, attn_mask=bias, dropout_p=dropout, scale=self.scaling
            )
            attn_weights = None
        attn_output = attn_output.transpose(1, 2).reshape(*hidden_states.shape[:2], self.embed_dim)
        return self.out_proj(attn_output), attn_weights if output_attentions else None, z_query


class CDNPGFeedForward(nn.Module):
    def __init__(self, config: CDNPGConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.activation_fn(self.fc1(hidden_states))))


class CDNPGEncoderLayer(GradientCheckpointingLayer):
    """Eq. 3, post-LayerNorm: H = LN(H + GA-SelfAttn(H)); H = LN(H + FFN(H))."""

    def __init__(self, config: CDNPGConfig, layer_idx: int):
        super().__init__()
        self.self_attn = CDNPGAttention(config, config.encoder_attention_heads, layer_idx, config.granularity_mask)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = CDNPGFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor, layout: AttentionLayout, output_attentions: bool = False):
        attn_output, attn_weights, z = self.self_attn(hidden_states, layout, output_attentions=output_attentions)
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        hidden_states = self.final_layer_norm(hidden_states + self.dropout(self.ffn(hidden_states)))
        return hidden_states, attn_weights, z


class CDNPGDecoderLayer(GradientCheckpointingLayer):
    """Eq. 10, post-LayerNorm: causal GA-self-attention, GA-cross-attention over the encoder, feed-forward."""

    def __init__(self, config: CDNPGConfig, layer_idx: int):
        super().__init__()
        heads = config.decoder_attention_heads
        cross_kind = (
            "resonance" if config.cross_attention_granularity and config.granularity_mask != "none" else "none"
        )
        self.self_attn = CDNPGAttention(config, heads, layer_idx, config.granularity_mask)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = CDNPGAttention(config, heads, layer_idx, cross_kind, is_cross_attention=True)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = CDNPGFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        self_layout: AttentionLayout,
        cross_layout: AttentionLayout,
        past_key_values: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ):
        attn_output, self_weights, self_z = self.self_attn(
            hidden_states, self_layout, past_key_values=past_key_values, output_attentions=output_attentions
        )
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        attn_output, cross_weights, cross_z = self.encoder_attn(
            hidden_states,
            cross_layout,
            key_value_states=encoder_hidden_states,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
        )
        hidden_states = self.encoder_attn_layer_norm(hidden_states + self.dropout(attn_output))
        hidden_states = self.final_layer_norm(hidden_states + self.dropout(self.ffn(hidden_states)))
        return hidden_states, self_weights, cross_weights, self_z, cross_z


# ------------------------------------------------------------------------------------------------------------------
# Outputs: the standard ones plus z of every layer (the paper's Figure 2)
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class CDNPGEncoderOutput(BaseModelOutput):
    """`granularities`: z (b, s) of every encoder layer's self-attention, when `output_granularities=True`."""

    granularities: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CDNPGDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Adds z (eq. 4) of every decoder layer's self-attention (`granularities`) and cross-attention queries."""

    granularities: tuple[torch.FloatTensor, ...] | None = None
    cross_granularities: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CDNPGModelOutput(Seq2SeqModelOutput):
    """Adds z (eq. 4) of every layer: encoder self-attention (b, s), decoder self- and cross-attention queries (b, t)."""

    encoder_granularities: tuple[torch.FloatTensor, ...] | None = None
    decoder_granularities: tuple[torch.FloatTensor, ...] | None = None
    cross_granularities: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CDNPGSeq2SeqLMOutput(Seq2SeqLMOutput):
    """Adds z (eq. 4) of every layer: encoder self-attention (b, s), decoder self- and cross-attention queries (b, t)."""

    encoder_granularities: tuple[torch.FloatTensor, ...] | None = None
    decoder_granularities: tuple[torch.FloatTensor, ...] | None = None
    cross_granularities: tuple[torch.FloatTensor, ...] | None = None


def _collect(items: list | None) -> tuple | None:
    """Per-layer outputs as a tuple, None when not requested or when the layers have no granularity head."""
    if not items or items[0] is None:
        return None
    return tuple(items)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------


@contextmanager
def staged_directory(target: str | os.PathLike) -> Iterator[Path]:
    """The folder to write a checkpoint into, such that a failure never leaves an earlier checkpoint half-overwritten.

    transformers writes in place. A new or empty `target` has nothing to lose and is written directly; an existing
    checkpoint is written to a temporary sibling folder whose files are moved in at the end (and weight shards of
    the earlier layout that the new save did not write are removed).
    """
    target = Path(target)
    if target.is_file():
        raise ValueError(f"save_directory {str(target)!r} is a file, not a folder")
    if not target.is_dir() or not any(target.iterdir()):
        target.mkdir(parents=True, exist_ok=True)
        yield target
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        yield staging
        written = {path.name for path in staging.iterdir()}
        for path in staging.iterdir():
            os.replace(path, target / path.name)
        for stale in [*target.glob("model*.safetensors*"), *target.glob("pytorch_model*.bin*")]:
            if stale.name not in written:
                stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class CDNPGPreTrainedModel(PreTrainedModel):
    config_class = CDNPGConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CDNPGEncoderLayer", "CDNPGDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = False  # the granularity term needs an additive float mask
    _supports_flash_attn_2 = False
    _supports_flex_attn = False
    _supports_cache_class = True

    def save_pretrained(self, save_directory: str | os.PathLike, *args, push_to_hub: bool = False, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained` (weights, config, generation config, and the remote code with its
        `auto_map`), made atomic by `staged_directory`: a save that fails half-way leaves an earlier checkpoint in
        `save_directory` as it was."""
        with staged_directory(save_directory) as staging:
            super().save_pretrained(staging, *args, **kwargs)
        if push_to_hub:  # from the final folder, not the staging one, whose name would become the repo id
            hub_kwargs = {key: kwargs[key] for key in ("commit_message", "private", "token") if key in kwargs}
            self.push_to_hub(kwargs.get("repo_id", Path(save_directory).name), **hub_kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`; a truncated or corrupt weights file is reported by name."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(
                f"The weights file (model.safetensors) of {str(pretrained_model_name_or_path)!r} is truncated or "
                f"corrupt ({error}); save or download the checkpoint again."
            ) from error

    # `_init_weights` is PreTrainedModel's: Normal(0, initializer_range) for every Linear (W_G included) and
    # Embedding, zero biases and padding row, unit LayerNorms.


class CDNPGEncoder(CDNPGPreTrainedModel):
    """Eq. 3 stacked `encoder_layers` times over token + learned position embeddings."""

    def __init__(self, config: CDNPGConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embed_tokens = embed_tokens
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([CDNPGEncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.dropout = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_granularities: bool | None = None,
        return_dict: bool | None = None,
    ) -> CDNPGEncoderOutput | tuple:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds to the encoder.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, seq_len = inputs_embeds.shape[:2]
        _check_length(seq_len, self.config.max_position_embeddings, "input")
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, seq_len, device=inputs_embeds.device)
        # N of eq. 8 is each sentence's own number of real tokens: batch composition never changes an output
        layout = AttentionLayout.build(attention_mask.bool(), seq_len)

        positions = self.embed_positions(torch.arange(seq_len, device=inputs_embeds.device))
        hidden_states = self.dropout(inputs_embeds + positions)

        all_hidden, all_attn, all_z = [], [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, attn_weights, z = layer(hidden_states, layout, output_attentions=bool(output_attentions))
            all_attn.append(attn_weights)
            all_z.append(z)
        if output_hidden_states:
            all_hidden.append(hidden_states)

        output = CDNPGEncoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
            granularities=_collect(all_z) if output_granularities else None,
        )
        return output if _return_dict(return_dict, self.config) else output.to_tuple()


class CDNPGDecoder(CDNPGPreTrainedModel):
    """Eq. 10 stacked `decoder_layers` times; incremental with an `EncoderDecoderCache`."""

    def __init__(self, config: CDNPGConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embed_tokens = embed_tokens
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([CDNPGDecoderLayer(config, i) for i in range(config.decoder_layers)])
        self.dropout = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_granularities: bool | None = None,
        return_dict: bool | None = None,
    ) -> CDNPGDecoderOutput | tuple:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids or decoder_inputs_embeds.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs encoder_hidden_states (run the encoder first).")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, num_queries = inputs_embeds.shape[:2]
        device = inputs_embeds.device

        if self.gradient_checkpointing and self.training:
            use_cache = False  # a cache written inside recomputed layers would be written twice
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(), DynamicCache())
        if past_key_values is not None and not isinstance(past_key_values, EncoderDecoderCache):
            raise TypeError(
                f"past_key_values must be an EncoderDecoderCache, got {type(past_key_values).__name__}; "
                "legacy tuple caches are not supported."
            )
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        _check_length(past_length + num_queries, self.config.max_position_embeddings, "decoder input")

        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + num_queries, device=device)
        if attention_mask.shape[-1] != past_length + num_queries:
            raise ValueError(
                f"decoder_attention_mask covers {attention_mask.shape[-1]} positions, but the cache holds "
                f"{past_length} and {num_queries} are new: it must cover all {past_length + num_queries}."
            )
        if encoder_attention_mask is None:
            encoder_attention_mask = torch.ones(encoder_hidden_states.shape[:2], device=device)
        # N of eq. 8 for query i is what query i can see, i + 1: cached decoding equals a full forward
        self_layout = AttentionLayout.build(attention_mask.bool(), num_queries, past_length, causal=True)
        cross_layout = AttentionLayout.build(encoder_attention_mask.bool(), num_queries)

        positions = self.embed_positions(torch.arange(past_length, past_length + num_queries, device=device))
        hidden_states = self.dropout(inputs_embeds + positions)

        all_hidden, self_attn, cross_attn, self_z, cross_z = [], [], [], [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_w, cross_w, z_self, z_cross = layer(
                hidden_states,
                encoder_hidden_states,
                self_layout,
                cross_layout,
                past_key_values=past_key_values,
                output_attentions=bool(output_attentions),
            )
            self_attn.append(self_w)
            cross_attn.append(cross_w)
            self_z.append(z_self)
            cross_z.append(z_cross)
        if output_hidden_states:
            all_hidden.append(hidden_states)

        output = CDNPGDecoderOutput(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(self_attn) if output_attentions else None,
            cross_attentions=tuple(cross_attn) if output_attentions else None,
            granularities=_collect(self_z) if output_granularities else None,
            cross_granularities=_collect(cross_z) if output_granularities else None,
        )
        return output if _return_dict(return_dict, self.config) else output.to_tuple()


class CDNPGModel(CDNPGPreTrainedModel):
    """The bare encoder-decoder, returning the decoder's last hidden states."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    _keys_to_ignore_on_save = list(_tied_weights_keys)  # tied copies: Trainer re-ties instead of warning on load

    def __init__(self, config: CDNPGConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = CDNPGEncoder(config, self.shared)
        self.decoder = CDNPGDecoder(config, self.shared)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def get_encoder(self) -> CDNPGEncoder:
        return self.encoder

    def get_decoder(self) -> CDNPGDecoder:
        return self.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: CDNPGEncoderOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_granularities: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CDNPGModelOutput | tuple:
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                output_granularities=output_granularities,
                return_dict=True,
            )
        elif not isinstance(encoder_outputs, CDNPGEncoderOutput):
            encoder_outputs = CDNPGEncoderOutput(*encoder_outputs)

        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_granularities=output_granularities,
            return_dict=True,
        )
        output = CDNPGModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            encoder_granularities=encoder_outputs.granularities,
            decoder_granularities=decoder_outputs.granularities,
            cross_granularities=decoder_outputs.cross_granularities,
        )
        return output if _return_dict(return_dict, self.config) else output.to_tuple()


class CDNPGForConditionalGeneration(CDNPGPreTrainedModel, GenerationMixin):
    """C-DNPG with its language-modelling head tied to the shared embedding: a paraphrase generator."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    _keys_to_ignore_on_save = [
        "lm_head.weight",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
    ]

    def __init__(self, config: CDNPGConfig):
        super().__init__(config)
        self.model = CDNPGModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # The paper's decoding (Section 4.2): beam 8 over sentences of at most 20 tokens. A checkpoint's own
        # generation_config.json replaces these on from_pretrained.
        self.generation_config.num_beams = 8
        self.generation_config.max_new_tokens = 20

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_encoder(self) -> CDNPGEncoder:
        return self.model.encoder

    def get_decoder(self) -> CDNPGDecoder:
        return self.model.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: CDNPGEncoderOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_granularities: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CDNPGSeq2SeqLMOutput | tuple:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, -100 where ignored; the
            decoder inputs are derived from them when not given.
        output_granularities (`bool`): return z (eq. 4) of every layer, e.g. to draw the paper's Figure 2.
        num_items_in_batch: the number of target tokens in the whole (gradient-accumulated, all-process) batch, as
            passed by `Trainer`; the loss is then the token sum divided by it, so that it stays the mean token loss
            whatever the number of processes or accumulation steps.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_granularities=output_granularities,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)

        loss = None
        if labels is not None:
            token_losses = F.cross_entropy(
                logits.float().flatten(0, 1), labels.flatten().to(logits.device), reduction="none"
            )  # ignore_index -100 gives 0
            if num_items_in_batch is None:
                loss = token_losses.sum() / (labels != -100).sum().clamp(min=1)
            else:
                loss = token_losses.sum() / num_items_in_batch

        output = CDNPGSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            encoder_granularities=outputs.encoder_granularities,
            decoder_granularities=outputs.decoder_granularities,
            cross_granularities=outputs.cross_granularities,
        )
        return output if _return_dict(return_dict, self.config) else output.to_tuple()

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by `DataCollatorForSeq2Seq` to build decoder inputs in the collator."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


def _check_length(length: int, limit: int, what: str) -> None:
    if length > limit:
        raise ValueError(
            f"The {what} has {length} positions but the model has max_position_embeddings={limit}: truncate it "
            "(the paper truncates sentences to 20 tokens)."
        )


def _return_dict(return_dict: bool | None, config: CDNPGConfig) -> bool:
    return return_dict if return_dict is not None else config.return_dict


__all__ = [
    "CDNPGDecoder",
    "CDNPGEncoder",
    "CDNPGForConditionalGeneration",
    "CDNPGModel",
    "CDNPGPreTrainedModel",
    "GranularityHead",
    "granularity_mask",
    "resonance_mask",
    "scope_mask",
]
