"""PyTorch C-DNPG: "Continuous Decomposition of Granularity for Neural Paraphrase Generation" (Gu et al., COLING 2022).

A post-LayerNorm Transformer encoder-decoder (eqs. 3 and 10) whose attentions are granularity-aware (GA-attention):

    z_i    = sigmoid(W_G h_i)                                                    eq. 4, one W_G per attention module
    C_ij   = (1 - z_i) max(0, 1 - (z_i + z_j)) + z_i min(1, 1 - z_i + z_j)      eq. 6, resonance mask
    S_ij   = max(0, min(1, (N - eps)^(1 - z_i) + eps - |i - j|))                eq. 8, scope mask
    Ã      = A ⊙ M,   M ∈ {C, S, C ⊙ S, (C + S) / 2}                           eq. 9

z ≈ 1 marks phrase-level detail, z ≈ 0 sentence-level template. Self-attention gets `config.granularity_mask`;
cross-attention the resonance mask (`config.cross_attention_granularity`), as in the authors' released code.

Deliberate differences from the released code, each covered by a test:
- N in eq. 8 is the number of keys query i can see: each sentence's own length in the encoder (padding and batch
  composition never change an output), i + 1 in the decoder (so cached decoding equals a full forward).
- (N - eps) is clamped at 0 before the power: eq. 8 is undefined for N < eps, where every key lies inside the window.
- Masks are computed in fp32 and enter attention as the finite bias log(M) ("log_bias" mode, the released code's
  renormalised product), so every backend that takes an additive mask runs GA-attention (eager, SDPA, flex
  attention). The literal eq. 9 ("multiply" mode) runs eager.
- Where M ≤ 1e-32 the weight is exactly 0 (bias -1e4), not the released code's ~1e-32 (log(1e-32)), whose backward
  products are subnormal floats (several times slower on a CPU).
- Decoding is incremental with transformers' caches; the granularity logits W_G h of the cached tokens are kept
  beside keys and values (`GranularityCache`).

The paper-named functions (`resonance_mask`, `scope_mask`, `granularity_mask`) are the specification;
`granularity_bias` turns them into attention's additive mask. The copy mechanism (`config.copy_mechanism`) is in
copy_cdnpg.py. A training or cached decoding step reads no tensor on the host (only `token_type_ids`, when given).

Shape legend: b batch, h heads, i query positions, j key positions, d model width.
Supported: transformers 4.57.x and 5.x. Remote code (copied into every saved checkpoint): imports only torch,
transformers (and safetensors, which transformers requires) and its sibling files."""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import transformers
from safetensors import SafetensorError
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache, StaticLayer
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_cdnpg import CDNPGConfig
from .copy_cdnpg import CopyMechanism
from .granularity_kernels import MASK_FLOOR, attention_with_aligned_heads, fast, flex_attention_forward, upcast

if TYPE_CHECKING:  # never imported here, but transformers copies a model's relative imports with its remote code
    from .generation_cdnpg import paraphrase  # noqa: F401  (4.57 copies only a model file's direct imports)
    from .pipeline_cdnpg import CDNPGText2TextPipeline  # noqa: F401

logger = logging.get_logger(__name__)

ZERO_MASK_BIAS = -1e4  # the bias where M ≤ MASK_FLOOR: a weight of exactly 0 (see the module docstring)
# The arguments of generation_cdnpg.paraphrase() that generate() refuses by name, pointing there
PARAPHRASE_ARGUMENTS = frozenset(
    {"novelty", "keep_details", "allow_copy", "rank_by", "novelty_z_layer", "novelty_z_inverted"}
)


# --- transformers version shims: each names the version it is for; delete it with that version's support ---

# 5.24 renamed the cache argument and output field `past_key_values` to `cache` (the old name is deprecated until
# 5.40); 4.57 knows only `past_key_values`. The model returns the cache under its version's name, and takes either.
CACHE_NAME = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
# What transformers passes every model's forward and C-DNPG reads elsewhere or not at all: the output flags (all
# versions), 4.57 generate()'s `cache_position` (positions come from the cache), 5.24 generate()'s `tokenizer`.
PASSED_TO_EVERY_MODEL = frozenset({"output_attentions", "output_hidden_states", "cache_position", "tokenizer"})


def takes_cache_by_either_name(forward: Callable) -> Callable:
    """The forward's `cache` argument, also passed as `past_key_values`: by transformers 4.57's generate(), silently,
    and by callers of transformers >= 5.24 with its own deprecation warning, as its models do until 5.40."""
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache", raise_if_both_names=True)(forward)

    @functools.wraps(forward)
    def renamed(self, *args, **kwargs):
        if "past_key_values" in kwargs:
            if "cache" in kwargs:
                raise TypeError("pass the cache once: as past_key_values (transformers 4.57) or cache, not both")
            kwargs["cache"] = kwargs.pop("past_key_values")
        return forward(self, *args, **kwargs)

    return renamed


def registered_attention(implementation: str) -> Callable:
    """transformers' attention function of that name: 5.x looks it up with `get_interface` (whose call in this file is
    what 5.x's `set_attn_implementation` looks for before switching backends at run time), 4.57 by key."""
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):  # transformers 5.x
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    return ALL_ATTENTION_FUNCTIONS[implementation]


class Transformers457Methods:
    """What transformers 4.57 asks of a model and 5.x provides itself."""

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        """4.57 has no default; 5.x's finds `encoder`, or the base model's."""
        return self.encoder if hasattr(self, "encoder") else self.model.encoder

    def _tie_weights(self) -> None:
        """4.57 ties the embeddings through this hook, 5.x reads `_tied_weights_keys`; the config flag decides both."""
        if isinstance(getattr(self, "shared", None), nn.Embedding) and self.config.tie_word_embeddings:
            self.encoder.embed_tokens = self.decoder.embed_tokens = self.shared


