"""The model as a transformers model: equivalences (cache, SDPA/eager, padding, save/load), robustness, the contract."""

from collections import Counter

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration, CDNPGModel
from modeling_cdnpg.modeling_cdnpg import AttentionLayout, CDNPGAttention, shift_tokens_right
from tests.conftest import BOS, EOS, MASKS, PAD, cache_of, tiny_config, tiny_model

GA_MASKS = [m for m in MASKS if m != "none"]


def batch(lengths=(7, 4, 2), seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sentences of the given lengths: [BOS] tokens [EOS] [PAD]..."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, 60, (length,), generator=generator)
        ids[row, 0], ids[row, length - 1] = BOS, EOS
    return ids, (ids != PAD).long()


@pytest.mark.parametrize("kind", MASKS)
def test_padded_batch_equals_each_sentence_alone(kind):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 5))
    with torch.no_grad():
        together = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        for row in range(3):
            n = int(attention_mask[row].sum())
            alone = model(input_ids[row : row + 1, :n], decoder_input_ids=decoder_input_ids[row : row + 1]).logits
            torch.testing.assert_close(together[row], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["log_bias", "multiply"])
@pytest.mark.parametrize("kind", MASKS)
def test_incremental_decoding_with_cache_equals_full_forward(kind, mode):
    model = tiny_model(granularity_mask=kind, granularity_mask_mode=mode)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 9))
    with torch.no_grad():
        full = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False).logits
        encoder_outputs = model.get_encoder()(input_ids, attention_mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                attention_mask=attention_mask,
                encoder_outputs=encoder_outputs,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = cache_of(out)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]


def test_cache_prefill_then_steps_equals_full_forward():
    model = tiny_model(granularity_mask="product")
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 8))
    with torch.no_grad():
        full = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        prefill = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids[:, :5], use_cache=True)
        rest = model(
            attention_mask=attention_mask,
            encoder_outputs=(prefill.encoder_last_hidden_state,),
            decoder_input_ids=decoder_input_ids[:, 5:],
            cache=cache_of(prefill),
            use_cache=True,
        )
    torch.testing.assert_close(torch.cat([prefill.logits, rest.logits], dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", MASKS)
def test_sdpa_path_equals_eager_path(kind):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 6))
    with torch.no_grad():
        assert model.config._attn_implementation == "sdpa"
        sdpa = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        # output_attentions=True forces the eager path and returns probabilities
        eager = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True)
    torch.testing.assert_close(sdpa, eager.logits, atol=1e-5, rtol=0)
    for weights in eager.encoder_attentions + eager.decoder_attentions + eager.cross_attentions:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)


def test_eager_attn_implementation_equals_sdpa():
    sdpa = tiny_model(granularity_mask="mean")
    eager = tiny_model(granularity_mask="mean")
    eager.config._attn_implementation = "eager"
    assert sdpa.config._attn_implementation == "sdpa"
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 6))
    with torch.no_grad():
        a = sdpa(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        b = eager(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_multiply_mode_is_literal_eq9_without_renormalisation():
    model = tiny_model(granularity_mask="product", granularity_mask_mode="multiply")
    input_ids, attention_mask = batch()
    with torch.no_grad():
        out = model(input_ids, attention_mask, decoder_input_ids=input_ids, output_attentions=True)
    row_sums = out.encoder_attentions[0].sum(-1)
    assert (row_sums < 1 - 1e-3).any(), "the literal eq. 9 does not renormalise rows"
    assert (row_sums <= 1 + 1e-6).all()


def test_none_mask_is_plain_scaled_dot_product_attention():
    config = tiny_config(granularity_mask="none")
    model = CDNPGForConditionalGeneration(config)
    assert not [name for name, _ in model.named_parameters() if "granularity" in name]

    torch.manual_seed(1)
    module = CDNPGAttention(config, num_heads=4, layer_idx=0, mask_kind="none").eval()
    hidden = torch.randn(2, 5, 32)
    key_padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        output, _, z = module(hidden, AttentionLayout(key_padding, torch.arange(5), 5, causal=False))
        q, k, v = (p(hidden).view(2, 5, 4, 8).transpose(1, 2) for p in (module.q_proj, module.k_proj, module.v_proj))
        scores = q @ k.transpose(-1, -2) / 8**0.5
        scores = scores.masked_fill(~key_padding[:, None, None, :], float("-inf"))
        expected = module.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 32))
    assert z is None
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)


