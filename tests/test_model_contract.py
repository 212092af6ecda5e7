"""transformers' model contract, in the project's own words: what its common model and generation tests check of every
model (weight ties, output flags, the cache layout, static caches and compilation, attention backends,
logits_to_keep), plus what users of BERT tokenizers need (token_type_ids)."""

import copy
import inspect
import re
import typing

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AttentionInterface, DynamicCache, EncoderDecoderCache, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import Seq2SeqLMOutput

from modeling_cdnpg import CDNPGForConditionalGeneration, CDNPGModel, granularity_kernels
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME, GranularityCache
from tests.conftest import MASKS, cache_of, tiny_model
from tests.test_hub import PYTHONS, run_isolated
from tests.test_modeling import batch

GENERATION = dict(max_new_tokens=6, min_new_tokens=6)  # a fixed number of steps: no early EOS hides a difference


def test_untied_embeddings_round_trip_with_equal_logits(tmp_path):
    model = tiny_model(tie_word_embeddings=False)
    weights = {
        "shared": model.model.shared.weight,
        "encoder": model.model.encoder.embed_tokens.weight,
        "decoder": model.model.decoder.embed_tokens.weight,
        "lm_head": model.lm_head.weight,
    }
    assert len({tensor.data_ptr() for tensor in weights.values()}) == 4, "untied: four matrices"
    model.save_pretrained(tmp_path)
    loaded, info = CDNPGForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    input_ids, attention_mask = batch()
    with torch.no_grad():
        expected = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        got = loaded.eval()(input_ids, attention_mask, decoder_input_ids=input_ids).logits
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_tied_checkpoint_stores_the_embedding_once_and_ties_it_again_on_load(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    embedding_keys = {key for key in stored if "embed_tokens" in key or "shared" in key or "lm_head" in key}
    assert embedding_keys == {"model.shared.weight"}
    loaded, info = CDNPGForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set()
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared and loaded.model.encoder.embed_tokens.weight is shared


@pytest.mark.parametrize("model_class", [CDNPGModel, CDNPGForConditionalGeneration])
def test_loading_report_lists_every_missing_weight(model_class, tmp_path):
    """A checkpoint whose weights are gone is reported as such: nothing is hidden by ignore-lists or ties."""
    model = model_class(tiny_model().config)
    model.save_pretrained(tmp_path)
    save_file({"unrelated": torch.zeros(2)}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    source = "shared.weight" if model_class is CDNPGModel else "model.shared.weight"
    assert source in info["missing_keys"]
    assert {name for name, _ in model.named_parameters()} <= info["missing_keys"] | {
        name for name in model.state_dict() if "embed_tokens" in name or name == "lm_head.weight"
    }


def test_config_output_flags_are_honoured_and_arguments_override_them():
    model = tiny_model(output_attentions=True, output_hidden_states=True)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        out = model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :4])
        off = model(
            input_ids,
            attention_mask,
            decoder_input_ids=input_ids[:, :4],
            output_attentions=False,
            output_hidden_states=False,
        )
    layers = model.config.encoder_layers
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == layers
    assert out.encoder_attentions[0].shape == (3, 4, 7, 7)
    assert out.cross_attentions[0].shape == (3, 4, 4, 7)
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == layers + 1
    assert off.encoder_attentions is off.cross_attentions is off.decoder_hidden_states is None


def test_arguments_after_the_attention_mask_are_keyword_only():
    """A third positional argument would otherwise land on whatever parameter comes third (labels, say) and be used
    silently as something else."""
    model = tiny_model()
    input_ids, attention_mask = batch()
    with pytest.raises(TypeError, match="positional"):
        model(input_ids, attention_mask, input_ids)
    with pytest.raises(TypeError, match="positional"):
        model.get_encoder()(input_ids, attention_mask, True)
    with torch.no_grad():  # by keyword, every argument of the bare model reaches it through the LM head
        out = model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :3], output_granularities=True)
        bare = model.model(input_ids, attention_mask, input_ids[:, :3], output_granularities=True)
    torch.testing.assert_close(out.logits, model.lm_head(bare.last_hidden_state))
    assert len(out.encoder_granularities) == len(bare.decoder_granularities) == model.config.encoder_layers


