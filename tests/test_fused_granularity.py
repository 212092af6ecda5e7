"""The fused GA mask (`GranularityBias`, and compiled: `compiled_alone`, issue 39) equals the paper's
formulas in value and gradient.

The reference is what the model computed before the fusion: `granularity_mask` (eqs. 6-9, the readable spec) through
autograd, log(max(M, 1e-32)) where a key is visible and the dtype's minimum where it is blocked. Compared in float64,
for every mask, on encoder-like (padded), decoder-like (causal, left-padded, cached: queries after the first
positions) and cross-attention (i != j, no scope) layouts; gradcheck checks the hand-written backward against finite
differences.
"""

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from cdnpg.data import load_tokenizer
from modeling_cdnpg import modeling_cdnpg
from modeling_cdnpg.modeling_cdnpg import (
    CACHE_NAME,
    COMPILED_VARIANTS,
    MASK_FLOOR,
    AttentionLayout,
    GranularityBias,
    attention_bias,
    granularity_mask,
)
from tests.conftest import cache_of, tiny_model

KINDS = ("resonance", "scope", "product", "mean")
EPSILON = 2.0


@pytest.fixture(autouse=True)
def fresh_compiled_masks():
    """Each test compiles the masks it needs anew. The compiled function may compile `COMPILED_VARIANTS`
    variants in a process, and this file's tests need more together (every kind, layout and input form; with what
    earlier test files compiled, torch 2.15 ran past it), beyond which it runs the formula eagerly: a test of the
    compiled path would then check the eager one (a cached step's count of sigmoids found it)."""
    torch.compiler.reset()


def layouts():
    """(name, layout, number of queries, number of keys) of each kind of attention the model builds."""
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    yield "encoder", AttentionLayout.build(padding, torch.arange(6), causal=False), 6, 6
    yield "decoder", AttentionLayout.build(padding, torch.arange(6), causal=True), 6, 6
    yield "cached step", AttentionLayout.build(padding, torch.tensor([4, 5]), causal=True), 2, 6
    yield "cross", AttentionLayout.cross(padding[:, :5], torch.arange(3)), 3, 5
    # no padding mask given (`padded=False`): N of every query follows from its position alone
    everything = torch.ones(3, 6, dtype=torch.bool)
    yield "encoder, unpadded", AttentionLayout.build(everything, torch.arange(6), causal=False, padded=False), 6, 6
    yield "decoder, unpadded", AttentionLayout.build(everything, torch.arange(6), causal=True, padded=False), 6, 6
    cached = AttentionLayout.build(everything, torch.tensor([4, 5]), causal=True, padded=False)
    yield "cached step, unpadded", cached, 2, 6


def reference_bias(kind, layout, z_query, z_key, dtype=torch.float64):
    """What the model computed before the fusion: the paper's formula, clamped, logged and masked; N of eq. 8 counted
    key by key (the real keys each query sees) and |i - j| from the positions, not read from the layout."""
    keys = torch.arange(layout.key_padding.shape[-1])
    positions = layout.query_positions
    seen = layout.key_padding[:, None, :] & ((keys <= positions[:, None]) if layout.causal else True)  # (b, i, j)
    length = seen.sum(-1, keepdim=True).double() if kind != "resonance" else None
    distance = (positions[:, None] - keys).abs().double()
    mask = granularity_mask(kind, z_query[:, :, None], z_key[:, None, :], length, distance, EPSILON)
    bias = mask.clamp(min=MASK_FLOOR).log()[:, None].to(dtype)
    return bias if layout.blocked is None else bias.masked_fill(layout.blocked, torch.finfo(dtype).min)