def test_none_without_masks_lets_sdpa_choose_its_kernel_and_equals_the_masked_path(monkeypatch):
    """`none` builds no float mask where nothing is padded: SDPA gets no mask in the encoder and the
    cross-attention when no attention_mask is given, and `is_causal` in the decoder's first pass, so that it may pick
    a fused kernel as it does for BART. The outputs equal those of all-ones masks and of the eager path."""
    model = tiny_model(granularity_mask="none")
    input_ids = torch.randint(3, 60, (2, 6))
    decoder_input_ids = torch.randint(3, 60, (2, 5))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    with torch.no_grad():
        unmasked = model(input_ids, decoder_input_ids=decoder_input_ids).logits
        assert len(calls) == 6 and all(mask is None for mask, _ in calls), "2 encoder + 2x2 decoder modules, no mask"
        assert [causal for _, causal in calls] == [False, False, True, False, True, False]
        ones = torch.ones_like(input_ids)
        masked = model(input_ids, ones, decoder_input_ids=decoder_input_ids, decoder_attention_mask=ones[:, :5]).logits
        model.set_attn_implementation("eager")
        eager = model(input_ids, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(unmasked, masked, atol=1e-6, rtol=0)
    torch.testing.assert_close(unmasked, eager, atol=1e-6, rtol=0)


def test_none_builds_one_padding_bias_per_stack_from_the_padding_alone_and_none_that_sdpa_does_not_take():
    """`none` at BART's kernel count: with a padded source and no decoder mask, the encoder's self-attention layers
    share one padding bias, and the decoder's cross-attention layers another, each built from the padding itself (a
    fill and a masked fill, no negation of it); the decoder's first pass, which SDPA takes as `is_causal`, builds
    none. Given encoder outputs, the decoder builds its one."""
    model = tiny_model(granularity_mask="none")
    input_ids, attention_mask = batch()
    decoder_input_ids = input_ids[:, :5]
    with torch.no_grad(), torch.profiler.profile() as profile:
        model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids)
    ops = Counter(event.name for event in profile.events())
    assert (ops["aten::full"], ops["aten::masked_fill_"]) == (2, 2)
    assert ops["aten::bitwise_not"] == ops["aten::gt"] == ops["aten::zeros"] == 0
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids, attention_mask)
        with torch.profiler.profile() as profile:
            model(attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, encoder_outputs=encoder_outputs)
    ops = Counter(event.name for event in profile.events())
    assert (ops["aten::full"], ops["aten::masked_fill_"]) == (1, 1)


@pytest.mark.parametrize("kind", MASKS)
def test_the_decoder_given_encoder_outputs_gives_the_logits_and_gradients_of_one_whole_forward(kind):
    """The decoder's cross-attention reads the source's padding from the mask it is given, in one forward as over
    encoder outputs computed before: same logits and gradients, with a padded source."""
    torch.manual_seed(0)
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    labels = input_ids[:, 1:]

    def run(whole: bool):
        model.zero_grad()
        if whole:
            out = model(input_ids, attention_mask, labels=labels)
        else:
            encoder_outputs = model.get_encoder()(input_ids, attention_mask)
            out = model(attention_mask=attention_mask, encoder_outputs=encoder_outputs, labels=labels)
        out.loss.backward()
        return out.logits, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (whole_logits, whole_grads), (own_logits, own_grads) = run(True), run(False)
    torch.testing.assert_close(whole_logits, own_logits, rtol=0, atol=0)
    assert len(whole_grads) == len(own_grads)
    for whole_grad, own_grad in zip(whole_grads, own_grads):
        torch.testing.assert_close(whole_grad, own_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_the_padding_bias_is_zero_where_a_key_is_visible_and_the_dtypes_minimum_where_it_is_blocked(causal, dtype):
    key_padding = torch.tensor([[True, True, True, False], [True, False, False, False]])
    layout = AttentionLayout(key_padding, torch.arange(4), 4, causal=causal)
    visible = key_padding[:, None, None, :] & (
        torch.arange(4)[None, :] <= torch.arange(4)[:, None] if causal else True
    )
    expected = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype).expand(2, 1, 4 if causal else 1, 4)
    bias = layout.padding_bias(dtype)
    assert bias.dtype == dtype
    assert torch.equal(bias, expected)
    assert AttentionLayout(None, torch.arange(4), 4, causal=False).padding_bias(dtype) is None


