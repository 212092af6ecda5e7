"""How C-DNPG runs its formulas fast, and the numerics they share: compiled alone (`fast`), attention heads zero-padded
for SDPA's fused kernels on CUDA (`attention_with_aligned_heads`), flex attention adding the mask in its kernel; each
formula in at least float32 (`upcast`), masks floored at `MASK_FLOOR` before the log. This file holds no formula.

`fast` compiles modeling_cdnpg.py's `granularity_bias` (eqs. 4-9) and copy_cdnpg.py's attention and mixture, each
alone: inductor fuses an elementwise formula into about one kernel forward and one backward, where eager PyTorch
launches one per operation, and a paper-size model on a GPU is launch-bound. When (`config.compile_granularity_masks`):
True always, False never, None (the default) on CUDA only: one CPU thread is arithmetic-bound, where the masks cost
little either way and inductor's C++ compile would add minutes.

Remote code: copied into every checkpoint beside modeling_cdnpg.py and copy_cdnpg.py, which import it. Imports torch
and transformers.
"""

import functools
import inspect
from collections.abc import Callable

import torch
from torch.nn import functional as F
from transformers.utils import logging

logger = logging.get_logger(__name__)

MASK_FLOOR = 1e-32  # smallest mask value before the log (released code): log(1e-32) ≈ -73.7, i.e. weight ~ 0
COMPILED_BY_DEFAULT_ON = frozenset({"cuda"})  # devices where compile_granularity_masks=None compiles
COMPILE_BACKEND = "inductor"  # torch.compile's; tests of the wiring, not of inductor, use dynamo's "eager" backends
COMPILED_VARIANTS = 64  # variants each compiled function may compile, past dynamo's default limit of 8
# SDPA's fused kernels that take an additive mask (memory-efficient, cuDNN) need a head_dim that is a multiple of 8 in
# bf16/fp16 (4 in fp32); the paper's is 450 / 9 = 50, which leaves SDPA on its unfused math path. On these devices
# the heads are zero-padded to the next multiple; on a CPU the padding would only cost.
HEAD_DIM_ALIGNMENT = 8
PADDED_HEAD_DEVICES = frozenset({"cuda"})


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """At least float32: masks and probabilities built from z stay exact under bf16/fp16 (float64 stays float64)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def compiles(setting: bool | None, device: torch.device) -> bool:
    """Whether the formulas run compiled: `config.compile_granularity_masks`, None on `COMPILED_BY_DEFAULT_ON`."""
    return setting if setting is not None else device.type in COMPILED_BY_DEFAULT_ON


def fast(function: Callable, setting: bool | None, device: torch.device) -> Callable:
    """`function` compiled alone (`CompiledAlone`, once per process) where `compiles(setting, device)`, else itself;
    itself inside a compiled model too, whose graph then fuses the formula with the rest of the model."""
    if torch.compiler.is_compiling() or not compiles(setting, device):
        return function
    return compiled_alone(function, COMPILE_BACKEND)


@functools.cache
def compiled_alone(function: Callable, backend: str) -> "CompiledAlone":
    """One `CompiledAlone` per function and backend in a process: each variant compiles once, whatever the model."""
    return CompiledAlone(function, backend)


class CompiledAlone:
    """`function` compiled on its own with dynamic shapes, for an eager model: a new length compiles nothing; a new
    mask kind, dtype, grad mode or blocking does, once, and so does a size of 1, which dynamo specialises (one query
    per decoding step). One model needs about a dozen variants, past dynamo's default limit of 8: each function may
    compile `COMPILED_VARIANTS`, through torch.compile's own `recompile_limit` where torch has it (2.13), never by
    changing the process's limit, which other compiled functions keep.

    Where compiling fails (no Triton, no C++ compiler, an unsupported Python), this call and every later call of every
    compiled function in the process run eagerly, after one warning; a call that fails eagerly too raises its error."""

    failed = False  # set by the first failure, for the whole process: compiling does not work here

    def __init__(self, function: Callable, backend: str):
        self.function, self.backend = function, backend
        self.compiled: Callable | None = None  # built at the first call
        functools.update_wrapper(self, function)

    def __call__(self, *args):
        if CompiledAlone.failed:
            return self.function(*args)
        try:  # compiling happens inside the first calls of each variant: any failure there falls back
            if self.compiled is None:
                limit = "recompile_limit" in inspect.signature(torch.compile).parameters
                options = {"recompile_limit": COMPILED_VARIANTS} if limit else {}
                self.compiled = torch.compile(self.function, dynamic=True, backend=self.backend, **options)
            return self.compiled(*args)
        except Exception as error:
            output = self.function(*args)  # raises the call's own error where the formula fails eagerly too
            CompiledAlone.failed = True
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            logger.warning(
                f"torch.compile of {self.function.__name__} failed ({type(error).__name__}: {reason}); it runs "
                "eagerly from now on: same values, more kernels (compile_granularity_masks=False skips the attempt)"
            )
            return output


def padded_heads(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query, key, value (b, h, t, d) with d zero-padded to a multiple of `HEAD_DIM_ALIGNMENT`. Nothing changes but
    the shapes: the zeros add nothing to q . k (the scale passed is 1 / sqrt(d), not the padded size's), and the
    output's padded columns are weights times zero values."""
    pad = -query.shape[-1] % HEAD_DIM_ALIGNMENT
    return tuple(F.pad(states, (0, pad)) for states in (query, key, value))


