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
  code's renormalised product), so that any attention backend that takes an additive mask runs GA-attention (eager,
  SDPA, flex attention, through transformers' attention interface). The literal eq. 9 ("multiply" mode) runs eager.
- Decoding is incremental with transformers' caches (dynamic or static): keys and values keep the standard layout,
  z of the cached decoder tokens is kept beside them in a `GranularityCache`, and so is z of the encoder states (the
  cross-attention keys), computed at the first step. The cache is the argument and output field `cache` on
  transformers >= 5.24 and `past_key_values` before (`CACHE_NAME`); both are taken.
- A keyword argument the model does not use is an error (`refuse_unused`), never dropped: a renamed argument of a
  later transformers fails loudly instead of decoding without it.

Eqs. 6-9 and the log bias run as one autograd node per attention module (`GranularityBias`), whose gradient with
respect to z is written out: a fraction of the kernels autograd runs through the elementwise formula. The paper-named
functions (`resonance_mask`, `scope_mask`, `granularity_mask`) are its specification, which the tests compare it to in
value and gradient, and what flex attention and the literal eq. 9 run. A training step or a cached decoding step
reads no tensor on the host (a sync on a GPU); only `token_type_ids`, when given, are checked for segment 1.

Shape legend: b batch, h heads, i query positions, j key positions, d model width.
Supported: transformers 4.57.x and 5.x. This file is copied into every saved checkpoint (remote code), so it imports
only torch, transformers (and safetensors, which transformers requires) and its sibling configuration file.
"""

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
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

if TYPE_CHECKING:  # never imported here, but transformers copies a model's relative imports with its remote code
    from .generation_cdnpg import paraphrase  # noqa: F401  (4.57 copies only a model file's direct imports)
    from .pipeline_cdnpg import CDNPGText2TextPipeline  # noqa: F401

logger = logging.get_logger(__name__)

COMPILED_VARIANTS = 64  # variants each function of `compiled_alone` may compile, past dynamo's default of 8
MASK_FLOOR = 1e-32  # smallest mask value before the log (released code): log(1e-32) ≈ -73.7, i.e. weight ~ 0
# SDPA's fused kernels that take an additive mask (memory-efficient, cuDNN) need a head_dim that is a multiple of 8 in
# bf16/fp16 (4 in fp32); the paper's is 450 / 9 = 50, which left GA on SDPA's unfused math path (issue 39). On these
# devices the heads are zero-padded to the next multiple (`padded_heads`): on a CPU the padding would only cost.
HEAD_DIM_ALIGNMENT = 8
PADDED_HEAD_DEVICES = frozenset({"cuda"})


# ------------------------------------------------------------------------------------------------------------------
# The transformers version: the cache's name, and what every model's forward is passed
# ------------------------------------------------------------------------------------------------------------------

# transformers 5.24 renamed the cache argument and output field `past_key_values` to `cache` (the old name works, with
# a deprecation warning, until 5.40); 4.57 knows only `past_key_values`. The model returns the cache under the name
# of the version it runs on, and takes it under either.
CACHE_NAME = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
# What transformers passes to a model's forward beyond its named arguments, which C-DNPG reads elsewhere or has no
# use for: the output flags (`CDNPGStack.output_flags`), 4.57 generate()'s `cache_position` (positions come from
# the cache) and the `tokenizer` given to generate() (for stop strings), which 5.24 hands on to the forward.
PASSED_TO_EVERY_MODEL = frozenset({"output_attentions", "output_hidden_states", "cache_position", "tokenizer"})
# The arguments of generation_cdnpg.paraphrase() that generate() refuses by name, pointing there
PARAPHRASE_ARGUMENTS = frozenset(
    {"novelty", "keep_details", "allow_copy", "rank_by", "novelty_z_layer", "novelty_z_inverted"}
)


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """At least float32: the masks and probabilities built from z stay exact under bf16/fp16, and a float64 model
    stays float64 throughout."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


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


# ------------------------------------------------------------------------------------------------------------------
# The paper's concepts: granularity head (eq. 4), resonance mask (eq. 6), scope mask (eq. 8), their combination (eq. 9)
# ------------------------------------------------------------------------------------------------------------------


class GranularityHead(nn.Module):
    """Eq. 4: z = sigmoid(W_G h), one scalar per token; z ≈ 1 phrase-level detail, z ≈ 0 sentence-level template."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 1)  # W_G (with bias)

    def forward(self, hidden_states: torch.Tensor, logits: bool = False) -> torch.Tensor:
        """z (b, t), or with `logits` W_G h before the sigmoid, for a compiled mask that runs the sigmoid itself."""
        # at least fp32 so that the masks built from z stay exact under bf16/fp16 autocast; squeezed before the
        # sigmoid, so that z is a tensor of its own, not a view (FSDP2 warns of a layer that returns a view)
        logit = upcast(self.proj(hidden_states)).squeeze(-1)  # (b, t)
        return logit if logits else torch.sigmoid(logit)


def resonance_mask(z_i: torch.Tensor, z_j: torch.Tensor) -> torch.Tensor:
    """Eq. 6, C_ij, the continuous relaxation of eq. 5 (C_ij = 1 iff z_i = z_j): template tokens (z_i ≈ 0) attend to
    template tokens, detail tokens (z_i ≈ 1) to tokens at least as detailed as themselves.

    Elementwise, as the paper writes it: z_i (b, i, 1) and z_j (b, 1, j) broadcast to C (b, i, j); inside flex
    attention they are the scalars of one query-key pair.
    """
    return (1 - z_i) * (1 - (z_i + z_j)).clamp(min=0) + z_i * (1 - z_i + z_j).clamp(max=1)


def scope_mask(z_i: torch.Tensor, length: torch.Tensor, distance: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Eq. 8, S_ij, the continuous relaxation of eq. 7: a template token (z_i = 0) sees all N visible tokens, a detail
    token (z_i = 1) only its neighbours within epsilon.

    Elementwise: z_i and N (the number of keys query i can see) (b, i, 1), distance |i - j| (i, j) -> S (b, i, j).
    (N - eps) is clamped at the smallest positive float: eq. 8 is undefined for N < eps (every key then lies within
    eps anyway), and the clamp keeps the power's gradient finite.
    """
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