def test_cross_attention_granularity_is_switchable():
    with_cross = CDNPGForConditionalGeneration(tiny_config(granularity_mask="scope"))
    without = CDNPGForConditionalGeneration(tiny_config(granularity_mask="scope", cross_attention_granularity=False))
    assert with_cross.model.decoder.layers[0].encoder_attn.mask_kind == "resonance"
    assert without.model.decoder.layers[0].encoder_attn.granularity_head is None
    assert without.model.decoder.layers[0].self_attn.mask_kind == "scope"


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("length", [1, 2])
def test_one_and_two_token_inputs_are_finite(kind, length):
    model = tiny_model(granularity_mask=kind)
    input_ids = torch.tensor([[BOS, EOS][:length]])
    with torch.no_grad():
        out = model(input_ids, decoder_input_ids=torch.tensor([[BOS]]), output_granularities=kind != "none")
        generated = model.generate(input_ids, max_new_tokens=4, num_beams=2)
    assert torch.isfinite(out.logits).all()
    assert generated.shape[0] == 1


def test_input_of_only_special_tokens_and_fully_padded_rows_are_finite():
    model = tiny_model(granularity_mask="product")
    input_ids = torch.tensor([[BOS, EOS, PAD], [PAD, PAD, PAD]])
    with torch.no_grad():
        out = model(input_ids, (input_ids != PAD).long(), decoder_input_ids=torch.tensor([[BOS], [BOS]]))
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("kind", MASKS)
def test_bf16_autocast_gives_finite_outputs_and_gradients(kind):
    model = tiny_model(granularity_mask=kind).train()
    input_ids, attention_mask = batch(lengths=(7, 1, 2))
    labels = torch.randint(3, 60, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids, attention_mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.logits.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "kind, copy", [(kind, None) for kind in MASKS] + [("none", "learned"), ("resonance", "learned"),
                                                      ("resonance", "granularity")]
)  # fmt: skip
def test_a_float64_model_computes_in_float64_what_the_float32_model_computes(kind, copy, implementation):
    """z, the masks and the copy mixture are computed in at least float32, never cast down: a float64 model (as in a
    gradient check or a rounding-free comparison) ran into an overflow building the mask, and its z was float32."""
    model = tiny_model(granularity_mask=kind, copy_mechanism=copy)
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 5))
    with torch.no_grad():
        single = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, output_granularities=True)
        double = model.double()(input_ids, attention_mask, decoder_input_ids=decoder_input_ids,
                                output_granularities=True)  # fmt: skip
    assert double.logits.dtype == torch.float64
    if kind != "none":
        assert {z.dtype for z in double.encoder_granularities + double.decoder_granularities} == {torch.float64}
    torch.testing.assert_close(double.logits.float(), single.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", GA_MASKS)
def test_every_granularity_head_receives_a_gradient(kind):
    model = tiny_model(granularity_mask=kind).train()
    input_ids, attention_mask = batch()
    model(input_ids, attention_mask, labels=torch.randint(3, 60, (3, 6))).loss.backward()
    heads = {name: p.grad for name, p in model.named_parameters() if "granularity_head.proj.weight" in name}
    assert len(heads) == 3 * 2  # encoder self, decoder self, decoder cross; 2 layers each
    for name, grad in heads.items():
        assert grad is not None and grad.abs().sum() > 0, name


def test_granularities_are_returned_for_every_layer():
    model = tiny_model(granularity_mask="resonance")
    input_ids, attention_mask = batch()
    out = model(input_ids, attention_mask, decoder_input_ids=torch.randint(3, 60, (3, 4)), output_granularities=True)
    assert len(out.encoder_granularities) == len(out.decoder_granularities) == len(out.cross_granularities) == 2
    assert out.encoder_granularities[0].shape == (3, 7)
    assert out.decoder_granularities[0].shape == out.cross_granularities[0].shape == (3, 4)
    z = torch.cat([g.flatten() for g in out.encoder_granularities])
    assert ((z > 0) & (z < 1)).all()
    assert model(input_ids, attention_mask, decoder_input_ids=input_ids).encoder_granularities is None


def test_loss_is_mean_token_loss_and_honours_num_items_in_batch():
    model = tiny_model()
    input_ids, attention_mask = batch()
    labels = torch.randint(3, 60, (3, 5))
    labels[1, 3:] = -100
    with torch.no_grad():
        out = model(input_ids, attention_mask, labels=labels)
        expected = torch.nn.functional.cross_entropy(out.logits.view(-1, 60), labels.view(-1), ignore_index=-100)
        summed = model(input_ids, attention_mask, labels=labels, num_items_in_batch=26).loss
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(summed, expected * 13 / 26)


def test_loss_accepts_non_contiguous_labels():
    model = tiny_model()
    input_ids, attention_mask = batch()
    targets = torch.randint(3, 60, (3, 7))
    labels = targets[:, 1:]  # e.g. tokenizer output with its leading [CLS] sliced off
    assert not labels.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids, attention_mask, labels=labels).loss,
            model(input_ids, attention_mask, labels=labels.contiguous()).loss,
        )