def random_z(batch, length, seed):
    # spread over (0, 1) and beyond 0.5 on both sides, so that every branch of eqs. 6 and 8 is taken
    generator = torch.Generator().manual_seed(seed)
    return torch.sigmoid(3 * torch.randn(batch, length, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize(
    ("compiled", "logits"),
    [(False, False), (True, False), (True, True), (False, True)],
    ids=["aten", "compiled", "compiled-from-logits", "aten-from-logits"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_fused_bias_equals_the_paper_formula_in_value_and_gradient(kind, compiled, logits):
    """Both fused paths: `GranularityBias`'s aten ops and `compiled_alone`'s generated kernels
    (config.compile_granularity_masks), each on every layout; given z, or given W_G h with eq. 4's sigmoid run with
    the mask (what a model with compiled masks passes), the gradient then taken with respect to W_G h."""
    for name, layout, queries, keys in layouts():
        if name == "cross" and kind != "resonance":
            continue  # cross-attention has the resonance mask only
        z_query = random_z(3, queries, 0)
        z_key = random_z(3, keys, 1)
        if logits:  # W_G h whose sigmoid is the z above
            z_query, z_key = torch.logit(z_query), torch.logit(z_key)
        z_query, z_key = z_query.requires_grad_(), z_key.requires_grad_()
        if name.startswith(("encoder", "decoder")):  # self-attention without a cache: one z per token, queries = keys
            z_key = z_query
        fused = attention_bias(layout, torch.float64, kind, z_query, z_key, EPSILON, compiled=compiled, logits=logits)
        eq4 = torch.sigmoid if logits else lambda z: z
        expected = reference_bias(kind, layout, eq4(z_query), eq4(z_key))
        torch.testing.assert_close(fused, expected, rtol=1e-12, atol=1e-12, msg=f"{kind}, {name}")

        upstream = torch.randn(fused.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        # the scope mask reads z of the queries alone
        inputs = (z_query,) if z_key is z_query or kind == "scope" else (z_query, z_key)
        got = torch.autograd.grad(fused, inputs, upstream)
        want = torch.autograd.grad(expected, inputs, upstream)
        for g, w in zip(got, want):
            assert w.abs().max() > 0, "the reference gradient should not vanish in this test"
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"{kind}, {name}")


@pytest.mark.parametrize("kind", KINDS)
def test_fused_bias_backward_passes_gradcheck(kind):
    layout = AttentionLayout.build(
        torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool), torch.arange(5), causal=True
    )
    base, offset = layout.scope_terms(EPSILON, torch.float64) if kind != "resonance" else (None, None)
    z_query, z_key = random_z(2, 5, 3).requires_grad_(), random_z(2, 5, 4).requires_grad_()

    def bias(z_query, z_key):
        out = GranularityBias.apply(z_query, z_key, kind, base, offset, layout.blocked, torch.float64)
        return out.masked_fill(layout.blocked, 0)  # the blocked entries are a constant: finite differences of 0

    assert torch.autograd.gradcheck(bias, (z_query, z_key))


@pytest.mark.parametrize(("kind", "compiled"), [(kind, False) for kind in KINDS] + [("product", True)])
def test_fused_bias_in_bfloat16_is_the_rounded_float32_bias_with_a_finite_minimum(kind, compiled):
    """Under bf16 autocast the mask is computed from float32 z and cast once; a blocked key gets bf16's minimum,
    not -inf (a fully blocked row attends uniformly instead of producing NaN)."""
    _, layout, queries, _ = next(layouts())
    z = random_z(3, queries, 5).float()
    fused = attention_bias(layout, torch.bfloat16, kind, z, z, EPSILON, compiled=compiled)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused, reference_bias(kind, layout, z, z, torch.bfloat16), rtol=0, atol=0)
    assert fused.isfinite().all()


def test_mask_below_the_floor_has_no_gradient():
    """Outside the scope window S = 0 < 1e-32: the bias is log(1e-32), a constant, as the reference's clamp makes it."""
    layout = AttentionLayout.build(torch.ones(1, 8, dtype=torch.bool), torch.arange(8), causal=False)
    z = torch.full((1, 8), 0.999, dtype=torch.float64, requires_grad=True)  # details: a window of about eps
    fused = attention_bias(layout, torch.float64, "scope", z, z, EPSILON)
    assert (fused[0, 0, 0, 4:] == torch.tensor(MASK_FLOOR, dtype=torch.float64).log()).all()
    (grad,) = torch.autograd.grad(fused[0, 0, 0, 4:].sum(), z)
    assert (grad == 0).all()


@pytest.mark.parametrize("overrides", [{"granularity_mask": "product", "copy_mechanism": "granularity"},
                                       {"granularity_mask": "resonance", "copy_mechanism": "learned",
                                        "copy_excluded_token_ids": [3, 40]},
                                       {"granularity_mask": "scope", "cross_attention_granularity": False}])  # fmt: skip
def test_a_model_with_compiled_masks_trains_and_decodes_as_with_the_default_ones(overrides):
    """config.compile_granularity_masks changes how the masks run, not what the model computes: the same loss and
    gradients on a padded batch, and the same beam search, step scores and z, where every cached step's queries sit
    past the first position (the masks' cached-decoding layout)."""
    counters.clear()
    models = {}
    for compiled in (False, True):
        models[compiled] = tiny_model(
            **overrides, compile_granularity_masks=compiled, dropout=0.0, attention_dropout=0
        )
    input_ids = torch.tensor([[5, 9, 13, 7, 21, 30], [8, 14, 3, 40, 0, 0]])
    attention_mask = (input_ids != 0).long()
    labels = torch.tensor([[6, 12, 30, 2], [11, 4, 2, -100]])
    losses, grads, searches, z = {}, {}, {}, {}
    for compiled, model in models.items():
        model.train()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        losses[compiled] = loss.detach()
        grads[compiled] = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
        model.eval()
        searches[compiled] = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=6, min_new_tokens=6,
            do_sample=False, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        with torch.no_grad():  # z of every layer: the sigmoid of what the compiled masks keep and read, W_G h
            prefix = searches[compiled].sequences[:, :4]
            outputs = model(input_ids, attention_mask, decoder_input_ids=prefix, output_granularities=True)
            z[compiled] = [outputs[name] for name in ("encoder_granularities", "decoder_granularities")]
            if overrides.get("cross_attention_granularity", True):
                z[compiled].append(outputs.cross_granularities)
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled masks ran, not the aten ones
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-6, atol=1e-6)
    assert grads[True].keys() == grads[False].keys()
    assert any("granularity_head" in name for name in grads[True])
    for name, grad in grads[True].items():
        torch.testing.assert_close(grad, grads[False][name], rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(searches[True].sequences, searches[False].sequences)
    for got, want in zip(searches[True].scores, searches[False].scores, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(z[True], z[False], strict=True):
        assert len(got) == len(want) == 2
        for got_layer, want_layer in zip(got, want, strict=True):
            assert ((want_layer > 0) & (want_layer < 1)).all()
            torch.testing.assert_close(got_layer, want_layer, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["resonance", "product"])
def test_compiled_masks_run_the_sigmoid_of_eq4_inside_their_kernel_and_keep_its_logit_in_the_cache(kind):
    """With the masks compiled, a cached decoding step launches no sigmoid of its own (eq. 4's runs inside each
    mask's kernel; the default masks launch one per attention module), and the cache keeps W_G h, whose sigmoid is
    the z a forward returns; decoding from it gives the uncached logits."""
    input_ids = torch.tensor([[5, 9, 13, 7, 21, 30], [8, 14, 3, 40, 0, 0]])
    attention_mask = (input_ids != 0).long()
    prefix = torch.tensor([[2, 17, 6, 9], [2, 11, 30, 4]])
    sigmoids = {}
    for compiled in (False, True):
        model = tiny_model(granularity_mask=kind, compile_granularity_masks=compiled, dropout=0.0, attention_dropout=0)
        model.eval()
        with torch.no_grad():
            full = model(input_ids, attention_mask, decoder_input_ids=prefix, output_granularities=True)
            encoded = {
                "attention_mask": attention_mask,
                "encoder_outputs": model.get_encoder()(input_ids, attention_mask),
            }
            cache = cache_of(model(**encoded, decoder_input_ids=prefix[:, :2], use_cache=True))
            model(**encoded, decoder_input_ids=prefix[:, 2:3], **{CACHE_NAME: cache}, use_cache=True)
            with torch.profiler.profile() as profile:  # every variant the step needs was compiled by the step before
                step = model(**encoded, decoder_input_ids=prefix[:, 3:], **{CACHE_NAME: cache}, use_cache=True)
        sigmoids[compiled] = sum(event.name == "aten::sigmoid" for event in profile.events())
        torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-5, atol=1e-5)
        kept = cache.granularity_cache.layers[0].keys[:, 0, :, 0]  # (b, 4)
        z = full.decoder_granularities[0]
        torch.testing.assert_close(torch.sigmoid(kept) if compiled else kept, z, rtol=1e-6, atol=1e-7)
        cross_kept = cache.cross_granularity_cache.layers[-1].keys[:, 0, :, 0]
        with torch.no_grad():
            head = model.model.decoder.layers[-1].encoder_attn.granularity_head
            encoder_states = full.encoder_last_hidden_state
            torch.testing.assert_close(cross_kept, head(encoder_states, logits=compiled), rtol=1e-6, atol=1e-6)
    modules = 2 * model.config.decoder_layers  # self- and cross-attention of each decoder layer
    assert sigmoids == {False: modules, True: 0}


def test_compiled_masks_compile_every_variant_a_model_needs_and_leave_the_process_limit_alone():
    """Training, beam, greedy (batch of 1) and uncached decoding need more variants of the compiled masks than
    dynamo's default limit of 8: all compile (none falls back to the unfused formula), and the process's
    `recompile_limit` stays as it was, so other compiled functions in the process (flex attention's) keep the limit
    their user set (raising it process-wide changed flex attention's decoding in another test)."""
    limit = torch._dynamo.config.recompile_limit
    model = tiny_model(granularity_mask="product", compile_granularity_masks=True, dropout=0.0, attention_dropout=0)
    input_ids = torch.tensor([[5, 9, 13, 7, 21, 30], [8, 14, 3, 40, 0, 0]])
    attention_mask = (input_ids != 0).long()
    labels = torch.tensor([[6, 12, 30, 2], [11, 4, 2, -100]])
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    model.eval()
    model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=4)
    model.generate(input_ids=input_ids[:1], num_beams=1, max_new_tokens=4)
    model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, use_cache=False)
    compiled_variants = _debug_get_cache_entry_list(modeling_cdnpg.granularity_bias_in_layout.__code__)
    assert limit < len(compiled_variants) <= COMPILED_VARIANTS
    assert torch._dynamo.config.recompile_limit == limit


