"""The granularity bias attention receives (`granularity_bias`, eqs. 4-9 with the layout's N, |i - j| and blocked
keys), eager and compiled alone (`granularity_kernels.fast`, config.compile_granularity_masks), equals the paper's
formulas in value and gradient; when the masks compile (default: on CUDA) and what happens when compiling fails.

The reference is `granularity_mask` (eqs. 6-9, the readable spec) through autograd, log(M) where a key is
visible (-1e4, a weight of exactly 0, where M ≤ 1e-32) and the dtype's minimum where it is blocked, with N of eq. 8 counted key by key. Compared in float64, for every
mask, on encoder-like (padded), decoder-like (causal, left-padded, cached: queries after the first positions) and
cross-attention (i != j, no scope) layouts. Inductor's generated kernels (what a GPU runs, as Triton) are checked on
the layouts that exercise every rule; the other compiled tests run the graphs dynamo traces (backend "eager"),
without inductor's C++ compile: they prove the tracing and the model's wiring, not the kernels.
"""

import math

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from cdnpg.data import load_tokenizer
from modeling_cdnpg import granularity_kernels, modeling_cdnpg
from modeling_cdnpg.modeling_cdnpg import (
    CACHE_NAME,
    MASK_FLOOR,
    ZERO_MASK_BIAS,
    AttentionLayout,
    attention_bias,
    granularity_mask,
)
from tests.conftest import cache_of, tiny_model

KINDS = ("resonance", "scope", "product", "mean")
EPSILON = 2.0
INPUT_IDS = torch.tensor([[5, 9, 13, 7, 21, 30], [8, 14, 3, 40, 0, 0]])
LABELS = torch.tensor([[6, 12, 30, 2], [11, 4, 2, -100]])


@pytest.fixture
def traced(monkeypatch):
    """The compiled masks traced by dynamo (its guards, graphs and specialisations) and run as traced: the model's
    wiring under compilation, without inductor's C++ compile (many seconds per variant on a CPU)."""
    monkeypatch.setattr(granularity_kernels, "COMPILE_BACKEND", "eager")


@pytest.fixture
def compiled_runs(monkeypatch) -> list[str]:
    """The names of the functions that run compiled alone (`CompiledAlone` calls), in order: a count of graphs
    compiled would miss the variants an earlier test of the process compiled."""
    runs, call = [], granularity_kernels.CompiledAlone.__call__

    def recorded(self, *args):
        runs.append(self.function.__name__)
        return call(self, *args)

    monkeypatch.setattr(granularity_kernels.CompiledAlone, "__call__", recorded)
    return runs


def layouts(device: str = "cpu"):
    """(name, layout, number of queries, number of keys) of each kind of attention the model builds."""
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool).to(device)
    all_six, last_two = torch.arange(6, device=device), torch.tensor([4, 5], device=device)
    yield "encoder", AttentionLayout(padding, all_six, 6, causal=False), 6, 6
    yield "decoder", AttentionLayout(padding, all_six, 6, causal=True), 6, 6
    yield "cached step", AttentionLayout(padding, last_two, 6, causal=True), 2, 6
    yield "cross", AttentionLayout(padding[:, :5], all_six[:3], 5, causal=False), 3, 5
    # no padding mask given: N of every query follows from its position alone
    yield "encoder, unpadded", AttentionLayout(None, all_six, 6, causal=False), 6, 6
    yield "decoder, unpadded", AttentionLayout(None, all_six, 6, causal=True), 6, 6
    yield "cached step, unpadded", AttentionLayout(None, last_two, 6, causal=True), 2, 6


def reference_bias(kind, layout, z_query, z_key, dtype=torch.float64):
    """The paper's formula, clamped, logged and masked; N of eq. 8 counted key by key (the real keys each query
    sees) and |i - j| and the blocked keys from the positions, none read from the model's helpers."""
    positions = layout.query_positions
    keys = torch.arange(layout.key_count, device=positions.device)
    real = layout.key_padding
    if real is None:
        real = torch.ones(len(z_query), layout.key_count, dtype=torch.bool, device=positions.device)
    seen = real[:, None, :] & ((keys <= positions[:, None]) if layout.causal else True)  # (b, i, j)
    length = seen.sum(-1, keepdim=True).double() if kind != "resonance" else None
    distance = (positions[:, None] - keys).abs().double()
    mask = granularity_mask(kind, z_query[:, :, None], z_key[:, None, :], length, distance, EPSILON)
    bias = torch.where(mask > MASK_FLOOR, mask.clamp(min=MASK_FLOOR).log(), ZERO_MASK_BIAS)[:, None].to(dtype)
    return bias.masked_fill(~seen[:, None], torch.finfo(dtype).min)