def attention_with_aligned_heads(attention: Callable, head_dim: int, device: torch.device) -> Callable:
    """SDPA's `attention` run on `padded_heads` on `PADDED_HEAD_DEVICES` where head_dim is not aligned, so that SDPA
    may choose its memory-efficient kernel (which takes GA's bias and returns its gradient); itself elsewhere."""
    if device.type not in PADDED_HEAD_DEVICES or head_dim % HEAD_DIM_ALIGNMENT == 0:
        return attention
    return padded(attention)


@functools.cache
def padded(attention: Callable) -> Callable:
    """`attention` on zero-padded heads, its output (b, i, h, d) sliced back to the heads' own width."""

    @functools.wraps(attention)
    def attend(module, query, key, value, attention_mask, **kwargs):
        head_dim = query.shape[-1]
        output, weights = attention(module, *padded_heads(query, key, value), attention_mask, **kwargs)
        return output[..., :head_dim], weights

    return attend


def flex_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (b, h, i, d)
    key: torch.Tensor,  # (b, h, j, d)
    value: torch.Tensor,  # (b, h, j, d)
    attention_mask: torch.Tensor | None,  # (b or 1, 1, i or 1, j)
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Flex attention (transformers' attention-function signature) adding the mask to each score inside its kernel,
    -> output (b, i, h, d). transformers' own function reads the mask as mask[b][0][q][kv], which torch 2.13's inductor
    compiles for a CPU into out-of-bounds accesses (a corrupted heap); read as mask[b, 0, q, kv] it is exact."""
    if dropout > 0:
        raise ValueError(
            "flex_attention has no attention dropout: train with 'sdpa' or 'eager', or set attention_dropout=0."
        )

    if attention_mask is not None:  # (b, 1, i, j) to be read per query and key: a view where built broadcast
        attention_mask = attention_mask.expand(query.shape[0], 1, query.shape[2], key.shape[2])

    def add_mask(score, batch, head, query_index, key_index):
        return score + attention_mask[batch, 0, query_index, key_index]

    score_mod = add_mask if attention_mask is not None else None
    output = compiled_flex_attention(COMPILE_BACKEND)(query, key, value, score_mod=score_mod, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


@functools.cache
def compiled_flex_attention(backend: str) -> Callable:
    """torch's flex attention compiled once per process (uncompiled it materialises every score): static shapes at
    first, dynamic once a second shape is seen (torch.compile's default)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, backend=backend)