def test_compiled_masks_on_a_torch_without_a_per_function_limit_raise_it_only_during_each_call(monkeypatch):
    """torch.compile before `recompile_limit=` (torch < 2.13): the limit is patched around each call, not left set."""
    limits_seen = []

    def compile_of_older_torch(model, *, dynamic=None):  # no recompile_limit; runs eagerly to watch the config
        return model

    def spy(*args):
        limits_seen.append(torch._dynamo.config.recompile_limit)
        return granularity_bias_in_layout(*args)

    granularity_bias_in_layout = modeling_cdnpg.granularity_bias_in_layout
    monkeypatch.setattr(torch, "compile", compile_of_older_torch)
    layout = AttentionLayout.build(torch.ones(1, 4, dtype=torch.bool), torch.arange(4), causal=True)
    z = random_z(1, 4, 0)
    # config.patch, not monkeypatch: monkeypatch's undo left dynamo's config without recompile_limit (seen in CI)
    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default
        build = modeling_cdnpg.compiled_alone.__wrapped__(spy)  # uncached: built with the older signature
        bias = build("scope", z, z, None, layout.query_positions, True, EPSILON, None, torch.float64)
        assert torch._dynamo.config.recompile_limit == 8
    torch.testing.assert_close(bias, reference_bias("scope", layout, z, z))
    assert limits_seen == [COMPILED_VARIANTS]


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