class GranularityBias(torch.autograd.Function):
    """GA-attention's additive mask in one autograd node: log(max(M, 1e-32)) of eqs. 6-9 where a key is visible,
    the dtype's minimum where it is blocked, and its gradient with respect to z written out by hand.

    The values of `granularity_mask` and `attention_bias` (the readable spec, against which the tests check value and
    gradient), in fewer kernels: autograd through the elementwise formula runs about 20 kernels forward and 50
    backward per attention module (issue 39), mostly broadcast reductions, one per term that mixes a (b, i) and a
    (b, i, j) operand. Here the backward reuses the forward's terms and reduces over keys and over queries once
    each. At the kinks it follows torch's convention for clamp: the gradient passes at the bounds.

    z_query (b, i), z_key (b, j) or None for the queries' own z (self-attention without a cache: torch.compile
    traces no Function given the same tensor twice); for the scope mask, base = max(N - eps, tiny) (b, i, 1) and
    offset = |i - j| - eps (i, j) (`AttentionLayout.scope_terms`); blocked (b, 1, i or 1, j) bool or None -> bias
    (b, 1, i, j) in `dtype`.
    """

    @staticmethod
    def forward(ctx, z_query, z_key, kind, base, offset, blocked, dtype):
        ctx.own_keys = z_key is None
        z_i, z_j = z_query[:, :, None], (z_query if z_key is None else z_key)[:, None, :]  # (b, i, 1), (b, 1, j)
        one_minus_z_i = 1 - z_i  # once, for both masks
        below = above = relu_below = min_above = resonance = power = reach = scope = None
        if kind != "scope":  # eq. 6: (1 - z_i) max(0, 1 - z_i - z_j) + z_i min(1, 1 - z_i + z_j)
            below, above = one_minus_z_i - z_j, one_minus_z_i + z_j  # (b, i, j)
            relu_below, min_above = below.clamp(min=0), above.clamp(max=1)
            resonance = torch.addcmul(one_minus_z_i * relu_below, z_i, min_above)
        if kind != "resonance":  # eq. 8: clamp((N - eps)^(1 - z_i) + eps - |i - j|, 0, 1)
            power = base.pow(one_minus_z_i)  # (b, i, 1)
            reach = power - offset  # (b, i, j)
            scope = reach.clamp(0, 1)
        if kind == "product":
            mask = resonance * scope
        elif kind == "mean":
            mask = (resonance + scope).mul_(0.5)
        else:
            mask = resonance if scope is None else scope
        clamped = mask.clamp(min=MASK_FLOOR)
        bias = clamped.log()[:, None].to(dtype)  # (b, 1, i, j)
        if blocked is not None:
            bias = bias.masked_fill_(blocked, torch.finfo(dtype).min)
        ctx.kind = kind
        terms = (below, above, relu_below, min_above, resonance, base, power, reach, scope)
        ctx.save_for_backward(z_i, one_minus_z_i, *terms, mask, clamped, blocked)
        return bias

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_bias):
        z_i, one_minus_z_i, *terms, mask, clamped, blocked = ctx.saved_tensors
        below, above, relu_below, min_above, resonance, base, power, reach, scope = terms
        grad = grad_bias[:, 0].to(mask.dtype)  # (b, i, j)
        if blocked is not None:  # a blocked key's bias is a constant
            grad = grad.masked_fill(blocked[:, 0], 0)
        grad_mask = grad.div(clamped).masked_fill_(mask < MASK_FLOOR, 0)  # d log(max(M, floor)) / dM
        grad_resonance = grad_scope = grad_mask
        if ctx.kind == "product":
            grad_resonance, grad_scope = grad_mask * scope, grad_mask * resonance
        elif ctx.kind == "mean":
            grad_resonance = grad_scope = grad_mask * 0.5
        grad_z_query = grad_z_key = None
        if resonance is not None:
            # dC/dz_j = z_i [above <= 1] - (1 - z_i) [below >= 0]
            # dC/dz_i = min(1, above) - max(0, below) - (1 - z_i) [below >= 0] - z_i [above <= 1]
            through_below = grad_resonance * (below >= 0) * one_minus_z_i
            through_above = grad_resonance * (above <= 1) * z_i
            grad_z_key = (through_above - through_below).sum(1)  # (b, j)
            grad_z_query = (grad_resonance * (min_above - relu_below) - through_below - through_above).sum(2)
        if scope is not None:  # dS/dz_i = -(N - eps)^(1 - z_i) log(N - eps) where 0 <= reach <= 1
            inside = (grad_scope * (reach == scope)).sum(2, keepdim=True)  # (b, i, 1)
            grad_scope_z = (inside * torch.xlogy(power, base)).squeeze(2).neg_()
            grad_z_query = grad_scope_z if grad_z_query is None else grad_z_query + grad_scope_z
        if ctx.own_keys and grad_z_key is not None:  # z_i and z_j are the same tokens' z
            grad_z_query, grad_z_key = grad_z_query + grad_z_key, None
        return grad_z_query, grad_z_key, None, None, None, None, None


# ------------------------------------------------------------------------------------------------------------------
# Attention: which keys each query sees, the additive mask, and the attention functions
# ------------------------------------------------------------------------------------------------------------------


def visible_keys(
    key_padding: torch.Tensor | None, query_positions: torch.Tensor, causal: bool, key_count: int
) -> torch.Tensor:
    """N of eq. 8 (b, i) float: the number of keys query i sees, the real keys (key_padding (b, j) True) at positions
    up to its own (`causal`) or at any of the `key_count`. key_padding None: every key is real, N (1, i)."""
    last = query_positions if causal else torch.full_like(query_positions, key_count - 1)
    if key_padding is None:  # the keys at positions 0 .. last
        return (last + 1).float()[None]
    visible_so_far = key_padding.long().cumsum(-1)  # (b, j): real keys at positions <= j
    return visible_so_far[:, last].float()


def blocked_keys(
    key_padding: torch.Tensor | None, query_positions: torch.Tensor, causal: bool, key_count: int
) -> torch.Tensor | None:
    """(b or 1, 1, i or 1, j) bool, True where a query may not see a key: padding (`key_padding`, b, j, True for real
    tokens; None: none is padding) and, when `causal`, keys after the query's position; None where every key is
    visible. One rule for `AttentionLayout.blocked` and the compiled masks, which apply it inside their kernel."""
    blocked = ~key_padding[:, None, None, :] if key_padding is not None else None  # (b, 1, 1, j)
    if causal:
        key_positions = torch.arange(key_count, device=query_positions.device)
        future = (key_positions > query_positions[:, None])[None, None]  # (1, 1, i, j)
        blocked = future if blocked is None else blocked | future  # (b, 1, i, j)
    return blocked


def key_distance(query_positions: torch.Tensor, key_count: int) -> torch.Tensor:
    """|i - j| (i, j) float of eq. 8, between the queries' positions and those of the keys, 0 .. key_count - 1."""
    return (query_positions[:, None] - torch.arange(key_count, device=query_positions.device)).abs().float()


@dataclass
class AttentionLayout:
    """Which keys each query may see, computed once per stack and shared by its layers, with what the masks of all
    its attention modules share (built on first use, once per stack).

    key_padding: (b, j) bool, True for real tokens. query_positions: (i,) the queries' positions in the sequence,
    where new keys and z are written in a cache. causal: query i sees keys at positions <= its own. scoped: the
    layout of a self-attention, which has N and distances for the scope mask (`length`, `distance`). padded: some
    keys may be padding (False: the caller passed no mask). dense: the masks are built as tensors (`blocked`), which
    flex attention, applying the rules per query-key pair inside its kernel, does without. plain_causal: nothing but
    causality blocks a key (no padding, no cache), which SDPA takes as `is_causal` instead of a mask.
    """

    key_padding: torch.Tensor
    query_positions: torch.Tensor
    causal: bool
    scoped: bool = True
    padded: bool = True
    dense: bool = True
    plain_causal: bool = False
    shared: dict | None = None  # what the properties below build on first use, once per stack (a new dict if None)

    def __post_init__(self) -> None:
        if self.shared is None:
            self.shared = {}

    @classmethod
    def build(
        cls,
        key_padding: torch.Tensor,
        query_positions: torch.Tensor,
        causal: bool,
        materialize: bool = True,
        padded: bool = True,
        plain_causal: bool = False,
        shared: dict | None = None,
    ) -> "AttentionLayout":
        """`padded=False`: the caller passed no padding mask (key_padding is all True), so only causality blocks.
        `shared`: what this layout builds is kept there (see `cross`)."""
        plain_causal = causal and plain_causal and not padded
        flags = {"padded": padded, "dense": materialize, "plain_causal": plain_causal}
        return cls(key_padding, query_positions, causal, **flags, shared=shared)

    @classmethod
    def cross(
        cls,
        encoder_padding: torch.Tensor,
        query_positions: torch.Tensor,
        materialize: bool = True,
        padded: bool = True,
        shared: dict | None = None,
    ) -> "AttentionLayout":
        """Decoder queries over encoder keys: every real encoder token is visible; no scope, so no N or distance.
        `shared`: the `shared` of the encoder's layout over the same padding, whose blocked keys and padding bias
        are then this layout's too (neither depends on the queries without causality; N, distances and scope terms,
        which do, a cross-attention never reads): built once per forward instead of once per stack."""
        flags = {"scoped": False, "padded": padded, "dense": materialize}
        return cls(encoder_padding, query_positions, causal=False, **flags, shared=shared)

    @property
    def blocked(self) -> torch.Tensor | None:
        """(b, 1, i or 1, j) bool, True where a query may not see a key; None where every key is visible."""
        if "blocked" not in self.shared:
            key_padding = self.key_padding if self.padded else None
            key_count = self.key_padding.shape[-1]
            self.shared["blocked"] = blocked_keys(key_padding, self.query_positions, self.causal, key_count)
        return self.shared["blocked"]

    @property
    def length(self) -> torch.Tensor | None:
        """N of eq. 8 (b, i) float, the number of keys query i sees; None for cross-attention (no scope mask).
        Computed on first use: the resonance mask and plain attention have no use for it."""
        if not self.scoped:
            return None
        if "length" not in self.shared:
            batch_size, key_count = self.key_padding.shape
            key_padding = self.key_padding if self.padded else None
            length = visible_keys(key_padding, self.query_positions, self.causal, key_count)
            self.shared["length"] = length.expand(batch_size, -1)
        return self.shared["length"]

    @property
    def distance(self) -> torch.Tensor | None:
        """|i - j| (i, j) float, for the scope mask; None for cross-attention. Computed on first use."""
        if not self.scoped:
            return None
        if "distance" not in self.shared:
            self.shared["distance"] = key_distance(self.query_positions, self.key_padding.shape[-1])
        return self.shared["distance"]

    def padding_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The additive mask of plain attention (b, 1, i or 1, j): 0 where a key is visible, the dtype's minimum where
        not; None where every key is. The minimum (not -inf) keeps a fully masked row finite: it attends uniformly
        instead of producing NaN. Built once per stack and dtype; without causality from the padding itself, not from
        `blocked`, its negation: a kernel fewer per stack (issue 39)."""
        if not (self.padded or self.causal):
            return None
        if ("bias", dtype) not in self.shared:
            minimum, device = torch.finfo(dtype).min, self.key_padding.device
            if self.causal:
                bias = torch.zeros(self.blocked.shape, dtype=dtype, device=device).masked_fill_(self.blocked, minimum)
            else:
                visible = self.key_padding[:, None, None, :]
                bias = torch.full(visible.shape, minimum, dtype=dtype, device=device).masked_fill_(visible, 0.0)
            self.shared["bias", dtype] = bias
        return self.shared["bias", dtype]

    def scope_terms(self, epsilon: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What eq. 8 takes from the layout, once per stack: max(N - eps, tiny) (b, i, 1), clamped at the smallest
        positive float (eq. 8 is undefined for N < eps, where every key lies within eps anyway, and the clamp keeps
        the power's gradient finite), and |i - j| - eps (i, j)."""
        if ("scope", epsilon, dtype) not in self.shared:
            base = (self.length[:, :, None].to(dtype) - epsilon).clamp(min=torch.finfo(torch.float32).tiny)
            self.shared["scope", epsilon, dtype] = base, self.distance.to(dtype) - epsilon
        return self.shared["scope", epsilon, dtype]