def forward_with_cache(forward: Callable) -> Callable:
    """`takes_cache_by_either_name`, returning a tuple where `return_dict=False` (transformers' `can_return_tuple`)."""
    return can_return_tuple(takes_cache_by_either_name(forward))


# --- The paper's concepts: granularity head (eq. 4), resonance (eq. 6) and scope (eq. 8) masks, eq. 9's M ---


class GranularityHead(nn.Module):
    """Eq. 4's projection: the granularity logit W_G h (b, t), one scalar per token, whose sigmoid is z. Attention
    carries and caches this logit; each mask applies the sigmoid itself, inside its own compiled kernel."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 1)  # W_G (with bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # squeezed here: a tensor of its own, not a view (FSDP2 warns of a layer that returns a view)
        return upcast(self.proj(hidden_states)).squeeze(-1)  # (b, t)


def resonance_mask(z_i: torch.Tensor, z_j: torch.Tensor) -> torch.Tensor:
    """Eq. 6, C_ij, the continuous relaxation of eq. 5 (C_ij = 1 iff z_i = z_j): template tokens (z_i ≈ 0) attend to
    template tokens, detail tokens (z_i ≈ 1) to tokens at least as detailed as themselves. Elementwise, as the paper
    writes it: z_i (b, i, 1) and z_j (b, 1, j) broadcast to C (b, i, j)."""
    return (1 - z_i) * (1 - (z_i + z_j)).clamp(min=0) + z_i * (1 - z_i + z_j).clamp(max=1)


def scope_mask(z_i: torch.Tensor, length: torch.Tensor, distance: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Eq. 8, S_ij, the continuous relaxation of eq. 7: a template token (z_i = 0) sees all N visible tokens, a detail
    token (z_i = 1) only its neighbours within epsilon. Elementwise: z_i and N (b, i, 1), |i - j| (i, j) -> S
    (b, i, j). (N - eps) is clamped at the smallest positive float, where the power's gradient stays finite."""
    width = (length - epsilon).clamp(min=torch.finfo(torch.float32).tiny).pow(1 - z_i) + epsilon
    return (width - distance).clamp(min=0, max=1)


def granularity_mask(
    kind: str,
    z_i: torch.Tensor,
    z_j: torch.Tensor,
    length: torch.Tensor | None,
    distance: torch.Tensor | None,
    epsilon: float,
) -> torch.Tensor:
    """The mask M_ij of eq. 9: resonance (R), scope (S), product (R⊙S) or mean ((R+S)/2); elementwise like its parts."""
    if kind == "resonance":
        return resonance_mask(z_i, z_j)
    scope = scope_mask(z_i, length, distance, epsilon)
    if kind == "scope":
        return scope
    resonance = resonance_mask(z_i, z_j)
    return resonance * scope if kind == "product" else (resonance + scope) / 2


# --- Attention: which keys each query sees, the additive mask, and the attention function ---


@dataclass
class AttentionLayout:
    """Which keys each query may see, built once per stack and passed to its layers: key_padding (b, j) True for real
    keys, or None (every key is real); query_positions (i,); key_count j (a static cache's capacity); causal: query i
    sees keys at positions <= its own; takes_is_causal: SDPA is told `is_causal` instead of given a mask."""

    key_padding: torch.Tensor | None
    query_positions: torch.Tensor
    key_count: int
    causal: bool
    takes_is_causal: bool = False
    bias: torch.Tensor | None = field(default=None, repr=False)  # `padding_bias`, built by the first module asking

    def padding_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The additive mask of plain attention (b or 1, 1, i or 1, j): 0 where a key is visible, the dtype's minimum
        (not -inf: a fully masked row stays finite) where `blocked_keys`; None where every key is visible or SDPA is
        told `is_causal`."""
        if (self.key_padding is None and not self.causal) or self.takes_is_causal:
            return None
        if self.bias is None or self.bias.dtype != dtype:
            minimum, device = torch.finfo(dtype).min, self.query_positions.device
            if self.causal:
                blocked = blocked_keys(self, self.key_count)
                self.bias = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, minimum)
            else:  # from the padding alone: one tensor filled, one masked
                visible = self.key_padding[:, None, None, :]
                self.bias = torch.full(visible.shape, minimum, dtype=dtype, device=device).masked_fill_(visible, 0.0)
        return self.bias


def visible_keys(layout: AttentionLayout, key_count: int) -> torch.Tensor:
    """N of eq. 8 (b or 1, i) float: the number of keys query i sees, the real keys (`layout.key_padding`) at positions
    up to its own (causal) or at any of the `key_count`."""
    positions = layout.query_positions
    last = positions if layout.causal else torch.full_like(positions, key_count - 1)
    if layout.key_padding is None:  # the keys at positions 0 .. last
        return (last + 1).float()[None]
    visible_so_far = layout.key_padding.long().cumsum(-1)  # (b, j): real keys at positions <= j
    return visible_so_far[:, last].float()


def blocked_keys(layout: AttentionLayout, key_count: int) -> torch.Tensor | None:
    """(b or 1, 1, i or 1, j) bool, True where a query may not see a key: padding and, when causal, keys after the
    query's position; None where every key is visible."""
    blocked = ~layout.key_padding[:, None, None, :] if layout.key_padding is not None else None  # (b, 1, 1, j)
    if layout.causal:
        key_positions = torch.arange(key_count, device=layout.query_positions.device)
        future = (key_positions > layout.query_positions[:, None])[None, None]  # (1, 1, i, j)
        blocked = future if blocked is None else blocked | future  # (b, 1, i, j)
    return blocked


def key_distance(query_positions: torch.Tensor, key_count: int) -> torch.Tensor:
    """|i - j| (i, j) float of eq. 8, between the queries' positions and those of the keys, 0 .. key_count - 1."""
    return (query_positions[:, None] - torch.arange(key_count, device=query_positions.device)).abs().float()


