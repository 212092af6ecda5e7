"""torch.compile as a first-class path: the training forward of every mask and copy gate and a cached
decoding step are one graph each (`torch._dynamo.explain`: a graph break would run those ops eagerly and split the
CUDA graph); a compiled loss and its gradients equal eager's; beam search with a static cache and a compiled forward
(docs/speed.md, "Compiled decoding") decodes what eager does; `training/run.py --torch_compile true` trains,
evaluates, predicts, saves and resumes. The backends are dynamo's "eager" and "aot_eager" (the same graphs and, for
aot_eager, the same joint forward-backward graph as inductor, without its C++ compilation: minutes on this CPU)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.utils import counters

from cdnpg.training import main
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME
from tests.conftest import tiny_model
from tests.test_training import TINY

# product runs both masks' code (eq. 6 and eq. 8), none the plain attention, and both copy gates
MODELS = [{"granularity_mask": mask} for mask in ("product", "none")] + [
    {"granularity_mask": "resonance", "copy_mechanism": "learned", "copy_excluded_token_ids": [3, 4]},
    {"granularity_mask": "product", "copy_mechanism": "granularity"},
]
NAMES = [":".join(str(value) for value in model.values()) for model in MODELS]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch and leaves no compiled code or counts to the next."""
    torch.compiler.reset()
    counters.clear()
    yield
    torch.compiler.reset()


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two sources, the second padded (the padding bias is part of every graph), and labels with an ignored token."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 60, (2, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    labels = torch.randint(3, 60, (2, 5), generator=generator)
    labels[1, 4] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def assert_one_graph(explained) -> None:
    reasons = [f"{reason.reason} at {reason.user_stack[-1:]}" for reason in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


@pytest.mark.parametrize("overrides", MODELS, ids=NAMES)
def test_the_training_forward_is_one_graph(overrides):
    model = tiny_model(**overrides).train()
    assert_one_graph(torch._dynamo.explain(model)(**batch()))


def test_masks_compiled_alone_inline_into_a_compiled_model_as_one_graph():
    """config.compile_granularity_masks compiles the masks and the copy's formulas on their own in an eager model;
    inside a compiled model the formulas are traced with the rest (no nested compilation, no graph break)."""
    model = tiny_model(granularity_mask="product", copy_mechanism="granularity", compile_granularity_masks=True)
    model.train()
    assert_one_graph(torch._dynamo.explain(model)(**batch()))


@pytest.mark.parametrize("overrides", MODELS, ids=NAMES)
def test_a_cached_decoding_step_is_one_graph(overrides):
    model = tiny_model(**overrides)
    inputs = batch()
    step = {"attention_mask": inputs["attention_mask"], "use_cache": True}
    with torch.no_grad():
        step["encoder_outputs"] = model.get_encoder()(inputs["input_ids"], inputs["attention_mask"])
        first = model(decoder_input_ids=torch.tensor([[1], [1]]), **step)  # fills the cross-attention cache
        step |= {"decoder_input_ids": first.logits[:, -1:].argmax(-1), CACHE_NAME: getattr(first, CACHE_NAME)}
        assert_one_graph(torch._dynamo.explain(model)(**step))


@pytest.mark.parametrize("overrides", MODELS[-2:], ids=NAMES[-2:])  # between them: both masks, both copy gates
def test_a_compiled_loss_and_its_gradients_equal_eager(overrides):
    model = tiny_model(**overrides, dropout=0.0, attention_dropout=0.0).train()
    inputs = batch(1)
    model(**inputs).loss.backward()
    eager = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    expected = model(**inputs).loss.detach()
    model.zero_grad(set_to_none=True)
    loss = torch.compile(model, backend="aot_eager", fullgraph=True)(**inputs).loss
    loss.backward()
    assert counters["stats"]["unique_graphs"] == 1  # the compiled path ran, in one graph
    torch.testing.assert_close(loss.detach(), expected, atol=1e-6, rtol=1e-6)
    compiled = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    assert compiled.keys() == eager.keys()
    for name, grad in compiled.items():
        torch.testing.assert_close(grad, eager[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("overrides", MODELS[:1] + MODELS[-1:], ids=NAMES[:1] + NAMES[-1:])
def test_beam_search_with_a_static_cache_and_a_compiled_forward_decodes_as_eager(overrides):
    """The documented fast decoding path: transformers calls the model's forward at every beam-search step, so the
    compiled forward is what runs; fullgraph=True fails on any graph break."""
    model = tiny_model(**overrides)
    inputs = {key: value for key, value in batch(2).items() if key != "labels"}
    settings = {"num_beams": 4, "max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    eager = model.generate(**inputs, **settings)
    model.forward = torch.compile(model.forward, backend="eager", fullgraph=True)
    compiled = model.generate(**inputs, **settings, cache_implementation="static")
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert torch.equal(compiled, eager)


def test_run_py_with_torch_compile_trains_evaluates_predicts_saves_and_resumes(tmp_path, tokenizer_dir):
    common = [*TINY, "--tokenizer_name", tokenizer_dir, "--torch_compile", "true", "--torch_compile_backend",
              "aot_eager", "--granularity_mask", "product", "--copy_mechanism", "granularity", "--dropout", "0.1",
              "--template_sizes", "64", "8", "8", "--save_steps", "2", "--max_steps", "4", "--do_train"]  # fmt: skip
    straight = tmp_path / "straight"
    metrics = main([*common, "--output_dir", str(straight), "--do_eval", "--do_predict"])
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]  # it trained compiled
    assert {"eval_loss", "test_loss", "test_bleu4"} <= metrics.keys()
    assert len((straight / "predictions.jsonl").read_text().splitlines()) == 8
    saved = load_file(straight / "model.safetensors")
    assert not any("_orig_mod" in name for name in saved)  # the weights of the model, not of its compiled wrapper
    assert json.loads((straight / "config.json").read_text())["granularity_mask"] == "product"

    torch.compiler.reset()
    counters.clear()
    resumed = tmp_path / "resumed"
    main([*common, "--output_dir", str(resumed), "--resume_from_checkpoint", str(straight / "checkpoint-2")])
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == 4
    for name, weight in load_file(resumed / "model.safetensors").items():  # same data, dropout and optimizer state
        torch.testing.assert_close(weight, saved[name], atol=1e-6, rtol=0, msg=name)