def granularity_bias(
    kind: str,
    z_i: torch.Tensor,
    z_j: torch.Tensor,
    length: torch.Tensor | None,
    distance: torch.Tensor | None,
    epsilon: float,
    blocked: torch.Tensor | None,
    dtype: torch.dtype,
    logits: bool = False,
) -> torch.Tensor:
    """GA-attention's additive mask as the paper writes it, through autograd: log(max(M, 1e-32)) (b, 1, i, j) of
    `granularity_mask` where a key is visible, the dtype's minimum where it is blocked. `GranularityBias` computes
    the same in fewer aten kernels; `compiled_alone` compiles this function into one generated kernel
    forward and about one backward. With `logits`, z_i and z_j are W_G h and eq. 4's sigmoid runs here: compiled,
    in the mask's own kernel instead of one of its own per module."""
    if logits:
        z_i, z_j = torch.sigmoid(z_i), torch.sigmoid(z_j)
    bias = granularity_mask(kind, z_i, z_j, length, distance, epsilon).clamp(min=MASK_FLOOR).log()[:, None]
    bias = bias.to(dtype)
    return bias if blocked is None else bias.masked_fill(blocked, torch.finfo(dtype).min)


def granularity_bias_in_layout(
    kind: str,
    z_query: torch.Tensor,
    z_key: torch.Tensor,
    length: torch.Tensor | None,
    query_positions: torch.Tensor,
    causal: bool,
    epsilon: float,
    key_padding: torch.Tensor | None,
    dtype: torch.dtype,
    logits: bool = False,
) -> torch.Tensor:
    """`granularity_bias` of z_query (b, i) and z_key (b, j) with the blocked keys (`blocked_keys`, from the padding
    (b, j) or None and causality) and |i - j| of eq. 8 (`key_distance`) computed here, and N (b, i) too where it is
    None, which says that every key is real (`visible_keys`): compiled, they are built inside the mask's kernel
    instead of by up to eight kernels of their own per stack (N of padded keys, a cumulative sum, is given: computed
    once per stack, not in every module's kernel). The resonance mask reads neither N nor |i - j|."""
    key_count = z_key.shape[-1]
    distance = None
    if kind != "resonance":
        length = length if length is not None else visible_keys(None, query_positions, causal, key_count)
        length = length[:, :, None].to(z_query.dtype)
        distance = key_distance(query_positions, key_count).to(z_query.dtype)
    blocked = blocked_keys(key_padding, query_positions, causal, key_count)
    z_i, z_j = z_query[:, :, None], z_key[:, None, :]
    return granularity_bias(kind, z_i, z_j, length, distance, epsilon, blocked, dtype, logits)