def layout_granularity_mask(
    kind: str, logits_query: torch.Tensor, logits_key: torch.Tensor, layout: AttentionLayout, epsilon: float
) -> torch.Tensor:
    """M (b, i, j) of eqs. 4-9 (`granularity_mask`) from the granularity logits W_G h of the queries (b, i) and keys
    (b, j), with N and |i - j| of eq. 8 from the layout (`visible_keys`, `key_distance`)."""
    z_i, z_j = torch.sigmoid(logits_query)[:, :, None], torch.sigmoid(logits_key)[:, None, :]  # eq. 4
    length = distance = None
    if kind != "resonance":  # the resonance mask reads neither N nor |i - j|
        key_count = logits_key.shape[-1]  # a tensor's size, not `layout.key_count`: compiled, lengths stay dynamic
        length = visible_keys(layout, key_count)[:, :, None].to(z_i.dtype)
        distance = key_distance(layout.query_positions, key_count).to(z_i.dtype)
    return granularity_mask(kind, z_i, z_j, length, distance, epsilon)


def granularity_bias(
    kind: str,
    logits_query: torch.Tensor,
    logits_key: torch.Tensor,
    layout: AttentionLayout,
    epsilon: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """GA-attention's additive mask (b, 1, i, j) in `dtype`: log(M) of `layout_granularity_mask` where a key is visible
    (`ZERO_MASK_BIAS` where M ≤ `MASK_FLOOR`), the dtype's minimum where it is blocked (`blocked_keys`); built from the
    padding (b, j) and the positions alone, so that compiled (`fast`) it is one kernel forward and one backward."""
    mask = layout_granularity_mask(kind, logits_query, logits_key, layout, epsilon)
    bias = torch.where(mask > MASK_FLOOR, mask.clamp(min=MASK_FLOOR).log(), ZERO_MASK_BIAS)[:, None].to(dtype)
    blocked = blocked_keys(layout, logits_key.shape[-1])
    return bias if blocked is None else bias.masked_fill(blocked, torch.finfo(dtype).min)


def attention_bias(
    layout: AttentionLayout,
    dtype: torch.dtype,
    kind: str = "none",
    logits_query: torch.Tensor | None = None,
    logits_key: torch.Tensor | None = None,
    epsilon: float = 0.0,
    compiled: bool | None = False,
) -> torch.Tensor | None:
    """The additive mask for the attention function: `granularity_bias` of `kind`, or for "none" the padding bias."""
    if kind == "none":
        return layout.padding_bias(dtype)
    bias = fast(granularity_bias, compiled, logits_query.device)
    return bias(kind, logits_query, logits_key, layout, epsilon, dtype)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    multiplier: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention (transformers' attention-function signature), the only path for the literal eq. 9, whose
    `multiplier` M (b, i, j) scales the softmax output without renormalising it. query (b, h, i, d), key and value
    (b, h, j, d), attention_mask (b, 1, i, j) -> output (b, i, h, d), weights (b, h, i, j)."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(upcast(scores), dim=-1)
    if multiplier is not None:  # GA, eq. 9: Ã = A ⊙ M
        weights = weights * multiplier[:, None]
    weights = F.dropout(weights.to(query.dtype), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def check_attention_backend(implementation: str) -> None:
    """Refuse a backend that takes no additive mask: running it would silently drop the granularity term."""
    if "flash" in implementation or implementation.startswith("paged"):
        raise ValueError(
            f"attn_implementation={implementation!r} cannot run C-DNPG: GA-attention adds the granularity mask "
            "log M (eq. 9) to the attention logits, and this backend takes no additive mask. Use 'sdpa' (default), "
            "'eager' or 'flex_attention'."
        )


def attention_function(implementation: str, head_dim: int, device: torch.device) -> Callable:
    """The backend `implementation` names, from transformers' registry (`model.set_attn_implementation` switches it
    at run time); SDPA on heads aligned for its fused kernels, flex attention as `granularity_kernels` runs it."""
    check_attention_backend(implementation)
    if implementation in ("eager", "flex_attention"):
        return eager_attention_forward if implementation == "eager" else flex_attention_forward
    attention = registered_attention(implementation)
    return attention_with_aligned_heads(attention, head_dim, device) if implementation == "sdpa" else attention


class GranularityCache(EncoderDecoderCache):
    """An `EncoderDecoderCache` that also keeps the granularity logits W_G h (eq. 4) of every cached decoder token
    and of the encoder states: the masks of a new query read z of all the keys it sees. Keys and values keep
    transformers' layout (b, h, t, d_head); the logits live in two more caches of the same kinds (dynamic, or static
    of the same lengths) as keys (b, 1, t, 1) beside empty values, and follow whatever generation does to the cache."""

    def __init__(
        self,
        self_attention_cache: Cache,
        cross_attention_cache: Cache,
        granularity_logits_cache: Cache,
        cross_granularity_logits_cache: Cache,
    ):
        super().__init__(self_attention_cache, cross_attention_cache)
        self.granularity_logits_cache = granularity_logits_cache
        self.cross_granularity_logits_cache = cross_granularity_logits_cache

    @classmethod
    def wrap(cls, cache: EncoderDecoderCache) -> "GranularityCache":
        """The same sub-caches plus empty logit caches of their kind; one that holds tokens cannot be continued."""
        if cache.get_seq_length() > 0 or any(cache.is_updated.values()):
            raise ValueError(
                f"{CACHE_NAME} holds decoder tokens or encoder keys but not their granularity z (eq. 4), which "
                "C-DNPG's masks need: continue from the cache a C-DNPG forward pass or generate() returned (a "
                "GranularityCache)."
            )

        def like(layers) -> Cache:  # an empty cache of the same kind: dynamic, or static of the same lengths
            layers = [
                StaticLayer(max_cache_len=layer.max_cache_len) if isinstance(layer, StaticLayer) else DynamicLayer()
                for layer in layers
            ]
            return Cache(layers=layers) if layers else DynamicCache()

        logit_caches = like(cache.self_attention_cache.layers), like(cache.cross_attention_cache.layers)
        return cls(cache.self_attention_cache, cache.cross_attention_cache, *logit_caches)

    @staticmethod
    def store(cache: Cache, logits: torch.Tensor, layer_idx: int, cache_kwargs: dict | None) -> torch.Tensor:
        """Write logits (b, i) into layer `layer_idx` of a logit cache as the key of one head of width 1 -> what the
        layer holds (b, j). A static layer of transformers 4.57 sizes its values as its keys: it keeps them twice."""
        logits = logits[:, None, :, None]
        static = layer_idx < len(cache.layers) and isinstance(cache.layers[layer_idx], StaticLayer)
        kept, _ = cache.update(logits, logits if static else logits[..., :0], layer_idx, cache_kwargs)
        return kept[:, 0, :, 0]

    def cross_granularity_logits(self, layer_idx: int) -> torch.Tensor:
        """The logits (b, j) of the encoder states that cross-attention layer `layer_idx` stored."""
        return self.cross_granularity_logits_cache.layers[layer_idx].keys[:, 0, :, 0]

    def follow(self, method: str, *args, cross: bool = True) -> None:
        """Apply `EncoderDecoderCache.<method>` to keys and values and to the logit caches (the cross one with
        `cross`): what generation does to the cache, it does to the logits."""
        getattr(super(), method)(*args)
        for cache in (self.granularity_logits_cache, self.cross_granularity_logits_cache)[: 1 + cross]:
            getattr(cache, method)(*args)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.follow("reorder_cache", beam_idx)

    def reset(self) -> None:
        self.follow("reset")

    def crop(self, length: int) -> None:
        """`length` as transformers reads it: 5.x removes -length tokens, 4.57 keeps the first `length`."""
        self.follow("crop", length, cross=False)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.follow("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.follow("batch_select_indices", indices)


def cache_capacity(cache: EncoderDecoderCache) -> int | None:
    """The key length of a preallocated (static) self-attention cache, None for one that grows with each step."""
    layers = cache.self_attention_cache.layers
    return getattr(layers[0], "max_cache_len", None) if layers else None


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: decoder inputs are the labels shifted right behind the start token, -100 read as padding."""
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class CDNPGAttention(nn.Module):
    """GA-attention (eqs. 4-9): BART's attention, whose additive mask carries log M (`attention_bias`). `mask_kind`
    "none" builds no granularity head and is plain attention."""

    def __init__(self, config: CDNPGConfig, num_heads: int, layer_idx: int, mask_kind: str, is_cross_attention=False):
        super().__init__()
        self.config = config
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.mask_kind = mask_kind

        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.granularity_head = GranularityHead(self.embed_dim) if mask_kind != "none" else None

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, t, d_head)

    def keys_and_values(
        self,
        states: torch.Tensor,
        logits: torch.Tensor | None,
        layout: AttentionLayout,
        cache: EncoderDecoderCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keys and values (b, h, j, d_head) and granularity logits (b, j) or None of the states attended to (b, j, d):
        self-attention's are the queries' own (`logits`, one z per token, eq. 4), appended to the cache; cross-
        attention's are the encoder states', computed at the first decoding step, then read from the cache."""
        if self.is_cross_attention:
            if cache is not None and cache.is_updated.get(self.layer_idx):
                layer = cache.cross_attention_cache.layers[self.layer_idx]
                logits = cache.cross_granularity_logits(self.layer_idx) if self.granularity_head is not None else None
                return layer.keys, layer.values, logits
            logits = self.granularity_head(states) if self.granularity_head is not None else None  # GA, eq. 4
        key_states, value_states = self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))
        if cache is None:
            return key_states, value_states, logits
        cross = self.is_cross_attention
        kv_cache = cache.cross_attention_cache if cross else cache.self_attention_cache
        cache_kwargs = None if cross else {"cache_position": layout.query_positions}
        key_states, value_states = kv_cache.update(key_states, value_states, self.layer_idx, cache_kwargs)
        if logits is not None:  # GA: the cache is a `GranularityCache`
            logits_cache = cache.cross_granularity_logits_cache if cross else cache.granularity_logits_cache
            logits = cache.store(logits_cache, logits, self.layer_idx, cache_kwargs)
        if cross:
            cache.is_updated[self.layer_idx] = True
        return key_states, value_states, logits

    def forward(
        self,
        hidden_states: torch.Tensor,
        layout: AttentionLayout,
        key_value_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        output_granularities: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """hidden_states (b, i, d) -> output (b, i, d), attention weights (b, h, i, j) or None, z of the queries (b, i)
        (eq. 4) or None."""
        query_states = self._split_heads(self.q_proj(hidden_states))
        logits_query = self.granularity_head(hidden_states) if self.granularity_head is not None else None  # GA

        source_states = key_value_states if self.is_cross_attention else hidden_states
        key_states, value_states, logits_key = self.keys_and_values(source_states, logits_query, layout, cache)

        implementation, extra = self.config._attn_implementation or "eager", {}
        kind, epsilon, compiled = self.mask_kind, self.config.scope_epsilon, self.config.compile_granularity_masks
        if logits_query is not None and self.config.granularity_mask_mode == "multiply":
            # GA, the literal eq. 9: M (b, i, j) scales the softmax output, the additive mask is padding only
            extra["multiplier"] = layout_granularity_mask(kind, logits_query, logits_key, layout, epsilon)
            implementation, kind = "eager", "none"
        if output_attentions:  # the weights themselves come from the reference path
            implementation = "eager"
        attention_mask = attention_bias(layout, query_states.dtype, kind, logits_query, logits_key, epsilon, compiled)
        attend = attention_function(implementation, self.head_dim, query_states.device)
        attn_output, attn_weights = attend(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            is_causal=attention_mask is None and layout.causal,  # read by SDPA alone (`AttentionLayout`)
            **extra,
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:2], self.embed_dim)
        z_query = torch.sigmoid(logits_query) if output_granularities and logits_query is not None else None
        return self.out_proj(attn_output), attn_weights if output_attentions else None, z_query


class CDNPGLayer(GradientCheckpointingLayer):
    """Post-LayerNorm sublayers, H = LN(H + Sublayer(H)), the last of which is the feed-forward network."""

    def add_feed_forward(self, config: CDNPGConfig, ffn_dim: int) -> None:
        """The feed-forward sublayer, added after the attention sublayers (modules are registered in that order)."""
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        activation_dropout = config.dropout if config.activation_dropout is None else config.activation_dropout
        self.activation_dropout = nn.Dropout(activation_dropout)  # BERT has none: 0 from `from_bert`

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        ffn_output = self.fc2(self.activation_dropout(self.activation_fn(self.fc1(hidden_states))))
        return self.final_layer_norm(hidden_states + self.dropout(ffn_output))


class CDNPGEncoderLayer(CDNPGLayer):
    """Eq. 3, post-LayerNorm: H = LN(H + GA-SelfAttn(H)); H = LN(H + FFN(H))."""

    def __init__(self, config: CDNPGConfig, layer_idx: int):
        super().__init__()
        self.self_attn = CDNPGAttention(config, config.encoder_attention_heads, layer_idx, config.granularity_mask)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.add_feed_forward(config, config.encoder_ffn_dim)

    def forward(self, hidden_states: torch.Tensor, layout: AttentionLayout, **outputs: bool):
        """hidden_states (b, s, d) -> hidden_states, attention weights or None, z (b, s) or None (`outputs`: the
        attention's `output_attentions`, `output_granularities`)."""
        attn_output, attn_weights, z = self.self_attn(hidden_states, layout, **outputs)
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        return self.feed_forward(hidden_states), attn_weights, z


class CDNPGDecoderLayer(CDNPGLayer):
    """Eq. 10, post-LayerNorm: causal GA-self-attention, GA-cross-attention over the encoder, feed-forward."""

    def __init__(self, config: CDNPGConfig, layer_idx: int):
        super().__init__()
        eps, heads = config.layer_norm_eps, config.decoder_attention_heads
        ga = config.granularity_mask != "none"
        cross_kind = "resonance" if config.cross_attention_granularity and ga else "none"
        self.self_attn = CDNPGAttention(config, heads, layer_idx, config.granularity_mask)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=eps)
        self.encoder_attn = CDNPGAttention(config, heads, layer_idx, cross_kind, is_cross_attention=True)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=eps)
        self.add_feed_forward(config, config.decoder_ffn_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        self_layout: AttentionLayout,
        cross_layout: AttentionLayout,
        cache: GranularityCache | EncoderDecoderCache | None = None,
        **outputs: bool,
    ):
        attn_output, self_weights, self_z = self.self_attn(hidden_states, self_layout, cache=cache, **outputs)
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        attn_output, cross_weights, cross_z = self.encoder_attn(
            hidden_states, cross_layout, key_value_states=encoder_hidden_states, cache=cache, **outputs
        )
        hidden_states = self.encoder_attn_layer_norm(hidden_states + self.dropout(attn_output))
        return self.feed_forward(hidden_states), self_weights, cross_weights, self_z, cross_z