def test_transformers_finds_the_arguments_it_looks_up_by_name():
    """generate(), Trainer and transformers' common tests decide what a model takes from its forward signature,
    including the TypedDict behind **kwargs (output_attentions)."""
    model = tiny_model()
    parameters = inspect.signature(model.forward).parameters
    assert {"input_ids", "attention_mask", "inputs_embeds", "encoder_outputs", "labels", "logits_to_keep"} <= set(
        parameters
    )
    assert "output_attentions" in typing.get_args(parameters["kwargs"].annotation)[0].__annotations__
    input_ids, attention_mask = batch()
    out = model.generate(
        input_ids, attention_mask=attention_mask, output_attentions=True, return_dict_in_generate=True, **GENERATION
    )
    assert len(out.encoder_attentions) == model.config.encoder_layers
    decoder_input_ids = input_ids[:, :4]
    with torch.no_grad():
        by_ids = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        embeds = model.get_input_embeddings()(input_ids)
        by_embeds = model(inputs_embeds=embeds, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(by_embeds.logits, by_ids)


def test_generate_passes_the_encoder_only_what_it_names_as_the_seq2seq_trainer_calls_it():
    """`Seq2SeqTrainer.prediction_step` calls `generate(**inputs)` with the labels in them; `generate()` hands an encoder
    whose forward takes no **kwargs only the arguments it names, so they decode as without labels."""
    model = tiny_model()
    input_ids, attention_mask = batch()
    labels = torch.randint(3, 60, (3, 4))
    with_labels = model.generate(input_ids, attention_mask=attention_mask, labels=labels, max_new_tokens=4)
    assert torch.equal(with_labels, model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4))
    with pytest.raises(TypeError, match="labels"):
        model.get_encoder()(input_ids, attention_mask, labels=labels)


@pytest.mark.parametrize("unused", ["kv_cache", "decoder_position_ids", "position_ids"])
def test_an_argument_the_model_does_not_use_is_refused_naming_it_and_the_transformers_version(unused):
    """What a later transformers might pass under a new name fails loudly instead of being dropped (5.24's `cache`
    was dropped, and decoding ran without it)."""
    model = tiny_model()
    input_ids, attention_mask = batch()
    version = re.escape(transformers.__version__)
    with pytest.raises(
        TypeError, match=rf"got argument\(s\) C-DNPG does not use: {unused} \(transformers {version}\)"
    ):
        model(input_ids, attention_mask, decoder_input_ids=input_ids, **{unused: input_ids})


@pytest.mark.transformers_deprecation
def test_the_cache_is_returned_under_the_installed_transformers_name_and_taken_under_both():
    """transformers 5.24 renamed `past_key_values` to `cache`: the output field is the installed version's, and the old
    argument name still works (on 5.24+ with transformers' own deprecation warning), but not both at once."""
    model = tiny_model(granularity_mask="product")
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 6))
    with torch.no_grad():
        first = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids[:, :4], use_cache=True)
        # the name transformers' own outputs carry: `cache` from 5.24 on, `past_key_values` before
        assert CACHE_NAME in first and CACHE_NAME in Seq2SeqLMOutput.__dataclass_fields__
        steps = {}
        for name in ("cache", "past_key_values"):
            cache = copy.deepcopy(cache_of(first))
            steps[name] = model(
                attention_mask=attention_mask,
                encoder_outputs=(first.encoder_last_hidden_state,),
                decoder_input_ids=decoder_input_ids[:, 4:],
                **{name: cache},
            ).logits
        torch.testing.assert_close(steps["cache"], steps["past_key_values"], atol=0, rtol=0)
        with pytest.raises((TypeError, ValueError), match="past_key_values"):
            model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, cache=None, past_key_values=None)


def test_return_dict_false_gives_the_tuple_of_the_output():
    model = tiny_model()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        as_dict = model(input_ids, attention_mask, decoder_input_ids=input_ids, use_cache=False)
        as_tuple = model(input_ids, attention_mask, decoder_input_ids=input_ids, use_cache=False, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], as_dict.logits)
    model.config.return_dict = False  # the config's choice applies to the outer call; the model reads its parts inside
    with torch.no_grad():
        from_config = model(input_ids, attention_mask, decoder_input_ids=input_ids, use_cache=False)
    assert isinstance(from_config, tuple)
    torch.testing.assert_close(from_config[0], as_dict.logits)


