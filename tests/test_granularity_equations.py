"""Eqs. 4-9 of the paper on hand-computed inputs, their binary limits (eqs. 5 and 7), and a loop-by-loop reference of
one GA-attention module."""

import math

import pytest
import torch

from modeling_cdnpg import granularity_mask, resonance_mask, scope_mask
from modeling_cdnpg.modeling_cdnpg import AttentionLayout, CDNPGAttention
from tests.conftest import tiny_config


def test_resonance_mask_matches_hand_computed_values():
    # C = (1 - zi) max(0, 1 - (zi + zj)) + zi min(1, 1 - zi + zj)
    # (0.2, 0.3): 0.8 * 0.5 + 0.2 * 1   = 0.6
    # (0.7, 0.1): 0.3 * 0.2 + 0.7 * 0.4 = 0.34
    # (0.5, 0.5): 0.5 * 0   + 0.5 * 1   = 0.5
    z_query = torch.tensor([[0.2, 0.7, 0.5]])
    z_key = torch.tensor([[0.3, 0.1, 0.5]])
    mask = resonance_mask(z_query[:, :, None], z_key[:, None, :])  # elementwise, broadcast to (b, i, j)
    assert mask.shape == (1, 3, 3)
    assert mask[0, 0, 0].item() == pytest.approx(0.6)
    assert mask[0, 1, 1].item() == pytest.approx(0.34)
    assert mask[0, 2, 2].item() == pytest.approx(0.5)
    # (0.7, 0.5): 0.3 * max(0, -0.2) + 0.7 * min(1, 0.8) = 0.56
    assert mask[0, 1, 2].item() == pytest.approx(0.56)


def test_resonance_mask_binary_limit_is_eq5():
    z = torch.tensor([[0.0, 1.0]])
    mask = resonance_mask(z[:, :, None], z[:, None, :])[0]
    # eq. 5: C_ij = 1 iff z_i = z_j
    assert mask.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_scope_mask_matches_hand_computed_values():
    # N = 10, eps = 2, z = 0.5: width = 8 ** 0.5 + 2 = 4.8284; S = clip(width - |i - j|, 0, 1)
    length = torch.full((1, 1), 10.0)
    distance = torch.arange(10.0)[None, :]  # query 0 against keys 0..9
    scope = scope_mask(torch.tensor([[[0.5]]]), length[:, :, None], distance, epsilon=2.0)[0, 0]
    assert scope[:4].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert scope[4].item() == pytest.approx(math.sqrt(8) + 2 - 4)
    assert scope[5:].tolist() == [0.0] * 5


def test_scope_mask_binary_limit_is_eq7():
    length = torch.full((1, 2), 10.0)
    distance = torch.arange(10.0)[None, :].expand(2, -1)
    scope = scope_mask(torch.tensor([[[0.0], [1.0]]]), length[:, :, None], distance, epsilon=2.0)[0]
    # z = 0: the whole sentence (width N = 10 covers every distance < 10)
    assert scope[0].tolist() == [1.0] * 10
    # z = 1: only the eps-neighbourhood, |i - j| <= 2 (width 1 + eps = 3)
    assert scope[1].tolist() == [1.0, 1.0, 1.0] + [0.0] * 7


