"""The copy mechanism of the Transformer+Copy baseline (the paper's Table 2; DNPG's eq. 8; See et al. 2017), and of
C-DNPG with `config.copy_mechanism`: a pointer over the source tokens mixed with the vocabulary distribution,

    P(y_t) = (1 - ρ_t) P_gen(y_t) + ρ_t Σ_{j: x_j = y_t} α_tj

α_t a one-head attention of the decoder state over the encoder states, ρ_t the copy gate.

Remote code: copied into every checkpoint beside modeling_cdnpg.py, which imports it. Imports torch, transformers
and its sibling files.
"""

import torch
from torch import nn
from torch.nn import functional as F

from .configuration_cdnpg import CDNPGConfig
from .granularity_kernels import MASK_FLOOR, fast, upcast


def copy_attention(
    scores: torch.Tensor, scaling: float, copyable: torch.Tensor, logits_source: torch.Tensor | None = None
) -> torch.Tensor:
    """The copy attention α_t (b, i, j): a softmax of the scores q_t · k_j (b, i, j) times `scaling` over the copyable
    source tokens (`copyable`, b, j). With the granularity gate, weighted by z of the source tokens, the sigmoid of
    their granularity logits (b, j) (eq. 4), so that details are copied: α_tj ∝ z_j exp(q_t · k_j)."""
    scores = upcast(scores) * scaling
    if logits_source is not None:
        scores = scores + torch.sigmoid(upcast(logits_source)).clamp(min=MASK_FLOOR).log()[:, None, :]
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
    where nothing is copyable), and the summed NLL of the labels (b, i; -100 left out) or None, read at the labels
    alone: its backward pass is cross-entropy's, nothing flows back through the (b, i, V) mixture."""
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
    """The copy distribution (`copy_distribution`) as log-probabilities, which log_softmax leaves unchanged, so the
    loss and every decoding mode read them as logits. Gates (`config.copy_mechanism`):
    `learned`, ρ_t = σ(w · [h_t; c_t]), c_t the copy context (α_t times the encoder states);
    `granularity`, α weighted by the source tokens' z and ρ_t = z of the decoder position (last cross-attention's).
    `copy_excluded_token_ids` are never pointed at."""

    def __init__(self, config: CDNPGConfig):
        super().__init__()
        self.excluded_token_ids = tuple(config.copy_excluded_token_ids or ())
        self.excluded_ids_on = {}  # device -> excluded_token_ids as a tensor, built once (not per forward)
        self.config = config  # read at each call: compile_granularity_masks may be set after construction
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
        logits_source: torch.Tensor | None = None,
        z_target: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits (b, i, V), decoder states (b, i, d), encoder states (b, j, d), source ids and mask (b, j), for the
        granularity gate the logits W_G h of the source (b, j) and z of the decoder positions (b, i), labels (b, i)
        -> log P(y_t) (b, i, V) and the summed NLL of the labels or None (`copy_distribution`)."""
        copyable = source_mask.bool()
        if self.excluded_token_ids:
            excluded = self.excluded_ids_on.get(source_ids.device)
            if excluded is None:  # once per device, not a host-to-device copy per call
                excluded = self.excluded_ids_on[source_ids.device] = source_ids.new_tensor(self.excluded_token_ids)
            copyable = copyable & ~torch.isin(source_ids, excluded)
        scores = self.q_proj(hidden_states) @ self.k_proj(encoder_states).transpose(1, 2)
        compiled = self.config.compile_granularity_masks
        alpha = fast(copy_attention, compiled, scores.device)(scores, self.scaling, copyable, logits_source)
        if self.gate_proj is not None:
            context = alpha.to(encoder_states.dtype) @ encoder_states  # (b, i, d)
            gate = self.gate_proj(torch.cat([hidden_states, context], dim=-1)).squeeze(-1)  # (b, i)
        else:  # GA: ρ_t = z_t
            gate = z_target
        learned, excluded = self.gate_proj is not None, bool(self.excluded_token_ids)
        mixture = fast(copy_distribution, compiled, logits.device)
        return mixture(logits, alpha, gate, source_ids, copyable, labels, learned, excluded)


__all__ = ["CopyMechanism", "copy_attention", "copy_distribution", "copy_gate"]
