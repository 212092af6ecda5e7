"""On CUDA the attention heads are zero-padded to a multiple of 8 (`granularity_kernels.padded_heads`) so that SDPA
may choose its memory-efficient kernel, which takes GA's bias and returns its gradient, where the paper's head_dim of
50 leaves it on the unfused math path. The padding changes nothing but shapes. That is proved on CPU by turning the
path on there (`PADDED_HEAD_DEVICES`) and comparing with the unpadded model: the loss, every gradient, and a cached
beam search, for every mask and with the copy gate. On a GPU, a paper-size GA training step runs with SDPA's
memory-efficient kernel as its only backend.
"""

import pytest
import torch

from modeling_cdnpg import granularity_kernels
from tests.conftest import MASKS, tiny_model

ODD_HEADS = dict(d_model=30, encoder_attention_heads=3, decoder_attention_heads=3)  # head_dim 10: padded to 16


def batch(vocab_size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(3, vocab_size, (3, 7), generator=generator)
    mask = torch.ones_like(source)
    mask[1, 5:], mask[2, 3:] = 0, 0  # padded rows: the bias blocks keys there
    labels = torch.randint(3, vocab_size, (3, 6), generator=generator)
    labels[2, 4:] = -100
    return {"input_ids": source, "attention_mask": mask, "labels": labels}


def loss_and_gradients(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("copy", [None, "learned"])
@pytest.mark.parametrize("mask", MASKS)
def test_padded_heads_give_the_same_loss_gradients_and_beam_search(mask, copy, monkeypatch):
    model = tiny_model(granularity_mask=mask, copy_mechanism=copy, dropout=0.0, attention_dropout=0.0, **ODD_HEADS)
    assert model.config._attn_implementation == "sdpa" and model.config.d_model // 3 % 8
    inputs = batch(model.config.vocab_size)
    model.train()
    plain_loss, plain_grads = loss_and_gradients(model, inputs)
    model.eval()
    settings = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=3,
                    max_new_tokens=6, min_new_tokens=6, output_scores=True, return_dict_in_generate=True)  # fmt: skip
    plain_search = model.generate(**settings)

    padded_shapes = []

    def spy(query, key, value, padded_heads=granularity_kernels.padded_heads):  # the function, its shapes recorded
        out = padded_heads(query, key, value)
        padded_shapes.append(out[0].shape[-1])
        return out

    monkeypatch.setattr(granularity_kernels, "PADDED_HEAD_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(granularity_kernels, "padded_heads", spy)
    model.train()
    padded_loss, padded_grads = loss_and_gradients(model, inputs)
    modules = 2 + 2 * 2  # encoder self-attention, decoder self- and cross-attention, 2 layers each
    assert padded_shapes == [16] * modules
    torch.testing.assert_close(padded_loss, plain_loss, rtol=0, atol=1e-6)
    assert padded_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    model.eval()
    padded_search = model.generate(**settings)
    assert torch.equal(padded_search.sequences, plain_search.sequences)
    torch.testing.assert_close(padded_search.sequences_scores, plain_search.sequences_scores, rtol=0, atol=1e-5)


def test_padded_heads_pads_only_the_head_dim_with_zeros():
    query, key, value = (torch.randn(2, 3, 4, 10) for _ in range(3))
    padded = granularity_kernels.padded_heads(query, key, value)
    for original, states in zip((query, key, value), padded):
        assert states.shape == (2, 3, 4, 16)
        assert torch.equal(states[..., :10], original) and not states[..., 10:].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SDPA's memory-efficient kernel is a CUDA kernel")
@pytest.mark.parametrize("mask", ["resonance", "product", "none"])
def test_on_cuda_the_paper_size_step_runs_on_sdpas_memory_efficient_kernel_alone(mask):
    """head_dim 450 / 9 = 50: without the padding SDPA would raise "No available kernel" with only this backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny_model(granularity_mask=mask, d_model=450, encoder_attention_heads=9, decoder_attention_heads=9)
    model = model.cuda().train()
    inputs = {name: tensor.cuda() for name, tensor in batch(model.config.vocab_size).items()}
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), torch.autocast("cuda", torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