@dataclass
class CDNPGEncoderOutput(BaseModelOutput):
    """`granularities`: z (b, s) of every layer's self-attention (`output_granularities=True`); `source_ids` (b, s),
    with a copy mechanism: the ids its probabilities go on, carried with the encoder states through `generate()`."""

    granularities: tuple[torch.FloatTensor, ...] | None = None
    source_ids: torch.LongTensor | None = None


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


class CDNPGModelKwargs(TransformersKwargs, total=False):
    """The arguments of `CDNPGModel.forward` that `CDNPGForConditionalGeneration.forward` passes on as given
    (transformers reads the output flags it may pass from this TypedDict)."""

    decoder_input_ids: torch.LongTensor | None
    decoder_attention_mask: torch.Tensor | None
    cache: EncoderDecoderCache | None
    decoder_inputs_embeds: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    use_cache: bool | None
    output_granularities: bool | None


class CDNPGPreTrainedModel(Transformers457Methods, PreTrainedModel):
    config_class = CDNPGConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CDNPGEncoderLayer", "CDNPGDecoderLayer"]
    _skip_keys_device_placement = [CACHE_NAME]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False  # the granularity term is an additive mask, which flash attention does not take
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def set_attn_implementation(self, attn_implementation: str | dict, *args, **kwargs) -> None:
        """`PreTrainedModel.set_attn_implementation`, refusing backends that would drop the granularity term."""
        chosen = attn_implementation.values() if isinstance(attn_implementation, dict) else [attn_implementation]
        for implementation in chosen:
            check_attention_backend(implementation)
        super().set_attn_implementation(attn_implementation, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, naming a truncated or corrupt weights file (every loader passes here;
        transformers' own SafetensorError names no file)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(
                f"The weights file (model.safetensors) of {str(pretrained_model_name_or_path)!r} is truncated or "
                f"corrupt ({error}); save or download the checkpoint again."
            ) from error

    # `_init_weights` is PreTrainedModel's: Normal(0, initializer_range) weights, zero biases, unit LayerNorms.


class CDNPGStack(CDNPGPreTrainedModel):
    """What the encoder and the decoder share: token plus learned position embeddings (eq. 3; for BART and BERT
    checkpoints `scale_embedding`, `layernorm_embedding`, `position_offset`), then the layers in turn."""

    is_decoder = False  # the decoder's layers are causal, cached and cross-attend

    def __init__(self, config: CDNPGConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = nn.Embedding(config.max_position_embeddings + config.position_offset, config.d_model)
        self.layernorm_embedding = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.layernorm_embedding else None
        )
        self.dropout = nn.Dropout(config.dropout)
        layer_class = CDNPGDecoderLayer if self.is_decoder else CDNPGEncoderLayer
        num_layers = config.decoder_layers if self.is_decoder else config.encoder_layers
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def output_flags(self, attentions: bool | None, hidden_states: bool | None) -> tuple[bool, bool]:
        """`output_attentions` and `output_hidden_states` of the call, or the config's where it leaves them out."""
        return (
            self.config.output_attentions if attentions is None else attentions,
            self.config.output_hidden_states if hidden_states is None else hidden_states,
        )

    def embed(
        self,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        past_length: int | torch.Tensor = 0,
        capacity: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token (scaled when `scale_embedding`) plus position embeddings (b, i, d), and the positions (i,) from
        `past_length` on, checked against the table from Python ints (a static cache's `capacity`), never a tensor."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of input_ids or inputs_embeds to the {type(self).__name__}.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
            if self.embed_scale != 1.0:  # a multiplication by 1 would still launch a kernel, forward and backward
                inputs_embeds = inputs_embeds * self.embed_scale
        if isinstance(past_length, torch.Tensor):  # a static cache's length: never read on the host
            positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        else:  # one kernel, where adding an int would launch a second
            positions = torch.arange(past_length, past_length + inputs_embeds.shape[1], device=inputs_embeds.device)
        end = capacity if isinstance(past_length, torch.Tensor) else past_length + inputs_embeds.shape[1]
        if end is not None and end > self.config.max_position_embeddings:
            raise ValueError(
                f"The {type(self).__name__.removeprefix('CDNPG').lower()} input reaches position {end - 1}, but the "
                f"model has max_position_embeddings={self.config.max_position_embeddings}: truncate it (the "
                "paper truncates sentences to 20 tokens)."
            )
        table_rows = positions + self.config.position_offset if self.config.position_offset else positions
        hidden_states = inputs_embeds + self.embed_positions(table_rows)
        if self.layernorm_embedding is not None:
            hidden_states = self.layernorm_embedding(hidden_states)
        return self.dropout(hidden_states), positions

    def run_layers(
        self, hidden_states: torch.Tensor, *args, output_hidden_states: bool, **kwargs
    ) -> tuple[torch.Tensor, tuple | None, tuple]:
        """Every layer in turn on the other arguments -> the last hidden states; every layer's input and the last
        hidden states, or None without `output_hidden_states`; each further layer output (weights, z) per layer or
        None."""
        all_hidden, per_layer = [hidden_states], []
        for layer in self.layers:
            hidden_states, *extras = layer(hidden_states, *args, **kwargs)
            all_hidden.append(hidden_states)
            per_layer.append(extras)
        extras = tuple(None if outputs[0] is None else outputs for outputs in zip(*per_layer))
        return hidden_states, tuple(all_hidden) if output_hidden_states else None, extras


class CDNPGEncoder(CDNPGStack):
    """Eq. 3 stacked `encoder_layers` times over token + learned position embeddings."""

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        output_granularities: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> tuple | CDNPGEncoderOutput:
        """The encoder states (b, s, d) of the source (b, s); no **kwargs, which would make `generate()` pass every
        model kwarg (`labels` too).

        token_type_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): accepted because
            BERT tokenizers return them; all 0 (C-DNPG has no segment embeddings: one sentence per input).
        output_granularities (`bool`, *optional*): also return z (eq. 4) of every layer."""
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError(
                "token_type_ids: C-DNPG has no segment embeddings, so every token must be in segment 0; encode one "
                "sentence per input (no text pairs)."
            )
        hidden_states, positions = self.embed(input_ids, inputs_embeds)
        key_padding = attention_mask.bool() if attention_mask is not None else None  # no mask: SDPA gets none
        layout = AttentionLayout(key_padding, positions, hidden_states.shape[1], causal=False)
        hidden_states, all_hidden, (attentions, z) = self.run_layers(
            hidden_states,
            layout,
            output_attentions=output_attentions,
            output_granularities=bool(output_granularities),
            output_hidden_states=output_hidden_states,
        )
        source_ids = input_ids if self.config.copy_mechanism is not None else None
        return CDNPGEncoderOutput(hidden_states, all_hidden, attentions, granularities=z, source_ids=source_ids)


class CDNPGDecoder(CDNPGStack):
    """Eq. 10 stacked `decoder_layers` times; incremental with any `EncoderDecoderCache` (dynamic or static)."""

    is_decoder = True

    @forward_with_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_granularities: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> tuple | CDNPGDecoderOutput:
        r"""
        attention_mask (`torch.Tensor` of shape `(batch_size, target_length)`, *optional*): 1 for real decoder
            tokens, covering the cached and the new positions.
        cache (`EncoderDecoderCache`, *optional*): a cache to extend (also taken as `past_key_values`); an empty
            transformers cache (dynamic or static) is wrapped into a `GranularityCache`, which the output returns."""
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        if self.gradient_checkpointing and self.training:
            use_cache = False  # a cache written inside recomputed layers would be written twice
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise TypeError(
                f"{CACHE_NAME} must be an EncoderDecoderCache (not a legacy tuple), got {type(cache).__name__}"
            )
        if cache is not None and self.config.granularity_mask != "none" and not isinstance(cache, GranularityCache):
            cache = GranularityCache.wrap(cache)

        # a dynamic cache's length is an int; a static cache's a tensor, which is never read on the host
        past_length = cache.get_seq_length() if cache is not None else 0
        capacity = cache_capacity(cache) if cache is not None else None
        hidden_states, query_positions = self.embed(input_ids, inputs_embeds, past_length, capacity)
        num_queries = hidden_states.shape[1]

        # keys: the cached and new tokens, or every slot of a preallocated (static) cache, later ones masked as future
        key_length = capacity if capacity is not None else past_length + num_queries
        key_padding = None
        if attention_mask is not None:
            # the static cache's lower bound would read its length: only its capacity is checked
            needed = past_length + num_queries if capacity is None else num_queries
            if not needed <= attention_mask.shape[-1] <= key_length:
                raise ValueError(
                    f"decoder_attention_mask covers {attention_mask.shape[-1]} positions: it must cover every cached "
                    f"one and the {num_queries} new ones, at most {key_length}"
                )
            key_padding = F.pad(attention_mask.bool(), (0, key_length - attention_mask.shape[-1]), value=True)
        # N of eq. 8 for query i is i + 1 (as cached); plain SDPA over new tokens alone takes `is_causal`
        sdpa = self.config._attn_implementation == "sdpa" and self.config.granularity_mask == "none"
        is_causal = sdpa and not output_attentions and key_padding is None and capacity is None and past_length == 0
        self_layout = AttentionLayout(key_padding, query_positions, key_length, causal=True, takes_is_causal=is_causal)
        source_padding = encoder_attention_mask.bool() if encoder_attention_mask is not None else None
        cross_layout = AttentionLayout(source_padding, query_positions, encoder_hidden_states.shape[1], causal=False)

        hidden_states, all_hidden, (self_attentions, cross_attentions, self_z, cross_z) = self.run_layers(
            hidden_states,
            encoder_hidden_states,
            self_layout,
            cross_layout,
            cache=cache,
            output_attentions=output_attentions,
            output_granularities=bool(output_granularities),
            output_hidden_states=output_hidden_states,
        )
        return CDNPGDecoderOutput(
            last_hidden_state=hidden_states,
            **{CACHE_NAME: cache if use_cache else None},
            hidden_states=all_hidden,
            attentions=self_attentions,
            cross_attentions=cross_attentions,
            granularities=self_z,
            cross_granularities=cross_z,
        )


class CDNPGModel(CDNPGPreTrainedModel):
    """The bare encoder-decoder, returning the decoder's last hidden states."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: CDNPGConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = CDNPGEncoder(config)
        self.decoder = CDNPGDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    @forward_with_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: CDNPGEncoderOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_granularities: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple | CDNPGModelOutput:
        """The decoder states (b, t, d) given the source (or its `encoder_outputs`) and the decoder inputs.

        cache (`EncoderDecoderCache`, *optional*): see `CDNPGDecoder.forward` (also taken as `past_key_values`).
        token_type_ids: see `CDNPGEncoder.forward`; ignored when `encoder_outputs` are given.
        output_granularities (`bool`, *optional*): return z (eq. 4) of every layer, e.g. to draw the paper's Figure 2.
        kwargs: `output_attentions` and `output_hidden_states` (passed to both stacks), and what transformers passes
            every model (`PASSED_TO_EVERY_MODEL`); any other is refused (`refuse_unused`)."""
        refuse_unused(kwargs, "CDNPGModel.forward")
        flags = {name: kwargs.get(name) for name in ("output_attentions", "output_hidden_states")}
        if attention_mask is not None:  # converted once for both stacks
            attention_mask = attention_mask.bool()
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids,
                attention_mask,
                output_granularities=output_granularities,
                inputs_embeds=inputs_embeds,
                token_type_ids=token_type_ids,
                return_dict=True,  # whatever config.return_dict says: the fields are read below
                **flags,
            )
        elif not isinstance(encoder_outputs, CDNPGEncoderOutput):
            encoder_outputs = CDNPGEncoderOutput(*encoder_outputs)

        decoder_outputs = self.decoder(
            decoder_input_ids,
            decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache if use_cache is not None else self.config.use_cache,
            output_granularities=output_granularities,
            return_dict=True,
            **flags,
        )
        return CDNPGModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
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


def refuse_unused(kwargs: dict, forward: str) -> None:
    """An argument the model does not use is an error, not something to drop: when transformers renames an argument
    (5.24 renamed `past_key_values` to `cache`), decoding must fail, not run silently without it."""
    unused = sorted(set(kwargs) - PASSED_TO_EVERY_MODEL)
    if unused:
        raise TypeError(
            f"{forward}() got argument(s) C-DNPG does not use: {', '.join(unused)} (transformers "
            f"{transformers.__version__}). If transformers passed them, this model's code predates that version: "
            "update the checkpoint's modeling_cdnpg.py (docs/compatibility.md)."
        )


class CDNPGPredictionHeadTransform(nn.Module):
    """BERT's masked-LM prediction head before the output projection (`lm_head_transform`): dense d -> d, the
    activation, LayerNorm. A warm start from a BERT-family encoder needs it (docs/warm_start.md)."""

    def __init__(self, config: CDNPGConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.activation_fn(self.dense(hidden_states)))


class CDNPGForConditionalGeneration(CDNPGPreTrainedModel, GenerationMixin):
    """C-DNPG with a language-modelling head (tied to the shared embedding by default): a paraphrase generator."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: CDNPGConfig):
        super().__init__(config)
        self.model = CDNPGModel(config)
        # with `lm_head_transform`, BERT's masked-LM head: the transform, the tied projection and a vocabulary bias
        self.lm_head_transform = CDNPGPredictionHeadTransform(config) if config.lm_head_transform else None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_transform)
        self.copy_mechanism = CopyMechanism(config) if config.copy_mechanism is not None else None
        # token t of `labels` is predicted at decoder position t (the decoder inputs are shifted, the labels not)
        self.loss_type = "ForMaskedLM"
        self.post_init()
        # the paper's decoding (Section 4.2): beam 8, at most 20 tokens; a checkpoint's generation_config.json wins
        self.generation_config.num_beams = 8
        self.generation_config.max_new_tokens = 20

    @forward_with_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        encoder_outputs: CDNPGEncoderOutput | tuple | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[CDNPGModelKwargs],
    ) -> tuple | CDNPGSeq2SeqLMOutput:
        """Logits (b, t, V) of the next token at each decoder position, and the loss given `labels`.

        encoder_outputs, inputs_embeds: see `CDNPGModel.forward` (named: `generate()` looks for them by name).
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, -100 where ignored; the
            decoder inputs are derived from them when not given.
        num_items_in_batch: the target tokens of the whole (accumulated, all-process) batch, as `Trainer` passes it:
            the loss is the token sum divided by it.
        kwargs: the other arguments of `CDNPGModel.forward` (`CDNPGModelKwargs`), keyword-only, passed on as given."""
        if labels is not None:
            kwargs["use_cache"] = False
            if kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
                kwargs["decoder_input_ids"] = self.prepare_decoder_input_ids_from_labels(labels)
        asked_for_z = kwargs.get("output_granularities")
        if self.config.copy_mechanism == "granularity":
            kwargs["output_granularities"] = True  # ρ_t is z of the last cross-attention's queries
        outputs = self.model(
            input_ids,
            attention_mask,
            encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        positions = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        decoder_states = outputs.last_hidden_state[:, positions]
        hidden_states = (
            self.lm_head_transform(decoder_states) if self.lm_head_transform is not None else decoder_states
        )
        logits, nll = self.lm_head(hidden_states), None
        if self.copy_mechanism is not None:
            source_ids = input_ids if input_ids is not None else getattr(encoder_outputs, "source_ids", None)
            logits, nll = self.copy(logits, decoder_states, outputs, source_ids, attention_mask, positions, labels)

        loss = None
        if labels is not None:
            if num_items_in_batch is None:  # the mean over real target tokens; 0, not NaN, when there are none
                num_items_in_batch = (labels != -100).sum().clamp(min=1)
            if nll is not None:  # the copy mechanism's NLL, read at the labels from its log-probabilities
                loss = nll / num_items_in_batch
            else:
                loss = self.loss_function(logits, labels.contiguous(), self.config.vocab_size, num_items_in_batch)

        # everything the bare model returns but its last hidden state, which the logits replace
        left_out = {"last_hidden_state"}
        if self.config.copy_mechanism == "granularity" and not asked_for_z:  # z computed for the gate alone
            left_out |= {"encoder_granularities", "decoder_granularities", "cross_granularities"}
        model_outputs = {name: value for name, value in outputs.items() if name not in left_out}
        return CDNPGSeq2SeqLMOutput(loss=loss, logits=logits, **model_outputs)

    def copy(self, logits, decoder_states, outputs, source_ids, attention_mask, positions, labels=None):
        """`CopyMechanism` on the model's outputs: the granularity gate reads the logits W_G h (b, j) of the source as
        the last cross-attention sees them (from the cache once stored there) and z of its queries (b, i)."""
        if source_ids is None:
            raise ValueError(
                "copy_mechanism: the copy distribution is put on the source token ids: pass input_ids, or "
                "encoder_outputs as this model's encoder returns them (with source_ids), not a tuple or embeddings"
            )
        encoder_states, cache = outputs.encoder_last_hidden_state, getattr(outputs, CACHE_NAME, None)
        mask = attention_mask if attention_mask is not None else torch.ones_like(source_ids)
        logits_source = z_target = None
        if self.config.copy_mechanism == "granularity":
            attention = self.model.decoder.layers[-1].encoder_attn
            if isinstance(cache, GranularityCache) and cache.is_updated.get(attention.layer_idx):
                logits_source = cache.cross_granularity_logits(attention.layer_idx)
            else:
                logits_source = attention.granularity_head(encoder_states)
            z_target = outputs.cross_granularities[-1][:, positions]
        return self.copy_mechanism(
            logits, decoder_states, encoder_states, source_ids, mask, logits_source, z_target, labels=labels
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by `DataCollatorForSeq2Seq` to build decoder inputs in the collator."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def create_masks_for_generate(self, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
        """With a static cache, `generate()` turns the decoder's 2-D padding mask into the 4-D mask of its attention
        backend. C-DNPG builds its own additive mask (padding plus the granularity term) from the 2-D one: keep it."""
        return attention_mask

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, refusing first the arguments of granularity-aware paraphrasing (which
        generate() does not take) with where they belong, and a number of sequences below one."""
        misplaced = sorted(PARAPHRASE_ARGUMENTS & set(kwargs))
        if misplaced:
            raise TypeError(
                f"generate() takes no {', '.join(misplaced)}: granularity-aware paraphrasing is "
                "generation_cdnpg.paraphrase(model, tokenizer, inputs, novelty=..., keep_details=...) for ranked "
                "candidates, or model.generate(**inputs, logits_processor=generation_cdnpg.granularity_processors("
                "model, tokenizer, inputs, novelty=..., keep_details=...)) (docs/novelty.md)"
            )
        wanted = kwargs.get("num_return_sequences")
        if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1):
            raise ValueError(f"num_return_sequences must be a positive integer (sequences per input), got {wanted!r}")
        return super().generate(*args, **kwargs)


__all__ = ["CDNPGDecoder", "CDNPGEncoder", "CDNPGForConditionalGeneration", "CDNPGModel", "CDNPGPreTrainedModel",
           "GranularityCache", "GranularityHead", "granularity_mask", "resonance_mask", "scope_mask"]  # fmt: skip