def test_decoder_inputs_are_labels_shifted_right():
    labels = torch.tensor([[5, 6, EOS, -100]])
    assert shift_tokens_right(labels, PAD, BOS).tolist() == [[BOS, 5, 6, EOS]]
    model = tiny_model()
    input_ids, attention_mask = batch(lengths=(5,))
    with torch.no_grad():
        from_labels = model(input_ids, attention_mask, labels=labels).logits
        explicit = model(input_ids, attention_mask, decoder_input_ids=torch.tensor([[BOS, 5, 6, EOS]])).logits
    torch.testing.assert_close(from_labels, explicit)


def test_save_and_load_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_model(granularity_mask="mean")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = CDNPGForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.to_diff_dict() | {"_name_or_path": ""} == model.config.to_diff_dict() | {"_name_or_path": ""}
    expected = model.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in loaded.state_dict().items())
    input_ids, attention_mask = batch()
    with torch.no_grad():
        a = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        b = loaded(input_ids, attention_mask, decoder_input_ids=input_ids).logits
    # bitwise-equal weights; BLAS may pick another kernel for the memory-mapped tensors (differences ~1e-8)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.shared.weight.data_ptr()
    assert (
        loaded.model.encoder.embed_tokens.weight is loaded.model.decoder.embed_tokens.weight is loaded.lm_head.weight
    )


@pytest.mark.parametrize("kind", ["resonance", "none"])
def test_generate_greedy_beam_sampling_and_multiple_returns(kind):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=6)
    greedy = model.generate(input_ids, **kwargs)
    beams = model.generate(input_ids, num_beams=8, num_return_sequences=3, **kwargs)
    again = model.generate(input_ids, num_beams=8, num_return_sequences=3, **kwargs)
    torch.manual_seed(0)
    sampled = model.generate(input_ids, do_sample=True, top_k=10, **kwargs)
    assert greedy.shape[0] == 3 and sampled.shape[0] == 3 and beams.shape[0] == 9
    assert torch.equal(beams, again)
    assert (greedy[:, 0] == BOS).all()


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam search"])
@pytest.mark.parametrize("kind", MASKS)
def test_generate_with_cache_equals_without_cache(kind, num_beams):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=8, num_beams=num_beams)
    assert torch.equal(
        model.generate(input_ids, use_cache=True, **kwargs), model.generate(input_ids, use_cache=False, **kwargs)
    )


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask = batch()
    labels = torch.randint(3, 60, (3, 5))
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(granularity_mask="product", dropout=0.0, attention_dropout=0.0).train()
        if checkpointing:
            # transformers 5.24 renamed gradient_checkpointing_enable; 4.57 has only the old name
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model(input_ids, attention_mask, labels=labels).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_resize_token_embeddings_keeps_the_three_ties():
    model = tiny_model()
    model.resize_token_embeddings(70)
    assert model.config.vocab_size == 70
    assert model.lm_head.weight.shape == (70, 32)
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert model.model.decoder.embed_tokens.weight.shape == (70, 32)
    with torch.no_grad():
        assert model(torch.tensor([[BOS, 65, EOS]]), decoder_input_ids=torch.tensor([[BOS]])).logits.shape[-1] == 70