@pytest.mark.parametrize("length", [1.0, 2.0])
def test_scope_mask_is_finite_and_open_for_sentences_shorter_than_epsilon(length):
    # (N - eps) < 0 has no real power; every key of such a sentence lies within eps, so S must be 1
    z = torch.tensor([[0.3]], requires_grad=True)
    distance = torch.arange(length)[None, :]
    scope = scope_mask(z[:, :, None], torch.full((1, 1, 1), length), distance, epsilon=2.0)
    assert torch.equal(scope, torch.ones_like(scope))
    scope.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_product_and_mean_combine_hand_computed_resonance_and_scope():
    # one query, z_i = 0.2, N = 10, eps = 2, against keys z_j = 0.3, 0.1, 0.9 at distances 0, 7, 8
    # C: (0.2, 0.3) 0.8 * 0.5 + 0.2 * 1 = 0.6; (0.2, 0.1) 0.8 * 0.7 + 0.2 * 0.9 = 0.74; (0.2, 0.9) 0 + 0.2 * 1 = 0.2
    # S: width (10 - 2) ** 0.8 + 2 = 7.278: 1 at distance 0, 0.278 at 7, 0 at 8
    z_i, z_j = torch.tensor([[[0.2]]]), torch.tensor([[[0.3, 0.1, 0.9]]])
    n_i, distance = torch.full((1, 1, 1), 10.0), torch.tensor([[0.0, 7.0, 8.0]])
    resonance, scope = [0.6, 0.74, 0.2], [1.0, 8**0.8 + 2 - 7, 0.0]
    expected = {
        "resonance": resonance,
        "scope": scope,
        "product": [c * s for c, s in zip(resonance, scope)],  # 0.6, 0.206, 0
        "mean": [(c + s) / 2 for c, s in zip(resonance, scope)],  # 0.8, 0.509, 0.1
    }
    for kind, values in expected.items():
        mask = granularity_mask(kind, z_i, z_j, n_i, distance, 2.0)
        torch.testing.assert_close(mask[0, 0], torch.tensor(values), msg=kind)


def reference_self_attention(module: CDNPGAttention, hidden: torch.Tensor, kind: str, multiply: bool) -> torch.Tensor:
    """Eqs. 4, 6, 8, 9 written element by element for one unpadded sentence, as independent of the model as we can."""
    (length, _), eps = hidden.shape, module.config.scope_epsilon
    z = [torch.sigmoid(module.granularity_head.proj(hidden[i])).item() for i in range(length)]
    n_heads, d_head = module.num_heads, module.head_dim
    q, k, v = module.q_proj(hidden), module.k_proj(hidden), module.v_proj(hidden)
    out = torch.zeros(length, n_heads * d_head)
    for head in range(n_heads):
        cols = slice(head * d_head, (head + 1) * d_head)
        for i in range(length):
            logits, masks = [], []
            for j in range(length):
                c = (1 - z[i]) * max(0.0, 1 - (z[i] + z[j])) + z[i] * min(1.0, 1 - z[i] + z[j])
                s = max(0.0, min(1.0, max(length - eps, 0.0) ** (1 - z[i]) + eps - abs(i - j)))
                m = {"resonance": c, "scope": s, "product": c * s, "mean": (c + s) / 2}[kind]
                score = (q[i, cols] @ k[j, cols]).item() / math.sqrt(d_head)
                logits.append(score if multiply else score + (math.log(m) if m > 1e-32 else -1e4))
                masks.append(m)
            probs = torch.softmax(torch.tensor(logits), dim=0)
            if multiply:
                probs = probs * torch.tensor(masks)
            out[i, cols] = probs @ v[:, cols]
    return module.out_proj(out)


@pytest.mark.parametrize("mode", ["log_bias", "multiply"])
@pytest.mark.parametrize("kind", ["resonance", "scope", "product", "mean"])
def test_ga_self_attention_equals_elementwise_reference(kind, mode):
    torch.manual_seed(0)
    config = tiny_config(granularity_mask=kind, granularity_mask_mode=mode)
    module = CDNPGAttention(config, num_heads=4, layer_idx=0, mask_kind=kind).eval()
    torch.nn.init.normal_(module.granularity_head.proj.weight, std=0.5)
    hidden = torch.randn(1, 7, 32)
    layout = AttentionLayout(torch.ones(1, 7, dtype=torch.bool), torch.arange(7), 7, causal=False)
    with torch.no_grad():
        output, _, z = module(hidden, layout)
        expected = reference_self_attention(module, hidden[0], kind, mode == "multiply")
    torch.testing.assert_close(output[0], expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(z, z.mean()), "z should vary between tokens in this test"