@functools.cache
def compiled_alone(function: Callable) -> Callable:
    """`function` compiled on its own, once per process, for an eager model (`config.compile_granularity_masks`):
    inductor fuses its elementwise formula into about one kernel forward and one backward (Triton on CUDA, C++ on
    CPU), where aten launches one per op (issue 39). `granularity_bias_in_layout`, `copy_attention` and
    `copy_distribution` run so.

    Dynamic shapes: a new length compiles nothing; a new mask kind, dtype, grad mode or blocking does, once, and so
    does a size of 1, which dynamo specialises (one query per decoding step, one source, one key). One model needs
    about a dozen variants of the masks (17 for training, beam, greedy and uncached decoding), past dynamo's default
    limit of 8, beyond which it would run the unfused formula. So each such function may compile `COMPILED_VARIANTS`:
    torch.compile's own `recompile_limit` where torch has it (2.13), which applies the limit while compiling only;
    on older torch the limit is patched around each call (about 30-60 us a call). Never the process's limit: that
    would change how every other compiled function in the process falls back to eager (flex attention's, say)."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return torch.compile(function, dynamic=True, recompile_limit=COMPILED_VARIANTS)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # < 2.7
    patched_limit = torch._dynamo.config.patch({limit: COMPILED_VARIANTS})
    return patched_limit(torch.compile(function, dynamic=True))


def compiled_if(function: Callable, compiled: bool) -> Callable:
    """`function` compiled alone (`compiled_alone`) where `compiled`, else itself; itself inside a compiled model
    too, whose graph then fuses the formula with the rest."""
    return compiled_alone(function) if compiled and not torch.compiler.is_compiling() else function


def attention_bias(
    layout: AttentionLayout,
    dtype: torch.dtype,
    kind: str = "none",
    z_query=None,
    z_key=None,
    epsilon: float = 0.0,
    compiled: bool = False,
    logits: bool = False,
) -> torch.Tensor | None:
    """Additive float mask (b, 1, i, j): log(max(M, 1e-32)) of the granularity mask `kind` (eqs. 6-9) where a key is
    visible, the dtype's minimum where not (`GranularityBias`, or with `compiled` the formula compiled alone); the
    padding bias alone for `kind="none"`. With `logits`, z_query and z_key are eq. 4's W_G h, before the sigmoid."""
    if kind == "none":
        return layout.padding_bias(dtype)
    if compiled:  # inside a compiled model, the formula itself: the model's graph fuses it
        build = compiled_if(granularity_bias_in_layout, compiled)
        length = layout.length if kind != "resonance" and layout.padded else None
        positions = layout.query_positions
        padding = layout.key_padding if layout.padded else None
        return build(kind, z_query, z_key, length, positions, layout.causal, epsilon, padding, dtype, logits)
    base = offset = None
    if kind != "resonance":
        base, offset = layout.scope_terms(epsilon, z_query.dtype)
    own_keys = z_key is z_query  # passed once (see `GranularityBias`)
    if logits:
        z_query = torch.sigmoid(z_query)
        z_key = z_query if own_keys else torch.sigmoid(z_key)
    return GranularityBias.apply(z_query, None if own_keys else z_key, kind, base, offset, layout.blocked, dtype)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    multiplier: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention with transformers' attention-function signature, and the only path for the literal eq. 9:
    `multiplier` (b, i, j) scales the softmax output without renormalising it.

    query (b, h, i, d), key/value (b, h, j, d), attention_mask (b, 1, i, j) -> output (b, i, h, d), weights (b, h, i, j).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(upcast(scores), dim=-1)
    if multiplier is not None:  # GA, eq. 9: Ã = A ⊙ M
        weights = weights * multiplier[:, None]
    weights = F.dropout(weights.to(query.dtype), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def padded_heads(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query, key, value (b, h, t, d) with d zero-padded to a multiple of `HEAD_DIM_ALIGNMENT`, so that SDPA may
    choose its memory-efficient kernel, which takes GA's bias and returns its gradient. Nothing changes but the
    shapes: the zeros add nothing to q . k (the scale is passed, 1 / sqrt(d), not the padded size's), and the
    output's padded columns are weights times zero values, sliced off by the caller."""
    pad = -query.shape[-1] % HEAD_DIM_ALIGNMENT
    return tuple(F.pad(states, (0, pad)) for states in (query, key, value))


def check_attention_backend(implementation: str) -> None:
    """Refuse a backend that takes no additive mask: running it would silently drop the granularity term."""
    if "flash" in implementation or implementation.startswith("paged"):
        raise ValueError(
            f"attn_implementation={implementation!r} cannot run C-DNPG: GA-attention adds the granularity mask "
            "log M (eq. 9) to the attention logits, and this backend takes no additive mask. Use 'sdpa' (default), "
            "'eager' or 'flex_attention'."
        )


def attention_function(config: CDNPGConfig) -> Callable:
    """The backend `config._attn_implementation` names, from transformers' registry (so that
    `model.set_attn_implementation` switches it at run time)."""
    implementation = config._attn_implementation or "eager"  # None: a module built outside a PreTrainedModel
    check_attention_backend(implementation)
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):  # transformers 5.x
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    return eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]


def masks_in_kernel(config: CDNPGConfig, output_attentions: bool) -> bool:
    """Whether attention masks are left to flex attention's kernel rather than built as (b, 1, i, j) tensors: not
    when the attention weights are returned or eq. 9 is applied literally, which take the reference path."""
    return (
        config._attn_implementation == "flex_attention"
        and not output_attentions
        and config.granularity_mask_mode != "multiply"
    )


def flex_granularity_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: AttentionLayout,
    z_query: torch.Tensor | None,
    z_key: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """GA-attention in flex attention: the granularity mask (eqs. 6-9) and the visibility rules are computed per
    query-key pair inside the kernel from z, N and the positions, so no (b, h, i, j) mask is ever in memory.

    query (b, h, i, d), key/value (b, h, j, d) -> output (b, i, h, d).
    """
    if dropout > 0:
        raise ValueError(
            "flex_attention has no attention dropout: train with 'sdpa' or 'eager', or set attention_dropout=0."
        )
    kind, epsilon = module.mask_kind, module.config.scope_epsilon
    lengths = layout.length if z_query is not None and kind != "resonance" else None  # N of eq. 8, built here

    def score_mod(score, b, h, q, kv):
        visible = layout.key_padding[b, kv]
        if layout.causal:
            visible = visible & (kv <= layout.query_positions[q])
        if z_query is not None:  # GA, eqs. 6-9, for this query-key pair
            length = lengths[b, q] if lengths is not None else None
            distance = (layout.query_positions[q] - kv).abs().float()
            mask = granularity_mask(kind, z_query[b, q], z_key[b, kv], length, distance, epsilon)
            score = score + torch.log(torch.clamp(mask, min=MASK_FLOOR))
        return torch.where(visible, score, torch.finfo(score.dtype).min)

    output = compiled_flex_attention()(query, key, value, score_mod=score_mod, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


@functools.cache
def compiled_flex_attention() -> Callable:
    """torch's flex attention compiled once per process (uncompiled it materialises every score). Shapes are static:
    with dynamic shapes, torch 2.13's CPU kernels fail to build for the scope mask. So every new input shape compiles
    anew, and past torch's recompile limit (`torch._dynamo.config.recompile_limit`) torch falls back to the unfused
    implementation, with a warning: pad inputs to a few fixed lengths when using this backend."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


# ------------------------------------------------------------------------------------------------------------------
# The cache: transformers' key/value layout, plus z of every cached decoder token
# ------------------------------------------------------------------------------------------------------------------


class GranularityCache(EncoderDecoderCache):
    """An `EncoderDecoderCache` that also keeps z (eq. 4) of every cached decoder token, per self-attention layer:
    the resonance and scope masks of a new query need z of all the keys it sees.

    Keys and values stay in transformers' layout, (b, h, t, d_head). z lives in `granularity_cache`, a third cache of
    the same kind as the self-attention cache (a dynamic one that grows, or a static one preallocated to the same
    length), whose keys are z as (b, 1, t, 1) and whose values are empty (b, 1, t, 0) where they can be: z is stored
    once. z of the encoder states, which cross-attention's resonance mask reads at every step, is computed at the
    first step and kept in `cross_granularity_cache`, of the cross-attention cache's kind, as the cross-attention keys
    and values are. With the masks compiled (`config.compile_granularity_masks`) both keep z's logit W_G h instead
    (`CDNPGAttention.granularity`), whose sigmoid the mask's kernel runs. Everything generation does to the cache
    (reorder beams, crop, reset, select or repeat batch rows) is done to z too. The model wraps whatever
    `EncoderDecoderCache` it is given (e.g. the static cache of `generate(cache_implementation="static")`) at the
    first decoding step.
    """

    def __init__(
        self,
        self_attention_cache: Cache,
        cross_attention_cache: Cache,
        granularity_cache: Cache,
        cross_granularity_cache: Cache,
    ):
        super().__init__(self_attention_cache, cross_attention_cache)
        self.granularity_cache = granularity_cache
        self.cross_granularity_cache = cross_granularity_cache

    @classmethod
    def wrap(cls, cache: EncoderDecoderCache) -> "GranularityCache":
        """The same sub-caches plus an empty z cache of their kind; a cache that already holds decoder tokens
        (without their z) cannot be continued."""
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

        granularity_caches = like(cache.self_attention_cache.layers), like(cache.cross_attention_cache.layers)
        return cls(cache.self_attention_cache, cache.cross_attention_cache, *granularity_caches)

    @staticmethod
    def store_granularity(cache: Cache, z: torch.Tensor, layer_idx: int, cache_kwargs: dict | None) -> torch.Tensor:
        """Write z (b, i) (or its logit, see the class) into layer `layer_idx` of `cache` as the key of one head of
        width 1; return what the layer holds (b, j). Its value is empty (width 0): z is stored once; a static layer of
        transformers 4.57 sizes its values as its keys, so it keeps z twice."""
        z = z[:, None, :, None]
        static = layer_idx < len(cache.layers) and isinstance(cache.layers[layer_idx], StaticLayer)
        z_all, _ = cache.update(z, z if static else z[..., :0], layer_idx, cache_kwargs)
        return z_all[:, 0, :, 0]

    def update_granularity(self, z: torch.Tensor, layer_idx: int, cache_kwargs: dict) -> torch.Tensor:
        """Store z (b, i) of new decoder tokens of self-attention layer `layer_idx`; return z of all its keys (b, j)."""
        return self.store_granularity(self.granularity_cache, z, layer_idx, cache_kwargs)

    def update_cross_granularity(self, z: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Store z (b, j) of the encoder states as cross-attention layer `layer_idx` sees them (its first step)."""
        return self.store_granularity(self.cross_granularity_cache, z, layer_idx, None)

    def cross_granularity(self, layer_idx: int) -> torch.Tensor:
        """z (b, j) of the encoder states (or its logit) stored by `update_cross_granularity`."""
        return self.cross_granularity_cache.layers[layer_idx].keys[:, 0, :, 0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.granularity_cache.reorder_cache(beam_idx)
        self.cross_granularity_cache.reorder_cache(beam_idx)

    def reset(self) -> None:
        super().reset()
        self.granularity_cache.reset()
        self.cross_granularity_cache.reset()

    def crop(self, length: int) -> None:
        """`length` as transformers reads it: 5.x removes -length tokens, 4.57 keeps the first `length`."""
        super().crop(length)
        self.granularity_cache.crop(length)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.granularity_cache.batch_repeat_interleave(repeats)
        self.cross_granularity_cache.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.granularity_cache.batch_select_indices(indices)
        self.cross_granularity_cache.batch_select_indices(indices)


def cache_capacity(cache: EncoderDecoderCache) -> int | None:
    """The key length of a preallocated (static) self-attention cache, None for one that grows with each step."""
    layers = cache.self_attention_cache.layers
    return getattr(layers[0], "max_cache_len", None) if layers else None


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
        self.config = config
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.mask_kind = mask_kind
        self.is_causal = False  # read by transformers' SDPA function when no mask is passed: causality is explicit

        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.granularity_head = GranularityHead(self.embed_dim) if mask_kind != "none" else None

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, t, d_head)

    def granularity(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Eq. 4 for these tokens (b, t) as the masks read it and the cache keeps it: z, or with the masks compiled
        (`config.compile_granularity_masks`) its logit W_G h, whose sigmoid then runs inside the mask's kernel
        instead of a kernel of its own. None without a granularity head."""
        if self.granularity_head is None:
            return None
        return self.granularity_head(hidden_states, logits=self.config.compile_granularity_masks)

    def as_z(self, granularity: torch.Tensor | None) -> torch.Tensor | None:
        """z of eq. 4 from what `granularity` returned."""
        logits = granularity is not None and self.config.compile_granularity_masks
        return torch.sigmoid(granularity) if logits else granularity

    def _encoder_keys_and_values(
        self, encoder_states: torch.Tensor, cache: EncoderDecoderCache | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Cross-attention keys, values and the granularity of the encoder states (`granularity`; None without a
        granularity head): computed once, at the first decoding step, then read from the cache (a
        `GranularityCache` where there is a granularity head)."""
        cross_cache = cache.cross_attention_cache if cache is not None else None
        has_z = self.granularity_head is not None
        if cross_cache is not None and cache.is_updated.get(self.layer_idx):
            g_key = cache.cross_granularity(self.layer_idx) if has_z else None
            return cross_cache.layers[self.layer_idx].keys, cross_cache.layers[self.layer_idx].values, g_key
        key_states = self._split_heads(self.k_proj(encoder_states))
        value_states = self._split_heads(self.v_proj(encoder_states))
        g_key = self.granularity(encoder_states)
        if cross_cache is not None:
            key_states, value_states = cross_cache.update(key_states, value_states, self.layer_idx)
            if has_z:
                g_key = cache.update_cross_granularity(g_key, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return key_states, value_states, g_key

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
        where there is a granularity head, else None. The stacks pass `output_granularities=False` unless their
        caller asks for z: with the masks compiled, z is then never computed (the masks read W_G h)."""
        query_states = self._split_heads(self.q_proj(hidden_states))
        g_query = self.granularity(hidden_states)

        if self.is_cross_attention:
            key_states, value_states, g_key = self._encoder_keys_and_values(key_value_states, cache)
        else:
            key_states = self._split_heads(self.k_proj(hidden_states))
            value_states = self._split_heads(self.v_proj(hidden_states))
            g_key = g_query  # the same tokens: one z per token, eq. 4
            if cache is not None:
                cache_kwargs = {"cache_position": layout.query_positions}
                key_states, value_states = cache.self_attention_cache.update(
                    key_states, value_states, self.layer_idx, cache_kwargs
                )
                if g_key is not None:
                    g_key = cache.update_granularity(g_key, self.layer_idx, cache_kwargs)

        dropout = self.dropout if self.training else 0.0
        multiply = g_query is not None and self.config.granularity_mask_mode == "multiply"
        if not layout.dense:  # the stack chose flex attention, which applies the masks inside its kernel
            z_query, z_key = self.as_z(g_query), self.as_z(g_key)
            attn_output, attn_weights = flex_granularity_attention(
                self, query_states, key_states, value_states, layout, z_query, z_key, self.scaling, dropout
            )
        else:
            extra = {}
            # the literal eq. 9, or the weights themselves, need the reference path
            attend = eager_attention_forward if multiply or output_attentions else attention_function(self.config)
            sdpa = attend is not eager_attention_forward and self.config._attn_implementation == "sdpa"
            if g_query is None and layout.plain_causal and sdpa:  # no mask: SDPA may choose a fused kernel, as BART's
                attention_mask, extra["is_causal"] = None, True
            elif multiply:  # GA, the literal eq. 9: M (b, i, j) scales the softmax output, the mask is padding only
                length = layout.length[:, :, None] if layout.length is not None else None
                extra["multiplier"] = granularity_mask(
                    self.mask_kind,
                    self.as_z(g_query)[:, :, None],
                    self.as_z(g_key)[:, None, :],
                    length,
                    layout.distance,
                    self.config.scope_epsilon,
                )
                attention_mask = layout.padding_bias(query_states.dtype)
            else:  # GA, eqs. 6-9 as log M in the additive mask (`GranularityBias`), or the padding bias alone
                attention_mask = attention_bias(
                    layout,
                    query_states.dtype,
                    self.mask_kind,
                    g_query,
                    g_key,
                    self.config.scope_epsilon,
                    compiled=self.config.compile_granularity_masks,
                    logits=self.config.compile_granularity_masks,
                )
            pad = sdpa and self.head_dim % HEAD_DIM_ALIGNMENT and query_states.device.type in PADDED_HEAD_DEVICES
            if pad:
                query_states, key_states, value_states = padded_heads(query_states, key_states, value_states)
            attn_output, attn_weights = attend(
                self,
                query_states,
                key_states,
                value_states,
                attention_mask,
                scaling=self.scaling,
                dropout=dropout,
                **extra,
            )
            if pad:
                attn_output = attn_output[..., : self.head_dim]  # (b, i, h, d): the padded columns are zeros
        attn_output = attn_output.reshape(*hidden_states.shape[:2], self.embed_dim)
        z_query = self.as_z(g_query) if output_granularities else None
        return self.out_proj(attn_output), attn_weights if output_attentions else None, z_query


class CDNPGLayer(GradientCheckpointingLayer):
    """What the encoder and decoder layers share: post-LayerNorm sublayers, H = LN(H + Sublayer(H)), of which the
    last is the feed-forward network."""

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

    def forward(
        self,
        hidden_states: torch.Tensor,
        layout: AttentionLayout,
        output_attentions: bool = False,
        output_granularities: bool = True,
    ):
        attn_output, attn_weights, z = self.self_attn(
            hidden_states, layout, output_attentions=output_attentions, output_granularities=output_granularities
        )
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        return self.feed_forward(hidden_states), attn_weights, z


class CDNPGDecoderLayer(CDNPGLayer):
    """Eq. 10, post-LayerNorm: causal GA-self-attention, GA-cross-attention over the encoder, feed-forward."""

    def __init__(self, config: CDNPGConfig, layer_idx: int):
        super().__init__()
        eps, heads = config.layer_norm_eps, config.decoder_attention_heads
        cross_kind = (
            "resonance" if config.cross_attention_granularity and config.granularity_mask != "none" else "none"
        )
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
        output_attentions: bool = False,
        output_granularities: bool = True,
    ):
        outputs = {"output_attentions": output_attentions, "output_granularities": output_granularities}
        attn_output, self_weights, self_z = self.self_attn(hidden_states, self_layout, cache=cache, **outputs)
        hidden_states = self.self_attn_layer_norm(hidden_states + self.dropout(attn_output))
        attn_output, cross_weights, cross_z = self.encoder_attn(
            hidden_states, cross_layout, key_value_states=encoder_hidden_states, cache=cache, **outputs
        )
        hidden_states = self.encoder_attn_layer_norm(hidden_states + self.dropout(attn_output))
        return self.feed_forward(hidden_states), self_weights, cross_weights, self_z, cross_z


# ------------------------------------------------------------------------------------------------------------------
# Outputs: the standard ones plus z of every layer (the paper's Figure 2)
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class CDNPGEncoderOutput(BaseModelOutput):
    """`granularities`: z (b, s) of every encoder layer's self-attention, when `output_granularities=True`;
    `source_ids` (b, s): the input ids, with a copy mechanism (which puts its probabilities on them), so that they
    travel with the encoder states through `generate()`."""

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
    """The arguments of `CDNPGModel.forward` that `CDNPGForConditionalGeneration.forward` passes on as given."""

    decoder_input_ids: torch.LongTensor | None
    decoder_attention_mask: torch.Tensor | None
    cache: EncoderDecoderCache | None
    decoder_inputs_embeds: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    use_cache: bool | None
    output_granularities: bool | None


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------


class CDNPGPreTrainedModel(PreTrainedModel):
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
        """`PreTrainedModel.set_attn_implementation`, refusing backends that would drop the granularity term with
        the reason (transformers' own refusal says only that they are not supported "yet")."""
        for implementation in (
            attn_implementation.values() if isinstance(attn_implementation, dict) else [attn_implementation]
        ):
            check_attention_backend(implementation)
        super().set_attn_implementation(attn_implementation, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`; a truncated or corrupt weights file is reported by name. It stays in the
        remote code because every loader of a checkpoint passes here (Auto classes, pipeline, CLI), and transformers'
        own SafetensorError names no file."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(
                f"The weights file (model.safetensors) of {str(pretrained_model_name_or_path)!r} is truncated or "
                f"corrupt ({error}); save or download the checkpoint again."
            ) from error

    # `_init_weights` is PreTrainedModel's: Normal(0, initializer_range) for every Linear (W_G included) and
    # Embedding, zero biases and padding row, unit LayerNorms.


class CDNPGStack(CDNPGPreTrainedModel):
    """What the encoder and the decoder share: token and learned position embeddings, then an optional LayerNorm;
    its layers run in turn; the output flags a call leaves out are the config's.

    The paper's model adds token and position embeddings (eq. 3); BART and BERT checkpoints also scale the tokens
    and/or normalise the sum (`scale_embedding`, `layernorm_embedding`, `position_offset`).
    """

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
        """Token (scaled when `scale_embedding`; `inputs_embeds` are taken as given) plus position embeddings, and the
        positions: `past_length` onwards, after the tokens already in a cache. The positions are checked against the
        table from Python ints, never by reading a tensor (a host sync on a GPU): a static cache's length is a
        tensor, and its `capacity` bounds every position it can hold."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of input_ids or inputs_embeds to the {type(self).__name__}.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        if isinstance(past_length, torch.Tensor):  # a static cache's length
            positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        else:
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

    def run_layers(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, tuple, tuple]:
        """Every layer in turn (the other arguments are passed to each as given). Returns the last hidden states, the
        input of every layer followed by the last hidden states, and what else the layers return (attention
        weights, z), one tuple over the layers for each."""
        all_hidden, per_layer = [hidden_states], []
        for layer in self.layers:
            hidden_states, *extras = layer(hidden_states, *args, **kwargs)
            all_hidden.append(hidden_states)
            per_layer.append(extras)
        return hidden_states, tuple(all_hidden), tuple(zip(*per_layer))


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
        source_memo: dict | None = None,
    ) -> CDNPGEncoderOutput:
        r"""
        token_type_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): accepted because
            BERT tokenizers return them; C-DNPG has no segment embeddings, so they must be all 0 (one sentence per
            input, no sentence pairs).
        output_granularities (`bool`, *optional*): also return z (eq. 4) of every layer.
        output_attentions, output_hidden_states (`bool`, *optional*): default: the config's.
        source_memo (`dict`, *optional*): where what the source's padding alone decides (the padding bias, the
            blocked keys) is kept for the decoder's cross-attention, given the same dict and `attention_mask`:
            `CDNPGModel` builds them once per forward this way (`AttentionLayout.cross`).

        No **kwargs: `generate()` hands an encoder that takes them every model kwarg (the Seq2SeqTrainer's `labels`
        too), and one that does not only those it names.
        """
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError(
                "token_type_ids: C-DNPG has no segment embeddings, so every token must be in segment 0; encode one "
                "sentence per input (no text pairs)."
            )
        hidden_states, positions = self.embed(input_ids, inputs_embeds)
        padded = attention_mask is not None  # without a mask, SDPA gets none
        if attention_mask is None:
            attention_mask = torch.ones(hidden_states.shape[:2], device=hidden_states.device)
        # N of eq. 8 is each sentence's own number of real tokens: batch composition never changes an output
        materialize = not masks_in_kernel(self.config, output_attentions)
        layout = AttentionLayout.build(
            attention_mask.bool(), positions, causal=False, materialize=materialize, padded=padded, shared=source_memo
        )

        hidden_states, all_hidden, (attentions, z) = self.run_layers(
            hidden_states, layout, output_attentions=output_attentions, output_granularities=bool(output_granularities)
        )
        return CDNPGEncoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=attentions if output_attentions else None,
            granularities=z if output_granularities and z[0] is not None else None,
            source_ids=input_ids if self.config.copy_mechanism is not None else None,
        )


class CDNPGDecoder(CDNPGStack):
    """Eq. 10 stacked `decoder_layers` times; incremental with any `EncoderDecoderCache` (dynamic or static)."""

    is_decoder = True

    @can_return_tuple
    @takes_cache_by_either_name
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
        source_memo: dict | None = None,
    ) -> CDNPGDecoderOutput:
        r"""
        attention_mask (`torch.Tensor` of shape `(batch_size, target_length)`, *optional*): 1 for real decoder
            tokens, covering the cached and the new positions.
        cache (`EncoderDecoderCache`, *optional*): a cache to extend (also taken as `past_key_values`, its name before
            transformers 5.24); an empty transformers cache (dynamic or static) is wrapped into a `GranularityCache`,
            which the output returns.
        output_attentions, output_hidden_states (`bool`, *optional*): default: the config's.
        source_memo (`dict`, *optional*): the encoder's, given with the `attention_mask` it was given as
            `encoder_attention_mask` (see `CDNPGEncoder.forward`).
        """
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        if self.gradient_checkpointing and self.training:
            use_cache = False  # a cache written inside recomputed layers would be written twice
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise TypeError(
                f"{CACHE_NAME} must be an EncoderDecoderCache, got {type(cache).__name__}; "
                "legacy tuple caches are not supported."
            )
        if cache is not None and self.config.granularity_mask != "none" and not isinstance(cache, GranularityCache):
            cache = GranularityCache.wrap(cache)

        # a dynamic cache's length is an int; a static cache's a tensor, which is never read on the host
        past_length = cache.get_seq_length() if cache is not None else 0
        capacity = cache_capacity(cache) if cache is not None else None
        hidden_states, query_positions = self.embed(input_ids, inputs_embeds, past_length, capacity)
        batch_size, num_queries = hidden_states.shape[:2]
        device = hidden_states.device

        # keys: the cached and new tokens, or every slot of a preallocated (static) cache, later ones masked as future
        key_length = capacity if capacity is not None else past_length + num_queries
        if attention_mask is None:
            key_padding = torch.ones(batch_size, key_length, dtype=torch.bool, device=device)
        else:
            # the static cache's lower bound would read its length: only its capacity is checked
            needed = past_length + num_queries if capacity is None else num_queries
            if not needed <= attention_mask.shape[-1] <= key_length:
                raise ValueError(
                    f"decoder_attention_mask covers {attention_mask.shape[-1]} positions, but the cache holds "
                    f"{past_length} and {num_queries} are new: it must cover all {past_length + num_queries}."
                    if capacity is None
                    else f"decoder_attention_mask covers {attention_mask.shape[-1]} positions, but the static cache "
                    f"holds at most {capacity} and {num_queries} are new."
                )
            key_padding = F.pad(attention_mask.bool(), (0, key_length - attention_mask.shape[-1]), value=True)
        encoder_padded = encoder_attention_mask is not None  # without a mask, SDPA gets none
        if encoder_attention_mask is None:
            encoder_attention_mask = torch.ones(encoder_hidden_states.shape[:2], device=device)
        # N of eq. 8 for query i is what query i can see, i + 1: cached decoding equals a full forward
        materialize = not masks_in_kernel(self.config, output_attentions)
        self_layout = AttentionLayout.build(
            key_padding,
            query_positions,
            causal=True,
            materialize=materialize,
            padded=attention_mask is not None,
            plain_causal=capacity is None and past_length == 0,  # queries from position 0 over themselves alone
        )
        cross_layout = AttentionLayout.cross(
            encoder_attention_mask.bool(), query_positions, materialize, encoder_padded, shared=source_memo
        )

        hidden_states, all_hidden, (self_attentions, cross_attentions, self_z, cross_z) = self.run_layers(
            hidden_states,
            encoder_hidden_states,
            self_layout,
            cross_layout,
            cache=cache,
            output_attentions=output_attentions,
            output_granularities=bool(output_granularities),
        )
        return CDNPGDecoderOutput(
            last_hidden_state=hidden_states,
            **{CACHE_NAME: cache if use_cache else None},
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=self_attentions if output_attentions else None,
            cross_attentions=cross_attentions if output_attentions else None,
            granularities=self_z if output_granularities and self_z[0] is not None else None,
            cross_granularities=cross_z if output_granularities and cross_z[0] is not None else None,
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

    def _tie_weights(self) -> None:
        """transformers 4.57 ties through this hook; 5.x reads `_tied_weights_keys` (the config flag decides both)."""
        if self.config.tie_word_embeddings:
            self.encoder.embed_tokens = self.decoder.embed_tokens = self.shared

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    def get_encoder(self) -> CDNPGEncoder:  # transformers 4.57 has no default
        return self.encoder

    @can_return_tuple
    @takes_cache_by_either_name
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
    ) -> CDNPGModelOutput:
        r"""
        cache (`EncoderDecoderCache`, *optional*): see `CDNPGDecoder.forward` (also taken as `past_key_values`).
        token_type_ids: see `CDNPGEncoder.forward`; ignored when `encoder_outputs` are given.
        output_granularities (`bool`, *optional*): return z (eq. 4) of every layer, e.g. to draw the paper's Figure 2.
        kwargs: transformers' `output_attentions` and `output_hidden_states`, passed to both stacks, and what
            `generate()` passes every model and C-DNPG has no use for (`PASSED_TO_EVERY_MODEL`); any other is refused
            (`refuse_unused`).
        """
        refuse_unused(kwargs, "CDNPGModel.forward")
        flags = {name: kwargs.get(name) for name in ("output_attentions", "output_hidden_states")}
        if encoder_outputs is None:
            # the encoder's self-attention and the decoder's cross-attention have the same keys: the source's
            # padding is converted once, and what it alone decides is built once for both stacks
            if attention_mask is not None:
                attention_mask = attention_mask.bool()
            flags["source_memo"] = {}
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


def copy_attention(
    scores: torch.Tensor,
    scaling: float,
    copyable: torch.Tensor,
    z_source: torch.Tensor | None = None,
    logits: bool = False,
) -> torch.Tensor:
    """The copy attention α_t (b, i, j): a softmax of the scores q_t · k_j (b, i, j) times `scaling` over the copyable
    source tokens (`copyable`, b, j). With the granularity gate, weighted by z of the source tokens (b, j), so that
    details are copied: α_tj ∝ z_j exp(q_t · k_j). With `logits`, z_source is W_G h and eq. 4's sigmoid runs here."""
    scores = upcast(scores) * scaling
    if z_source is not None:
        z_source = torch.sigmoid(z_source) if logits else z_source
        scores = scores + upcast(z_source).clamp(min=MASK_FLOOR).log()[:, None, :]
    return scores.masked_fill(~copyable[:, None, :], torch.finfo(scores.dtype).min).softmax(-1)


def copy_gate(
    gate: torch.Tensor, learned: bool, copyable: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """log ρ_t and log(1 - ρ_t) (b, i): ρ_t = σ(gate) of the learned gate's logit, or ρ_t = z_t, the granularity
    gate's z of the decoder position. Given `copyable` (b, j), ρ_t = 0 where the source holds no copyable token."""
    gate = upcast(gate)
    if learned:
        log_rho, log_not_rho = F.logsigmoid(gate), F.logsigmoid(-gate)
    else:
        log_rho, log_not_rho = gate.clamp(min=MASK_FLOOR).log(), (1 - gate).clamp(min=MASK_FLOOR).log()
    if copyable is not None:
        nothing = ~copyable.any(-1)[:, None]  # (b, 1)
        log_rho = log_rho.masked_fill(nothing, torch.finfo(log_rho.dtype).min)
        log_not_rho = log_not_rho.masked_fill(nothing, 0.0)
    return log_rho, log_not_rho


def copy_distribution(
    logits: torch.Tensor,
    alpha: torch.Tensor,
    gate: torch.Tensor,
    source_ids: torch.LongTensor,
    copyable: torch.Tensor,
    labels: torch.LongTensor | None = None,
    learned: bool = True,
    excluded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """P(y_t) = (1 - ρ_t) P_gen(y_t) + ρ_t Σ_{j: x_j = y_t} α_tj as log-probabilities (b, i, V) in at least float32,
    given the vocabulary logits (b, i, V), α (`copy_attention`) and the gate (`copy_gate`; with `excluded`, ρ_t = 0
    where nothing is copyable), and the summed negative log-likelihood of the labels (b, i; -100 left out) or None.
    The loss is read at the labels alone, so that its backward pass is cross-entropy's: nothing flows back through
    the (b, i, V) mixture unless the caller uses it."""
    log_rho, log_not_rho = copy_gate(gate, learned, copyable if excluded else None)
    log_p = upcast(logits).log_softmax(-1)  # log P_gen

    def mixed(generated: torch.Tensor, copied: torch.Tensor) -> torch.Tensor:
        """log P(y) = log((1 - ρ) P_gen(y) + ρ Σ_{j: x_j = y} α_tj) from log((1 - ρ) P_gen(y)) and that sum."""
        return torch.logaddexp(generated, copied.clamp(min=MASK_FLOOR).log() + log_rho[..., None])

    # only the source's tokens change: the mixture is computed for them, never as a second (b, i, V) tensor
    same = source_ids[:, :, None] == source_ids[:, None, :]  # (b, j, j)
    index = source_ids[:, None, :].expand_as(alpha)
    first = ((same.tril(-1).sum(-1) == 0) & copyable)[:, None, :]  # a repeated token is changed once
    before = log_p.gather(-1, index) + log_not_rho[..., None]  # read from `log_p`: the sum below changes in place
    after = mixed(before, alpha @ same.to(alpha.dtype))  # repeated tokens add up
    log_probs = (log_p + log_not_rho[..., None]).scatter_add_(-1, index, (after - before) * first)
    if labels is None:
        return log_probs, None
    targets = labels.clamp(min=0)[..., None]  # (b, i, 1); -100 read as token 0, then left out
    hits = (targets == source_ids[:, None, :]) & copyable[:, None, :]  # (b, i, j)
    generated = log_p.gather(-1, targets) + log_not_rho[..., None]
    picked = torch.where(hits.any(-1, keepdim=True), mixed(generated, (alpha * hits).sum(-1, keepdim=True)), generated)
    return log_probs, -(picked.squeeze(-1) * (labels != -100)).sum()


class CopyMechanism(nn.Module):
    """A pointer over the source tokens mixed with the vocabulary distribution (the paper's Transformer+Copy row of
    Table 2; DNPG's eq. 8; See et al. 2017): P(y_t) = (1 - ρ_t) P_gen(y_t) + ρ_t Σ_{j: x_j = y_t} α_tj, with α_t a
    one-head attention of the decoder state over the encoder states. Returned as log-probabilities, which pass through
    log_softmax unchanged, so the loss, label smoothing and every decoding mode read them as logits.

    Gates (`CDNPGConfig.copy_mechanism`): `learned`, ρ_t = σ(w · [h_t; c_t]) with c_t the copy context; `granularity`,
    C-DNPG's decomposition decides: α re-weighted by the source tokens' z (details are copied) and ρ_t = z of the
    decoder position, both from the last decoder layer's cross-attention granularity head.
    `copy_excluded_token_ids` are never pointed at (ρ_t = 0 where the source holds nothing else).
    With `config.compile_granularity_masks`, the attention's and the mixture's elementwise formulas (`copy_attention`,
    `copy_distribution`) run compiled, as the masks do: a few generated kernels around the GEMMs instead of about 45
    aten kernels forward and 45 backward (issue 39).
    """

    def __init__(self, config: CDNPGConfig):
        super().__init__()
        self.excluded_token_ids = tuple(config.copy_excluded_token_ids or ())
        self.excluded_ids_on = {}  # device -> excluded_token_ids as a tensor, built once (not per forward)
        self.config = config  # read at each call: run.py sets compile_granularity_masks after construction
        self.scaling = config.d_model**-0.5
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.gate_proj = nn.Linear(2 * config.d_model, 1) if config.copy_mechanism == "learned" else None

    def forward(
        self,
        logits: torch.Tensor,
        hidden_states: torch.Tensor,
        encoder_states: torch.Tensor,
        source_ids: torch.LongTensor,
        source_mask: torch.Tensor,
        z_source: torch.Tensor | None = None,
        z_target: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits (b, i, V) of the vocabulary, decoder states (b, i, d), encoder states (b, j, d), source ids and
        mask (b, j), for the granularity gate z of the source (b, j; with `config.compile_granularity_masks` its
        logit W_G h, as the cache keeps it) and of the decoder positions (b, i), labels (b, i) -> log P(y_t) (b, i, V)
        and the summed NLL of the labels or None (`copy_distribution`)."""
        copyable = source_mask.bool()
        if self.excluded_token_ids:
            excluded = self.excluded_ids_on.get(source_ids.device)
            if excluded is None:  # a tensor from a Python tuple: once per device, not a host-to-device copy per call
                excluded = self.excluded_ids_on[source_ids.device] = source_ids.new_tensor(self.excluded_token_ids)
            copyable = copyable & ~torch.isin(source_ids, excluded)
        scores = self.q_proj(hidden_states) @ self.k_proj(encoder_states).transpose(1, 2)
        compiled = self.config.compile_granularity_masks
        alpha = compiled_if(copy_attention, compiled)(scores, self.scaling, copyable, z_source, compiled)
        if self.gate_proj is not None:
            context = alpha.to(encoder_states.dtype) @ encoder_states  # (b, i, d)
            gate = self.gate_proj(torch.cat([hidden_states, context], dim=-1)).squeeze(-1)  # (b, i)
        else:  # GA: ρ_t = z_t
            gate = z_target
        learned, excluded = self.gate_proj is not None, bool(self.excluded_token_ids)
        mixture = compiled_if(copy_distribution, compiled)
        return mixture(logits, alpha, gate, source_ids, copyable, labels, learned, excluded)


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
        # labels are not shifted inside the model (the decoder inputs are): token t of `labels` is predicted at
        # decoder position t, which is transformers' masked-LM loss, not its causal-LM one
        self.loss_type = "ForMaskedLM"
        self.post_init()
        # The paper's decoding (Section 4.2): beam 8 over sentences of at most 20 tokens. A checkpoint's own
        # generation_config.json replaces these on from_pretrained.
        self.generation_config.num_beams = 8
        self.generation_config.max_new_tokens = 20

    @can_return_tuple
    @takes_cache_by_either_name
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
    ) -> CDNPGSeq2SeqLMOutput:
        r"""
        encoder_outputs, inputs_embeds: see `CDNPGModel.forward`; named here because `generate()` and transformers'
            tests look for them by name.
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids, -100 where ignored; the
            decoder inputs are derived from them when not given.
        logits_to_keep (`int` or `torch.Tensor`): compute logits only for the last `logits_to_keep` decoder
            positions (0: all), or for the given positions; generation asks for the last one.
        num_items_in_batch: the number of target tokens in the whole (gradient-accumulated, all-process) batch, as
            passed by `Trainer`; the loss is then the token sum divided by it, so that it stays the mean token loss
            whatever the number of processes or accumulation steps.
        kwargs: the other arguments of `CDNPGModel.forward` (`CDNPGModelKwargs`), passed to it as given. Everything
            after `attention_mask` is keyword-only, so that no positional argument lands in the wrong place.
        """
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
        hidden_states = decoder_states
        if self.lm_head_transform is not None:
            hidden_states = self.lm_head_transform(hidden_states)
        logits = self.lm_head(hidden_states)
        nll = None
        if self.copy_mechanism is not None:
            source_ids = input_ids if input_ids is not None else getattr(encoder_outputs, "source_ids", None)
            logits, nll = self.copy(logits, decoder_states, outputs, source_ids, attention_mask, positions, labels)

        loss = None
        if labels is not None:
            if num_items_in_batch is None:  # the mean over real target tokens; 0, not NaN, when there are none
                num_items_in_batch = (labels != -100).sum().clamp(min=1)
            if nll is not None:  # the copy mechanism's, read at the labels: the NLL of the returned log-probabilities
                loss = nll / num_items_in_batch
            else:
                loss = self.loss_function(
                    logits, labels.contiguous(), self.config.vocab_size, num_items_in_batch=num_items_in_batch
                )

        # everything the bare model returns but its last hidden state, which the logits replace
        left_out = {"last_hidden_state"}
        if self.config.copy_mechanism == "granularity" and not asked_for_z:  # z computed for the gate alone
            left_out |= {"encoder_granularities", "decoder_granularities", "cross_granularities"}
        model_outputs = {name: value for name, value in outputs.items() if name not in left_out}
        return CDNPGSeq2SeqLMOutput(loss=loss, logits=logits, **model_outputs)

    def copy(self, logits, decoder_states, outputs, source_ids, attention_mask, positions, labels=None):
        """The vocabulary logits mixed with the copy distribution (`CopyMechanism`), as log-probabilities, and the
        summed NLL of the labels when given."""
        if source_ids is None:
            raise ValueError(
                "copy_mechanism: the copy distribution is put on the source token ids: pass input_ids, or "
                "encoder_outputs as this model's encoder returns them (with source_ids), not a tuple or embeddings"
            )
        encoder_states = outputs.encoder_last_hidden_state
        mask = attention_mask if attention_mask is not None else torch.ones_like(source_ids)
        z_source = z_target = None
        if self.config.copy_mechanism == "granularity":
            z_source = self.source_granularity(encoder_states, getattr(outputs, CACHE_NAME, None))  # (b, j)
            z_target = outputs.cross_granularities[-1][:, positions]  # (b, i)
        return self.copy_mechanism(
            logits, decoder_states, encoder_states, source_ids, mask, z_source, z_target, labels=labels
        )

    def source_granularity(self, encoder_states: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        """z (b, j) of the source tokens as the last decoder layer's cross-attention sees them, which the granularity
        gate weighs the copy attention by, or its logit W_G h with the masks compiled (`CDNPGAttention.granularity`):
        read from the cache, where that layer stored it at the first decoding step, else computed by its head."""
        attention = self.model.decoder.layers[-1].encoder_attn
        if isinstance(cache, GranularityCache) and cache.is_updated.get(attention.layer_idx):
            return cache.cross_granularity(attention.layer_idx)
        return attention.granularity(encoder_states)

    def get_encoder(self) -> CDNPGEncoder:
        """transformers 4.57 has no default. The embedding accessors and `get_decoder` are PreTrainedModel's, which
        find `self.model` and `self.lm_head`."""
        return self.model.encoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by `DataCollatorForSeq2Seq` to build decoder inputs in the collator."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def create_masks_for_generate(self, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
        """With a static cache, `generate()` turns the decoder's 2-D padding mask into the 4-D mask of its attention
        backend. C-DNPG builds its own additive mask (padding plus the granularity term) from the 2-D one: keep it."""
        return attention_mask

    # --- granularity-aware paraphrasing lives in generation_cdnpg.py: granularity_processors() and paraphrase() ---
    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, unchanged. Only checked first: the arguments of granularity-aware
        paraphrasing, which generate() does not take (transformers would refuse them as unused model kwargs, or
        a calibrated generation config would swallow `novelty_z_layer` silently), and a number of sequences below
        one, which failed deep in beam search."""
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

    # --- end of granularity-aware paraphrasing ---


__all__ = [
    "CDNPGDecoder",
    "CDNPGEncoder",
    "CDNPGForConditionalGeneration",
    "CDNPGModel",
    "CDNPGPreTrainedModel",
    "CopyMechanism",
    "GranularityCache",
    "GranularityHead",
    "granularity_mask",
    "resonance_mask",
    "scope_mask",
]