@pytest.mark.parametrize("kind", MASKS)
def test_cache_keeps_transformers_layout_and_z_beside_it(kind):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        cache = cache_of(model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :5], use_cache=True))
    assert isinstance(cache, EncoderDecoderCache)
    heads, head_dim = 4, 8
    for layer in cache.self_attention_cache.layers:
        assert layer.keys.shape == layer.values.shape == (3, heads, 5, head_dim)
    for layer in cache.cross_attention_cache.layers:
        assert layer.keys.shape == layer.values.shape == (3, heads, 7, head_dim)
    if kind == "none":
        assert not isinstance(cache, GranularityCache), "no granularity heads, nothing to keep"
    else:
        assert isinstance(cache, GranularityCache)
        # the granularity logits W_G h of every decoder token, whose sigmoid is z (eq. 4)
        for layer in cache.granularity_logits_cache.layers:
            assert layer.keys.shape == (3, 1, 5, 1)
            z = torch.sigmoid(layer.keys)
            assert ((z > 0) & (z < 1)).all() and z.std() > 0
        # the logits of the encoder states, per cross-attention layer: what its granularity head makes of them, once
        encoder_states = model.get_encoder()(input_ids, attention_mask).last_hidden_state
        logit_layers = cache.cross_granularity_logits_cache.layers
        for layer, decoder_layer in zip(logit_layers, model.model.decoder.layers, strict=True):
            with torch.no_grad():
                expected = decoder_layer.encoder_attn.granularity_head(encoder_states)
            torch.testing.assert_close(layer.keys[:, 0, :, 0], expected)


def test_a_cache_with_encoder_keys_but_no_z_is_refused_naming_what_is_missing():
    model = tiny_model(granularity_mask="resonance")
    input_ids, attention_mask = batch()
    with torch.no_grad():
        filled = cache_of(model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :1], use_cache=True))
    foreign = EncoderDecoderCache(DynamicCache(), filled.cross_attention_cache)  # cross keys, no z
    with pytest.raises(ValueError, match="holds decoder tokens or encoder keys but not their granularity z"):
        model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :1], use_cache=True, **{CACHE_NAME: foreign})


@pytest.mark.parametrize("kind", MASKS)
def test_static_cache_generates_the_ids_of_the_dynamic_cache(kind):
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    for num_beams in (1, 4):
        kwargs = dict(attention_mask=attention_mask, num_beams=num_beams, **GENERATION)
        dynamic = model.generate(input_ids, **kwargs)
        static = model.generate(input_ids, cache_implementation="static", return_dict_in_generate=True, **kwargs)
        assert torch.equal(static.sequences, dynamic), (kind, num_beams)
        assert isinstance(cache_of(static).self_attention_cache, StaticCache)


def test_cropped_cache_continues_like_a_full_forward():
    """Assisted decoding crops the cache after rejected draft tokens: z must be cropped with the keys."""
    model = tiny_model(granularity_mask="product")
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 8))
    with torch.no_grad():
        full = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False).logits
        first = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=True)
        cache = cache_of(first)
        cache.crop(-3)  # transformers 5.x: a negative number of tokens to remove
        rest = model(
            attention_mask=attention_mask,
            encoder_outputs=(first.encoder_last_hidden_state,),
            decoder_input_ids=decoder_input_ids[:, 5:],
            cache=cache,
            use_cache=True,
        ).logits
    torch.testing.assert_close(rest, full[:, 5:], atol=1e-5, rtol=0)


def test_a_plain_cache_that_already_holds_tokens_is_refused():
    model = tiny_model()
    input_ids, attention_mask = batch()
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    cache.self_attention_cache.update(torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8), 0)
    with pytest.raises(ValueError, match="granularity z"):
        model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :1], cache=cache)


@pytest.mark.parametrize("kind", ["resonance", "product"])
def test_decoding_step_compiles_with_fullgraph_on_a_static_cache(kind):
    """No graph break in a decoding step (dynamo would raise under fullgraph=True); the compiled step gives the
    eager logits. backend="eager" keeps the test fast: dynamo's tracing, which finds graph breaks, is the same."""
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 4))
    step = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        full = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False).logits
        cache = EncoderDecoderCache(
            StaticCache(config=model.config, max_cache_len=8), StaticCache(config=model.config, max_cache_len=7)
        )
        prefill = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids[:, :1], cache=cache)
        cache, logits = cache_of(prefill), [prefill.logits]
        for t in range(1, 4):
            out = step(
                attention_mask=attention_mask,
                encoder_outputs=(prefill.encoder_last_hidden_state,),
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=0)