def test_weights_are_initialised_as_documented():
    model = CDNPGForConditionalGeneration(
        tiny_config(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
    )
    fc1 = model.model.encoder.layers[0].fc1
    assert fc1.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.equal(fc1.bias, torch.zeros_like(fc1.bias))
    assert torch.equal(model.model.shared.weight[PAD], torch.zeros(64))
    norm = model.model.encoder.layers[0].final_layer_norm
    assert torch.equal(norm.weight, torch.ones(64))


def test_auto_classes_know_the_model_after_import(tmp_path):
    config = tiny_config()
    assert isinstance(AutoConfig.for_model("cdnpg"), CDNPGConfig)
    assert type(AutoModel.from_config(config)) is CDNPGModel
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is CDNPGForConditionalGeneration


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("granularity_mask", "both", "granularity_mask must be one of"),
        ("granularity_mask_mode", "add", "granularity_mask_mode must be one of"),
        ("scope_epsilon", 0.0, "scope_epsilon must be > 0"),
        ("compile_granularity_masks", "yes", r"compile_granularity_masks must be one of \(None, True, False\)"),
        ("encoder_attention_heads", 5, "encoder_attention_heads must be a positive integer dividing d_model=32"),
        ("decoder_layers", 0, "decoder_layers must be an integer >= 1"),
        ("dropout", 1.5, "dropout must be in"),
    ],
)
def test_invalid_config_values_raise_value_error_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{field: value})


def test_over_long_input_is_refused_with_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        model(torch.ones(1, 65, dtype=torch.long), decoder_input_ids=torch.tensor([[BOS]]))


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_decoder_mask_that_misses_the_cached_or_new_positions_is_refused_naming_its_length(static):
    """A dynamic cache's mask covers exactly the cached and new positions (3 here, not 2); a static cache's at least
    the new ones and at most its capacity (4 here, not 6)."""
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache

    model = tiny_model().eval()
    source = torch.tensor([[BOS, 7, 8, EOS]])
    capacity = StaticCache(config=model.config, max_cache_len=4) if static else DynamicCache()
    cache = cache_of(
        model(
            source,
            decoder_input_ids=torch.tensor([[BOS, 7]]),
            cache=EncoderDecoderCache(capacity, DynamicCache()),
            use_cache=True,
        )
    )
    short = 6 if static else 2
    with pytest.raises(ValueError, match=f"decoder_attention_mask covers {short} positions"):
        model(source, decoder_input_ids=torch.tensor([[8]]), decoder_attention_mask=torch.ones(1, short), cache=cache)


def test_the_default_config_is_the_papers_model_of_27_057_903_parameters():
    # d 450, FFN 1024, 3 + 3 layers, vocabulary 30522 (one embedding shared by both stacks and the LM head), 512
    # learned positions per stack. Attention 4 * (450 * 450 + 450) = 811,800; W_G 451; LayerNorm 900; FFN
    # 450 * 1024 + 1024 + 1024 * 450 + 450 = 923,074. Encoder layer: attention, W_G, FFN, 2 LayerNorms = 1,737,125;
    # decoder layer: + cross-attention, its W_G and LayerNorm = 2,550,276. 30522 * 450 + 2 * 512 * 450
    # + 3 * 1,737,125 + 3 * 2,550,276 = 27,057,903 (docs/speed.md).
    model = CDNPGForConditionalGeneration(CDNPGConfig())
    assert model.num_parameters() == 27_057_903