def random_logits(batch, length, seed, device="cpu"):
    """W_G h whose sigmoid z spreads over (0, 1) and beyond 0.5 on both sides: every branch of eqs. 6 and 8 taken."""
    generator = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(batch, length, generator=generator, dtype=torch.float64).to(device)


def assert_bias_equals_the_paper_formula(kind, compiled, names=None, device="cpu"):
    """`attention_bias` of `kind` on the layouts `names` (all by default) against `reference_bias`, in value and in
    the gradient with respect to W_G h of queries and keys."""
    for name, layout, queries, keys in layouts(device):
        if (names and name not in names) or (name == "cross" and kind != "resonance"):
            continue  # cross-attention has the resonance mask only
        logits_query = random_logits(3, queries, 0, device).requires_grad_()
        logits_key = random_logits(3, keys, 1, device).requires_grad_()
        if name.startswith(("encoder", "decoder")):  # self-attention without a cache: one z per token, queries = keys
            logits_key = logits_query
        bias = attention_bias(layout, torch.float64, kind, logits_query, logits_key, EPSILON, compiled=compiled)
        expected = reference_bias(kind, layout, torch.sigmoid(logits_query), torch.sigmoid(logits_key))
        torch.testing.assert_close(bias, expected, rtol=1e-12, atol=1e-12, msg=f"{kind}, {name}")

        upstream = torch.randn(bias.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        upstream = upstream.to(device)
        # the scope mask reads z of the queries alone
        inputs = (logits_query,) if logits_key is logits_query or kind == "scope" else (logits_query, logits_key)
        got = torch.autograd.grad(bias, inputs, upstream)
        want = torch.autograd.grad(expected, inputs, upstream)
        for g, w in zip(got, want, strict=True):
            assert w.abs().max() > 0, "the reference gradient should not vanish in this test"
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"{kind}, {name}")


@pytest.mark.parametrize("kind", KINDS)
def test_the_eager_bias_equals_the_paper_formula_in_value_and_gradient(kind):
    assert_bias_equals_the_paper_formula(kind, compiled=False)


@pytest.mark.parametrize("kind", ["resonance", "product", "mean"])  # product holds resonance and scope
def test_the_bias_compiled_alone_traces_the_paper_formula_in_value_and_gradient(kind, traced):
    assert_bias_equals_the_paper_formula(kind, compiled=True)


def test_inductors_kernels_of_the_bias_equal_the_paper_formula_in_value_and_gradient():
    """The kernels a GPU runs (as Triton; C++ here), on the layout that takes every rule: both masks, padded keys
    (N by a cumulative sum), causality and its blocked keys."""
    torch.compiler.reset()  # inductor from dynamo's first state: after other backends' graphs, torch 2.13 may read
    # an incompatible graph from inductor's on-disk cache
    assert_bias_equals_the_paper_formula("product", compiled=True, names=("decoder",))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["resonance", "product"])
def test_on_cuda_the_default_bias_is_compiled_and_equals_the_paper_formula_in_value_and_gradient(kind, compiled_runs):
    """What a GPU user's model runs by default: the bias compiled by inductor into Triton kernels, on every layout."""
    assert_bias_equals_the_paper_formula(kind, compiled=None, device="cuda")
    assert "granularity_bias" in compiled_runs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_default_model_trains_as_with_eager_masks(compiled_runs):
    """The default configuration on CUDA compiles the masks and the copy formulas: the loss and every gradient of
    a padded batch equal those of the eager masks (compile_granularity_masks=False)."""
    results = {}
    for setting in (False, None):
        overrides = {"granularity_mask": "product", "copy_mechanism": "granularity", "dropout": 0.0}
        model = tiny_model(**overrides, attention_dropout=0.0, compile_granularity_masks=setting).cuda().train()
        inputs = {"input_ids": INPUT_IDS, "attention_mask": (INPUT_IDS != 0).long(), "labels": LABELS}
        loss = model(**{name: tensor.cuda() for name, tensor in inputs.items()}).loss
        loss.backward()
        results[setting] = loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        assert ("granularity_bias" in compiled_runs) is (setting is None)
    (loss, grads), (eager_loss, eager_grads) = results[None], results[False]
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("kind", "backend"), [(kind, None) for kind in KINDS] + [("product", "eager"), ("product", "inductor")]
)
def test_the_bias_in_bfloat16_is_the_rounded_float32_bias_with_a_finite_minimum(kind, backend, monkeypatch):
    """Under bf16 autocast the mask is computed from float32 logits and cast once, eager, traced by dynamo and in
    inductor's kernels (what a GPU runs under autocast); a blocked key gets bf16's minimum, not -inf (a fully blocked
    row attends uniformly instead of producing NaN)."""
    compiled = backend is not None
    if compiled:
        monkeypatch.setattr(granularity_kernels, "COMPILE_BACKEND", backend)
        torch.compiler.reset()  # inductor from dynamo's first state, as in the inductor test above
    _, layout, queries, _ = next(layouts())
    logits = random_logits(3, queries, 5).float()
    bias = attention_bias(layout, torch.bfloat16, kind, logits, logits, EPSILON, compiled=compiled)
    assert bias.dtype == torch.bfloat16
    z = torch.sigmoid(logits)
    torch.testing.assert_close(bias, reference_bias(kind, layout, z, z, torch.bfloat16), rtol=0, atol=0)
    assert bias.isfinite().all()