def test_attention_backend_switches_at_run_time_and_receives_the_granularity_bias():
    model = tiny_model(granularity_mask="resonance")
    input_ids, attention_mask = batch()
    with torch.no_grad():
        sdpa = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        model.set_attn_implementation("eager")
        assert model.model.encoder.layers[0].self_attn.config._attn_implementation == "eager"
        eager = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits

        masks = []

        def recording_attention(module, query, key, value, attention_mask, **kwargs):
            masks.append(attention_mask)
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

        AttentionInterface.register("cdnpg_test_recording", recording_attention)
        model.set_attn_implementation("cdnpg_test_recording")
        recorded = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=0)
    torch.testing.assert_close(recorded, sdpa, atol=1e-6, rtol=0)
    assert len(masks) == 3 * 2  # encoder self, decoder self, decoder cross; 2 layers each
    visible = masks[0][masks[0] > torch.finfo(masks[0].dtype).min]
    assert (visible < 0).any() and visible.unique().numel() > 2, "log M of eq. 6 reaches the backend, not just padding"


def test_a_backend_without_an_additive_mask_is_refused_rather_than_dropping_the_granularity_term():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"flash_attention_2.*additive mask.*'sdpa'"):
        model.set_attn_implementation("flash_attention_2")
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "flash_attention_2"  # set behind the model's back: refused at the call
    input_ids, attention_mask = batch()
    with pytest.raises(ValueError, match=r"flash_attention_2.*additive mask.*'sdpa'"):
        model(input_ids, attention_mask, decoder_input_ids=input_ids)


def test_logits_to_keep_computes_only_the_last_positions():
    model = tiny_model()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        full = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        last = model(input_ids, attention_mask, decoder_input_ids=input_ids, logits_to_keep=1).logits
        two = model(input_ids, attention_mask, decoder_input_ids=input_ids, logits_to_keep=2).logits
    assert last.shape == (3, 1, 60)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=0)
    torch.testing.assert_close(two, full[:, -2:], atol=1e-6, rtol=0)


def test_all_zero_token_type_ids_are_accepted_by_forward_and_generate():
    model = tiny_model()
    input_ids, attention_mask = batch()
    token_type_ids = torch.zeros_like(input_ids)
    with torch.no_grad():
        without = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        with_ids = model(input_ids, attention_mask, decoder_input_ids=input_ids, token_type_ids=token_type_ids).logits
    torch.testing.assert_close(with_ids, without)
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    assert torch.equal(generated, model.generate(input_ids=input_ids, attention_mask=attention_mask))


def test_sentence_pair_token_type_ids_are_refused_naming_the_field():
    model = tiny_model()
    input_ids, attention_mask = batch()
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[0, 3:] = 1
    with pytest.raises(ValueError, match="token_type_ids"):
        model(input_ids, attention_mask, decoder_input_ids=input_ids, token_type_ids=token_type_ids)


def test_generate_without_arguments_is_the_papers_beam_search_also_after_a_reload(tmp_path):
    """What README promises: no arguments decode as num_beams=8, max_new_tokens=20, and the checkpoint keeps it."""
    model = tiny_model()
    input_ids, attention_mask = batch()
    paper = model.generate(input_ids, attention_mask=attention_mask, num_beams=8, max_new_tokens=20)
    model.save_pretrained(tmp_path)
    reloaded = CDNPGForConditionalGeneration.from_pretrained(tmp_path)
    for decoder in (model, reloaded):
        assert torch.equal(decoder.generate(input_ids, attention_mask=attention_mask), paper)
    assert not torch.equal(model.generate(input_ids, attention_mask=attention_mask, num_beams=1), paper)


# ---- the same behaviours in a fresh process through the checkpoint's own code (trust_remote_code), on transformers
# 5.x and, where CI provides it, 4.57 ----------------------------------------------------------------------------


