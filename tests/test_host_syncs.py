"""No host sync in a training forward and backward or in a cached decoding step.

On a GPU, reading a tensor's value on the host (`.item()`, `int()`, `bool()`, `.tolist()`), a shape that depends on
the data (`nonzero`, boolean indexing) or a tensor built from a Python list (a host-to-device copy) makes the host wait
for the device at every call. Each has a CPU signature at torch's dispatcher, which these tests refuse while the model
runs: `aten._local_scalar_dense` (every scalar read), `aten.lift_fresh` of more than a scalar (a tensor from a Python list), `nonzero`-like ops
and boolean indexing; `Tensor.tolist`, which reads memory without dispatching, is patched to fail.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from modeling_cdnpg import CDNPGForConditionalGeneration
from tests.conftest import cache_of, tiny_config

DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim"}


class RefuseHostSyncs(TorchDispatchMode):
    """Fails on every aten op that reads a value on the host or sizes a tensor by its data."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in {"_local_scalar_dense"} | DATA_DEPENDENT:
            raise AssertionError(f"host sync: aten.{name}")
        if name == "lift_fresh" and args[0].dim() > 0:  # a Python scalar (0-d) is a kernel argument, a list is not
            raise AssertionError("host sync: a tensor built from a Python list or tuple")
        if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            raise AssertionError("host sync: boolean indexing (a data-dependent shape)")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def refuse_tolist(monkeypatch):
    def tolist(self):
        raise AssertionError("host sync: Tensor.tolist")

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)


def batch():
    torch.manual_seed(0)
    input_ids = torch.randint(3, 60, (3, 7))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    labels = torch.randint(3, 60, (3, 6))
    labels[2, 4:] = -100
    return input_ids, attention_mask, labels


@pytest.mark.parametrize(
    "kind, copy",
    [("none", None), ("resonance", None), ("scope", None), ("product", "learned"), ("mean", "granularity")],
)
def test_training_step_reads_nothing_on_the_host(kind, copy, refuse_tolist):
    excluded = [5, 9] if copy else None
    model = CDNPGForConditionalGeneration(
        tiny_config(granularity_mask=kind, copy_mechanism=copy, copy_excluded_token_ids=excluded)
    ).train()
    input_ids, attention_mask, labels = batch()
    model(input_ids, attention_mask, labels=labels).loss.backward()  # the first call may build what it keeps
    with RefuseHostSyncs():
        loss = model(input_ids, attention_mask, labels=labels).loss
        loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("kind, copy", [("none", None), ("product", None), ("resonance", "learned")])
def test_cached_decoding_step_reads_nothing_on_the_host(kind, copy, cache_kind, refuse_tolist):
    model = CDNPGForConditionalGeneration(
        tiny_config(granularity_mask=kind, copy_mechanism=copy, copy_excluded_token_ids=[5] if copy else None)
    ).eval()
    input_ids, attention_mask, labels = batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    if cache_kind == "dynamic":
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    else:
        cache = EncoderDecoderCache(
            StaticCache(config=model.config, max_cache_len=8), StaticCache(config=model.config, max_cache_len=7)
        )
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids, attention_mask)
        step = model(
            encoder_outputs=encoder_outputs, decoder_input_ids=decoder_input_ids[:, :2], cache=cache, **inputs
        )
        with RefuseHostSyncs():
            for position in (2, 3):
                step = model(
                    encoder_outputs=encoder_outputs,
                    decoder_input_ids=decoder_input_ids[:, position : position + 1],
                    cache=cache_of(step),
                    logits_to_keep=1,
                    **inputs,
                )
    assert step.logits.shape[:2] == (3, 1)