def test_a_mask_below_the_floor_gives_a_weight_of_exactly_zero_and_no_gradient():
    """Outside the scope window S = 0 < 1e-32: the bias is -1e4, a constant whose softmax weight is exactly 0 (not the
    ~1e-32 of log(1e-32), whose backward products are subnormal floats)."""
    layout = AttentionLayout(None, torch.arange(8), 8, causal=False)
    logits = torch.full((1, 8), 7.0, dtype=torch.float64, requires_grad=True)  # z ≈ 0.999, details: a window of eps
    bias = attention_bias(layout, torch.float64, "scope", logits, logits, EPSILON)
    assert (bias[0, 0, 0, 4:] == ZERO_MASK_BIAS).all() and (bias[0, 0, 0, :3] > math.log(MASK_FLOOR)).all()
    assert (torch.softmax(bias[0, 0, 0], -1)[4:] == 0).all()
    (grad,) = torch.autograd.grad(bias[0, 0, 0, 4:].sum(), logits)
    assert (grad == 0).all()


def train_and_decode(model) -> tuple[torch.Tensor, dict, object, list]:
    """Loss and gradients of a padded batch, a beam search with its step scores, and z of every layer."""
    attention_mask = (INPUT_IDS != 0).long()
    model.train()
    loss = model(input_ids=INPUT_IDS, attention_mask=attention_mask, labels=LABELS).loss
    loss.backward()
    grads = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    model.eval()
    search = model.generate(
        input_ids=INPUT_IDS, attention_mask=attention_mask, num_beams=3, max_new_tokens=6, min_new_tokens=6,
        do_sample=False, output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    with torch.no_grad():
        outputs = model(
            INPUT_IDS, attention_mask, decoder_input_ids=search.sequences[:, :4], output_granularities=True
        )
    z = [outputs.encoder_granularities, outputs.decoder_granularities, outputs.cross_granularities]
    return loss.detach(), grads, search, [layers for layers in z if layers is not None]


@pytest.mark.parametrize("overrides", [{"granularity_mask": "product", "copy_mechanism": "granularity"},
                                       {"granularity_mask": "resonance", "copy_mechanism": "learned",
                                        "copy_excluded_token_ids": [3, 40]},
                                       {"granularity_mask": "scope", "cross_attention_granularity": False}])  # fmt: skip
def test_a_model_with_compiled_masks_trains_and_decodes_as_with_eager_ones(overrides, traced, compiled_runs):
    """config.compile_granularity_masks changes how the masks run, not what the model computes: the same loss and
    gradients on a padded batch, and the same beam search, step scores and z, where every cached step's queries sit
    past the first position (the masks' cached-decoding layout)."""
    runs = {}
    for compiled in (False, True):
        model = tiny_model(**overrides, compile_granularity_masks=compiled, dropout=0.0, attention_dropout=0)
        runs[compiled] = train_and_decode(model)
        assert ("granularity_bias" in compiled_runs) is compiled  # the compiled masks ran, not the eager ones
    (loss, grads, search, z), (eager_loss, eager_grads, eager_search, eager_z) = runs[True], runs[False]
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == eager_grads.keys() and any("granularity_head" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(search.sequences, eager_search.sequences)
    for got, want in zip(search.scores, eager_search.scores, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(z) == len(eager_z) == (3 if overrides.get("cross_attention_granularity", True) else 2)
    for got, want in zip(z, eager_z, strict=True):
        for got_layer, want_layer in zip(got, want, strict=True):
            assert ((want_layer > 0) & (want_layer < 1)).all()
            torch.testing.assert_close(got_layer, want_layer, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["resonance", "product"])
def test_the_cache_keeps_the_granularity_logits_whose_sigmoid_the_masks_apply(kind, traced):
    """Eager and compiled alike, the cache keeps W_G h of each decoder token and of the encoder states, whose sigmoid
    is the z a forward returns (eq. 4), and decoding from it gives the uncached logits."""
    attention_mask = (INPUT_IDS != 0).long()
    prefix = torch.tensor([[2, 17, 6, 9], [2, 11, 30, 4]])
    for compiled in (False, True):
        model = tiny_model(granularity_mask=kind, compile_granularity_masks=compiled, dropout=0.0, attention_dropout=0)
        with torch.no_grad():
            full = model(INPUT_IDS, attention_mask, decoder_input_ids=prefix, output_granularities=True)
            encoded = {
                "attention_mask": attention_mask,
                "encoder_outputs": model.get_encoder()(INPUT_IDS, attention_mask),
            }
            cache = cache_of(model(**encoded, decoder_input_ids=prefix[:, :3], use_cache=True))
            step = model(**encoded, decoder_input_ids=prefix[:, 3:], **{CACHE_NAME: cache}, use_cache=True)
            head = model.model.decoder.layers[-1].encoder_attn.granularity_head
            source_logits = head(full.encoder_last_hidden_state)
        torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-5, atol=1e-5)
        kept = cache.granularity_logits_cache.layers[0].keys[:, 0, :, 0]  # (b, 4)
        torch.testing.assert_close(torch.sigmoid(kept), full.decoder_granularities[0], rtol=1e-6, atol=1e-7)
        cross_kept = cache.cross_granularity_logits_cache.layers[-1].keys[:, 0, :, 0]
        torch.testing.assert_close(cross_kept, source_logits, rtol=1e-6, atol=1e-6)


def test_compiled_masks_compile_every_variant_a_model_needs_and_leave_the_process_limit_alone(traced):
    """Training, beam, greedy (batch of 1) and uncached decoding need more variants of the compiled masks than
    dynamo's default limit of 8: all compile (none falls back to the unfused formula), and the process's
    `recompile_limit` stays as it was, so other compiled functions in the process (flex attention's) keep the limit
    their user set."""
    limit = torch._dynamo.config.recompile_limit
    model = tiny_model(granularity_mask="product", compile_granularity_masks=True, dropout=0.0, attention_dropout=0)
    attention_mask = (INPUT_IDS != 0).long()
    model(input_ids=INPUT_IDS, attention_mask=attention_mask, labels=LABELS).loss.backward()
    model.eval()
    model.generate(input_ids=INPUT_IDS, attention_mask=attention_mask, num_beams=3, max_new_tokens=4)
    model.generate(input_ids=INPUT_IDS[:1], num_beams=1, max_new_tokens=4)
    model.generate(input_ids=INPUT_IDS, attention_mask=attention_mask, max_new_tokens=4, use_cache=False)
    compiled_variants = _debug_get_cache_entry_list(modeling_cdnpg.granularity_bias.__code__)
    assert limit < len(compiled_variants) <= granularity_kernels.COMPILED_VARIANTS
    assert torch._dynamo.config.recompile_limit == limit


def test_on_a_torch_without_a_per_function_limit_the_masks_compile_under_the_process_limit(monkeypatch):
    """torch.compile before `recompile_limit=` (torch < 2.13): called without it; the process's limit is left as
    it is (the variants past it run eagerly), and the values are the paper's."""
    calls = []

    def compile_of_older_torch(function, *, dynamic=None, backend=None):  # no recompile_limit; runs eagerly
        calls.append({"dynamic": dynamic, "backend": backend})
        return function

    monkeypatch.setattr(torch, "compile", compile_of_older_torch)
    limit = torch._dynamo.config.recompile_limit
    layout = AttentionLayout(None, torch.arange(4), 4, causal=True)
    logits = random_logits(1, 4, 0)
    bias = granularity_kernels.CompiledAlone(modeling_cdnpg.granularity_bias, "inductor")(
        "scope", logits, logits, layout, EPSILON, torch.float64
    )
    assert calls == [{"dynamic": True, "backend": "inductor"}]
    assert torch._dynamo.config.recompile_limit == limit
    z = torch.sigmoid(logits)
    torch.testing.assert_close(bias, reference_bias("scope", layout, z, z))


def test_the_default_compiles_the_masks_on_cuda_and_nowhere_else():
    """compile_granularity_masks None (the default) compiles on CUDA, where the model is launch-bound; True and
    False force it either way."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert granularity_kernels.compiles(None, cuda) and not granularity_kernels.compiles(None, cpu)
    assert granularity_kernels.compiles(True, cpu) and not granularity_kernels.compiles(False, cuda)
    assert tiny_model().config.compile_granularity_masks is None


def test_a_default_model_on_a_cpu_compiles_nothing_and_as_on_cuda_compiles_its_masks(
    monkeypatch, traced, compiled_runs
):
    """On a CPU the default model runs its masks and copy formulas eagerly; where the default decides as on CUDA
    (this CPU made one of `COMPILED_BY_DEFAULT_ON`), the same model runs them compiled, with the same loss and
    gradients."""
    results = {}
    for device_type in ("cuda", "cpu"):
        monkeypatch.setattr(granularity_kernels, "COMPILED_BY_DEFAULT_ON", frozenset({"cuda", device_type}))
        compiled_runs.clear()
        model = tiny_model(granularity_mask="product", copy_mechanism="granularity", dropout=0.0, attention_dropout=0)
        loss = model.train()(input_ids=INPUT_IDS, attention_mask=(INPUT_IDS != 0).long(), labels=LABELS).loss
        loss.backward()
        grads = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
        results[device_type] = loss.detach(), grads, set(compiled_runs)
    (eager_loss, eager_grads, eager_runs), (loss, grads, runs) = results["cuda"], results["cpu"]
    assert eager_runs == set() and runs == {"granularity_bias", "copy_attention", "copy_distribution"}
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_when_compiling_fails_the_masks_run_eagerly_after_one_warning(monkeypatch):
    """A torch.compile that fails (no Triton, no C++ compiler, an unsupported Python) leaves the model running: every
    compiled function runs eagerly from then on, with the eager outputs, after one warning naming the error."""
    compiled_calls, warnings = [], []

    def failing_compile(function, **options):
        def compiled(*args):
            compiled_calls.append(function.__name__)
            raise RuntimeError("Cannot find a working triton installation\nmore lines of the compiler's error")

        return compiled

    granularity_kernels.compiled_alone.cache_clear()  # a new CompiledAlone per function: it compiles under the patch
    monkeypatch.setattr(granularity_kernels.CompiledAlone, "failed", False)  # restored after the test
    monkeypatch.setattr(torch, "compile", failing_compile)
    monkeypatch.setattr(granularity_kernels.logger, "warning", warnings.append)
    losses = {}
    for compiled in (False, True, True):
        model = tiny_model(granularity_mask="product", copy_mechanism="learned", compile_granularity_masks=compiled)
        losses.setdefault(compiled, []).append(model(input_ids=INPUT_IDS, labels=LABELS).loss)
    granularity_kernels.compiled_alone.cache_clear()  # later tests compile for real
    assert compiled_calls == ["granularity_bias"], "tried once: then every compiled function runs eagerly"
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "granularity_bias failed (RuntimeError: Cannot find a working triton installation)" in warnings[0]
    for loss in losses[True]:
        torch.testing.assert_close(loss, losses[False][0], rtol=0, atol=0)


def test_run_py_builds_every_model_source_with_compiled_masks_when_asked(tmp_path, tokenizer_dir):
    """--compile_granularity_masks sets the config field of a new model and of a checkpoint to fine-tune (whose
    architecture flags are refused), and leaves the checkpoint's own value where it is not given."""
    from cdnpg.training import parse_args
    from cdnpg.training.model import build_model

    tokenizer = load_tokenizer(tokenizer_dir)
    new = parse_args(["--compile_granularity_masks", "true", "--layers", "1", "--output_dir", "unused"])[0]
    model = build_model(new, tokenizer)
    assert model.config.compile_granularity_masks is True
    model.save_pretrained(tmp_path / "checkpoint")
    for flags, expected in ((["--compile_granularity_masks", "false"], False), ([], True)):
        fine_tune = parse_args(["--model_name_or_path", str(tmp_path / "checkpoint"), *flags, "--output_dir", "x"])[0]
        assert build_model(fine_tune, tokenizer).config.compile_granularity_masks is expected