@pytest.mark.parametrize("python", PYTHONS)
def test_remote_code_static_cache_and_untied_weights_match_this_process(python, tmp_path):
    input_ids, attention_mask = batch()
    expected = {}
    for kind in MASKS:
        model = tiny_model(granularity_mask=kind, tie_word_embeddings=kind != "resonance")
        model.save_pretrained(tmp_path / kind)
        ids = model.generate(input_ids, attention_mask=attention_mask, num_beams=4, **GENERATION)
        with torch.no_grad():
            logits = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
        expected[kind] = {"ids": ids.tolist(), "logits": logits.flatten()[:50].tolist()}
    got = run_isolated(
        python,
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        input_ids, attention_mask = torch.tensor({input_ids.tolist()}), torch.tensor({attention_mask.tolist()})
        results = {{}}
        for kind in {list(MASKS)!r}:
            model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path)!r} + "/" + kind, trust_remote_code=True)
            kwargs = dict(attention_mask=attention_mask, num_beams=4, **{GENERATION!r})
            dynamic = model.generate(input_ids, **kwargs)
            static = model.generate(input_ids, cache_implementation="static", **kwargs)
            with torch.no_grad():
                logits = model(input_ids, attention_mask, decoder_input_ids=input_ids).logits
            results[kind] = {{"ids": dynamic.tolist(), "static_equal": torch.equal(dynamic, static),
                             "logits": logits.flatten()[:50].tolist()}}
        print(json.dumps(results))
        """,
        cwd=tmp_path,
    )
    for kind in MASKS:
        assert got[kind]["static_equal"], kind
        assert got[kind]["ids"] == expected[kind]["ids"], kind
        torch.testing.assert_close(torch.tensor(got[kind]["logits"]), torch.tensor(expected[kind]["logits"]))


@pytest.mark.parametrize("python", PYTHONS)
def test_transformers_embedding_accessors_find_the_model_parts_and_resize_them(python, tmp_path):
    """The embedding getters/setters and `get_decoder` are transformers' defaults (4.57 and 5.x), not the model's."""
    tiny_model().save_pretrained(tmp_path / "model")
    got = run_isolated(
        python,
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
        inner = model.model
        found = [model.get_input_embeddings() is inner.shared, model.get_output_embeddings() is model.lm_head,
                 model.get_encoder() is inner.encoder, model.get_decoder() is inner.decoder]
        size = model.config.vocab_size + 7
        model.resize_token_embeddings(size)
        shared = model.get_input_embeddings().weight
        resized = [shared.shape[0] == size, model.lm_head.weight is shared,
                   inner.encoder.embed_tokens.weight is shared, inner.decoder.embed_tokens.weight is shared]
        ids = torch.tensor([[size - 1, 5, 6]])
        logits = model(ids, decoder_input_ids=ids).logits
        print(json.dumps({{"found": found, "resized": resized, "logits": list(logits.shape)}}))
        """,
        cwd=tmp_path,
    )
    assert got["found"] == [True] * 4
    assert got["resized"] == [True] * 4
    assert got["logits"][-1] == tiny_model().config.vocab_size + 7


@pytest.mark.parametrize("python", PYTHONS)
def test_bert_tokenizer_output_generates_directly_in_a_fresh_process(python, shared_dir, tmp_path):
    """`model.generate(**tokenizer(text, return_tensors="pt"))` with the paper's tokenizer, which returns token_type_ids,
    for a folder that model.save_pretrained wrote (no tokenizer in it)."""
    tokenizer_dir = shared_dir / "tokenizers" / "bert-base-uncased"
    model = tiny_model(
        vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=101
    )
    model.save_pretrained(tmp_path / "model")
    got = run_isolated(
        python,
        f"""
        import json
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(tokenizer_dir)!r})
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
        inputs = tokenizer(["how can i learn python ?", "why is the sky blue ?"], return_tensors="pt", padding=True)
        ids = model.generate(**inputs, max_new_tokens=5)
        print(json.dumps({{"keys": sorted(inputs), "shape": list(ids.shape)}}))
        """,
        cwd=tmp_path,
    )
    assert "token_type_ids" in got["keys"], "the paper's tokenizer returns them: that is the case under test"
    assert got["shape"][0] == 2


@pytest.mark.parametrize("kind", ["product", "none"])
def test_flex_attention_takes_the_granularity_bias_and_equals_sdpa(kind, monkeypatch):
    """Flex attention adds the (b, 1, i, j) mask per query and key: the granularity bias of eqs. 6-9 (both masks,
    product) and the padding bias of plain attention, broadcast over queries in the encoder and the cross-attention,
    reach it whole. Compiled by aot_eager: what reaches the backend is under test, not inductor's kernels."""
    monkeypatch.setattr(granularity_kernels, "COMPILE_BACKEND", "aot_eager")
    model = tiny_model(granularity_mask=kind)
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.randint(3, 60, (3, 6))
    with torch.no_grad():
        expected = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        model.set_attn_implementation("flex_attention")
        got = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_flex_attention_refuses_attention_dropout_instead_of_ignoring_it():
    model = tiny_model(attention_dropout=0.1).train()
    model.set_attn_implementation("flex_attention")
    input_ids, attention_mask = batch()
    with pytest.raises(ValueError, match="flex_attention has no attention dropout"):
        model(input_ids, attention_mask, labels=input_ids)
