"""Warm starts: a BART checkpoint or a BERT-family encoder becomes a C-DNPG checkpoint whose pretrained weights map
1:1 (cdnpg.convert, `cdnpg convert`). Tiny random checkpoints are saved locally: nothing is downloaded."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertModel,
    BertTokenizer,
    GenerationConfig,
    GPT2Config,
    GPT2Model,
)

from cdnpg.convert import GRANULARITY_INIT_STD, convert, from_bart, from_bert
from modeling_cdnpg import CDNPGForConditionalGeneration
from tests.test_cli import run_cli
from tests.test_modeling import batch as padded_batch

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "the", "how", "is", "?", "cat"]
CLS, SEP = 2, 3
TOLERANCE = 1e-5  # float32 reassociation between two implementations of the same arithmetic


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sentences in the tiny vocabulary."""
    input_ids, attention_mask = padded_batch()
    return input_ids.clamp(max=len(VOCAB) - 1), attention_mask


def targets(*shape: int) -> torch.Tensor:
    return torch.randint(len(VOCAB) // 2, len(VOCAB), shape)


def tiny_bart(seed: int = 0) -> BartForConditionalGeneration:
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=len(VOCAB),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


def tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # a non-zero segment-0 embedding, so that folding it into the positions is tested
        model.embeddings.token_type_embeddings.weight.normal_(0, 0.5)
    return model


def save_with_tokenizer(model, folder):
    """The checkpoint and a tokenizer of its vocabulary, as `convert` expects from a folder."""
    model.save_pretrained(folder)
    BertTokenizer(vocab={word: index for index, word in enumerate(VOCAB)}).save_pretrained(folder)
    return folder


@pytest.fixture
def bart_dir(tmp_path):
    return save_with_tokenizer(tiny_bart(), tmp_path / "bart")


@pytest.fixture
def bert_dir(tmp_path):
    return save_with_tokenizer(tiny_bert(), tmp_path / "bert")


def decoding(num_beams: int) -> GenerationConfig:
    return GenerationConfig(
        num_beams=num_beams,
        max_new_tokens=6,
        min_new_tokens=6,
        decoder_start_token_id=2,
        pad_token_id=0,
        eos_token_id=2,
    )


@pytest.mark.parametrize("mask", ["none", "resonance"])
def test_converted_bart_gives_barts_logits_and_generations(mask):
    """`none` has no new parameter; `resonance` starts at z = 0.5, a constant per-row bias that leaves the softmax
    unchanged: both give BART's outputs."""
    bart = tiny_bart()
    model = from_bart(bart, granularity_mask=mask)
    input_ids, attention_mask = batch()
    decoder_input_ids = targets(3, 5)
    with torch.no_grad():
        expected = bart(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        got = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)
    for num_beams in (1, 4):
        config = decoding(num_beams)
        want = bart.generate(input_ids, attention_mask=attention_mask, generation_config=config)
        assert torch.equal(model.generate(input_ids, attention_mask=attention_mask, generation_config=config), want)


def test_every_bart_weight_maps_one_to_one_and_only_granularity_heads_are_new():
    bart = tiny_bart()
    model = from_bart(bart, granularity_mask="product")
    bart_state = bart.state_dict()
    new = []
    for name, tensor in model.state_dict().items():
        if name in bart_state:
            assert torch.equal(tensor, bart_state[name]), name
        else:
            new.append(name)
    assert new and all("granularity_head" in name for name in new)
    assert set(bart_state) - set(model.state_dict()) == {"final_logits_bias"}


def test_resonance_heads_start_near_one_half_and_receive_a_gradient():
    model = from_bart(tiny_bart(), granularity_mask="resonance").train()
    input_ids, attention_mask = batch()
    out = model(input_ids, attention_mask, labels=targets(3, 5), output_granularities=True)
    z = torch.cat([g.flatten() for g in out.encoder_granularities + out.decoder_granularities])
    assert (z - 0.5).abs().max() < 1e-4
    out.loss.backward()
    for name, parameter in model.named_parameters():
        if "granularity_head.proj.weight" in name:
            assert parameter.grad.abs().max() > 1e-7, name


def test_z_of_exactly_one_half_is_a_saddle_that_would_never_learn():
    """Why warm-started heads are not exactly zero (cdnpg.convert's docstring): with W_G = 0 the mask's gradient
    with respect to z vanishes, and the heads stay at zero whatever the loss."""
    model = from_bart(tiny_bart(), granularity_mask="resonance").train()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "granularity_head" in name:
                parameter.zero_()
    input_ids, attention_mask = batch()
    model(input_ids, attention_mask, labels=targets(3, 5)).loss.backward()
    grads = [p.grad for name, p in model.named_parameters() if "granularity_head.proj.weight" in name]
    assert all(torch.equal(grad, torch.zeros_like(grad)) for grad in grads)
    assert GRANULARITY_INIT_STD > 0


def test_scope_cannot_start_as_the_pretrained_model():
    """Documented: the scope mask is local by construction, so its converted model differs from BART at step 0."""
    bart, input_ids = tiny_bart(), targets(1, 12)
    model = from_bart(bart, granularity_mask="scope")
    with torch.no_grad():
        expected = bart(input_ids, decoder_input_ids=input_ids).logits
        got = model(input_ids, decoder_input_ids=input_ids).logits
    assert (got - expected).abs().max() > 1e-3


def test_converted_bert_encoder_gives_bertmodels_hidden_states():
    bert = tiny_bert()
    model = from_bert(bert, CLS, SEP, granularity_mask="none")
    input_ids, attention_mask = batch()
    with torch.no_grad():
        expected = bert(input_ids, attention_mask=attention_mask).last_hidden_state
        got = model.get_encoder()(input_ids, attention_mask).last_hidden_state
    real = attention_mask.bool()  # BERT's padded positions hold values nothing reads
    torch.testing.assert_close(got[real], expected[real], atol=TOLERANCE, rtol=0)


def test_bert_layers_initialise_both_stacks_and_cross_attention_is_new():
    bert = tiny_bert()
    model = from_bert(bert, CLS, SEP, granularity_mask="resonance")
    layer = bert.encoder.layer[1]
    for stack in (model.model.encoder, model.model.decoder):
        assert torch.equal(stack.layers[1].self_attn.q_proj.weight, layer.attention.self.query.weight)
        assert torch.equal(stack.layers[1].fc2.bias, layer.output.dense.bias)
        assert torch.equal(stack.layers[1].final_layer_norm.weight, layer.output.LayerNorm.weight)
    cross = model.model.decoder.layers[1].encoder_attn
    assert not torch.equal(cross.q_proj.weight, layer.attention.self.query.weight)
    assert cross.q_proj.weight.std().item() == pytest.approx(bert.config.initializer_range, rel=0.3)
    assert torch.equal(cross.q_proj.bias, torch.zeros_like(cross.q_proj.bias))
    assert model.lm_head.weight is model.model.shared.weight
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.decoder_start_token_id) == (
        CLS,
        SEP,
        CLS,
    )


@pytest.mark.parametrize("source", ["bart_dir", "bert_dir"])
def test_convert_reads_a_folder_and_the_checkpoint_loads_with_the_auto_classes(source, request, tmp_path):
    folder = request.getfixturevalue(source)
    model, tokenizer = convert(folder, granularity_mask="resonance")
    assert len(tokenizer) == len(VOCAB)
    model.save_pretrained(tmp_path / "converted")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted")
    assert type(loaded) is CDNPGForConditionalGeneration
    assert loaded.config.granularity_mask == "resonance"
    assert loaded.config.layernorm_embedding


def test_convert_refuses_a_folder_without_its_tokenizer(tmp_path):
    tiny_bart().save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="its tokenizer has 5 tokens for a vocabulary of"):
        convert(tmp_path / "bare")


def test_convert_refuses_other_architectures_naming_what_it_takes(tmp_path):
    GPT2Model(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"'gpt2' checkpoint; cdnpg converts bart and bert"):
        convert(tmp_path / "gpt2")


def test_cdnpg_convert_command_writes_a_complete_checkpoint(bert_dir, tmp_path):
    output = tmp_path / "bert-resonance"
    command = [sys.executable, "-m", "cdnpg.cli", "convert", str(bert_dir), str(output), "--granularity_mask", "scope"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    converted = CDNPGForConditionalGeneration.from_pretrained(output)
    new_parts = ("granularity_head", "encoder_attn", "lm_head_transform.", "lm_head.bias")  # not in a BERT encoder
    new = sum(p.numel() for name, p in converted.named_parameters() if any(part in name for part in new_parts))
    assert f"{new:,} of them new: granularity heads, cross-attention, prediction head" in completed.stderr
    assert json.loads((output / "config.json").read_text())["granularity_mask"] == "scope"
    assert {"model.safetensors", "tokenizer.json", "README.md", "modeling_cdnpg.py"} <= {
        p.name for p in output.iterdir()
    }
    again = run_cli(*command[3:])
    assert again.returncode == 2 and "--overwrite" in again.stderr, (
        "an existing checkpoint is not overwritten silently"
    )
    bad = run_cli(*command[3:-1], "sideways", "--overwrite")
    assert bad.returncode == 2 and "resonance, scope, product, mean, none" in bad.stderr


def test_cdnpg_convert_and_init_from_take_a_hub_id_that_only_a_proxy_reaches(bert_dir, tmp_path, monkeypatch):
    """`cdnpg convert owner/name` downloads the checkpoint as huggingface_hub does, here through an HTTP proxy from a
    Hub whose host name only the proxy resolves, and converts it as it converts the folder; `--init_from owner/name`
    is taken when the Hub has it."""
    from huggingface_hub import constants

    from cdnpg.training.arguments import parse_args
    from tests.hub_server import FakeHub, ForwardingProxy, hub_environment

    output = tmp_path / "converted"
    with FakeHub({"someone/tiny-bert": bert_dir}) as hub, ForwardingProxy({"hub.invalid"}) as proxy:
        env = hub_environment(f"http://hub.invalid:{hub.port}", tmp_path / "home", proxy=proxy.url)
        command = [sys.executable, "-m", "cdnpg.cli", "convert", "someone/tiny-bert", str(output)]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert completed.returncode == 0, completed.stderr[-2000:]
        downloaded = {path.rsplit("/", 1)[-1] for path in hub.paths("GET") if "/resolve/" in path}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= downloaded
        assert {host for _, host, _ in proxy.forwarded} == {"hub.invalid"} and len(proxy.forwarded) == len(
            hub.requests
        )
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # this process reaches it directly
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.chdir(tmp_path)
        assert parse_args(["--init_from", "someone/tiny-bert"])[0].init_from == "someone/tiny-bert"
    converted = CDNPGForConditionalGeneration.from_pretrained(output).state_dict()
    expected = convert(bert_dir)[0].state_dict()
    encoder = [name for name in expected if name.startswith("model.encoder.") and "granularity_head" not in name]
    assert encoder and all(torch.equal(converted[name], expected[name]) for name in encoder)


def test_training_warm_starts_from_a_bert_checkpoint_on_the_fly(bert_dir, tmp_path):
    from cdnpg.training import main

    files = {}
    for split in ("train", "valid"):
        files[split] = tmp_path / f"{split}.jsonl"
        rows = [{"source": "how is the cat ?", "target": "is the cat how ?"}] * 16
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "run"
    argv = ["--init_from", str(bert_dir), "--granularity_mask", "resonance", "--output_dir", str(output)]
    argv += ["--train_file", str(files["train"]), "--validation_file", str(files["valid"])]
    argv += ["--do_train", "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no"]
    main([*argv, "--load_best_model_at_end", "False", "--report_to", "none"])
    trained = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert trained.config.granularity_mask == "resonance" and trained.config.layernorm_embedding
    assert trained.config.d_model == 32 and trained.config.decoder_start_token_id == CLS


def test_warm_start_refuses_size_flags_and_a_second_checkpoint(bert_dir):
    from cdnpg.training.arguments import UsageError, parse_args

    with pytest.raises(UsageError, match=r"--d_model: --init_from .* brings its own sizes"):
        parse_args(["--init_from", str(bert_dir), "--d_model", "64"])
    with pytest.raises(UsageError, match="--init_from converts another: give one"):
        parse_args(["--init_from", str(bert_dir), "--model_name_or_path", str(bert_dir)])
    with pytest.raises(UsageError, match=r"--init_from \./missing/bert: no such model directory"):
        parse_args(["--init_from", "./missing/bert"])


def test_a_bart_sized_like_a_cdnpg_converts_back_to_the_same_fields():
    """cdnpg.training.bart_like (the benchmarks' baseline) and from_bart read one field table in both directions."""
    from cdnpg.convert import BART_FIELDS
    from cdnpg.training import bart_like
    from tests.conftest import tiny_config

    config = tiny_config(activation_function="gelu", dropout=0.2)
    back = from_bart(bart_like(config)).config
    assert {field: getattr(back, field) for field in BART_FIELDS} == {f: getattr(config, f) for f in BART_FIELDS}


def bert2bert_new_weights(bert2bert, model: CDNPGForConditionalGeneration) -> None:
    """Copy what transformers' bert2bert initialises afresh (the decoder's cross-attention, BERT's prediction head
    and its vocabulary bias) into a converted model, so that the two compute the same function."""
    decoder = bert2bert.decoder
    names = {"self.query": "q_proj", "self.key": "k_proj", "self.value": "v_proj", "output.dense": "out_proj"}
    with torch.no_grad():
        for source, layer in zip(decoder.bert.encoder.layer, model.model.decoder.layers):
            for theirs, ours in names.items():
                getattr(layer.encoder_attn, ours).load_state_dict(
                    source.crossattention.get_submodule(theirs).state_dict()
                )
            layer.encoder_attn_layer_norm.load_state_dict(source.crossattention.output.LayerNorm.state_dict())
        head = decoder.cls.predictions
        model.lm_head_transform.dense.load_state_dict(head.transform.dense.state_dict())
        model.lm_head_transform.layer_norm.load_state_dict(head.transform.LayerNorm.state_dict())
        model.lm_head.bias.copy_(head.bias)


def test_converted_bert_is_transformers_bert2bert(bert_dir):
    """With bert2bert's freshly initialised weights copied in, the converted model (`none`) computes transformers'
    `EncoderDecoderModel.from_encoder_decoder_pretrained(bert, bert)`: the same logits, loss and gradients, and in
    training the same dropout sites (none after the feed-forward activation, as BERT). Without BERT's prediction
    head (`lm_head_transform`) the warm start learned markedly slower (docs/warm_start.md)."""
    from transformers import EncoderDecoderModel

    bert2bert = EncoderDecoderModel.from_encoder_decoder_pretrained(bert_dir, bert_dir).eval()
    model, _ = convert(bert_dir, granularity_mask="none")
    assert model.config.lm_head_transform and model.config.activation_dropout == 0
    bert2bert_new_weights(bert2bert, model)
    input_ids, attention_mask = batch()
    labels = targets(3, 5)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    expected = bert2bert(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, labels=labels)
    got = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(got.loss, expected.loss, atol=TOLERANCE, rtol=0)
    expected.loss.backward()
    got.loss.backward()
    torch.testing.assert_close(
        model.lm_head_transform.dense.weight.grad, bert2bert.decoder.cls.predictions.transform.dense.weight.grad
    )
    torch.testing.assert_close(
        model.model.decoder.layers[0].fc1.weight.grad,
        bert2bert.decoder.bert.encoder.layer[0].intermediate.dense.weight.grad,
        atol=TOLERANCE,
        rtol=0,
    )
    # training: with the residual and attention dropout off, nothing else is dropped (BERT drops no activations)
    quiet, _ = convert(bert_dir, granularity_mask="none", dropout=0.0, attention_dropout=0.0)
    with torch.no_grad():
        train_logits = quiet.train()(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        eval_logits = quiet.eval()(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
    assert torch.equal(train_logits, eval_logits)


def test_prediction_head_is_new_and_reloads_through_the_auto_classes(bert_dir, tmp_path):
    model, _ = convert(bert_dir, granularity_mask="resonance")
    transform = model.lm_head_transform
    assert transform.dense.weight.std().item() == pytest.approx(model.config.initializer_range, rel=0.3)
    assert torch.equal(transform.dense.bias, torch.zeros_like(transform.dense.bias))
    assert torch.equal(transform.layer_norm.weight, torch.ones_like(transform.layer_norm.weight))
    assert torch.equal(model.lm_head.bias, torch.zeros_like(model.lm_head.bias))
    assert model.lm_head.weight is model.model.shared.weight
    with torch.no_grad():
        model.lm_head.bias.normal_()
    model.save_pretrained(tmp_path / "converted")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    input_ids, attention_mask = batch()
    decoder_input_ids = targets(3, 5)
    with torch.no_grad():
        expected = model.eval()(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        got = loaded(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_checkpoints_saved_before_the_warm_start_fields_load_unchanged():
    """A config without `lm_head_transform` and `activation_dropout` (every earlier checkpoint): no prediction head,
    no vocabulary bias, and the feed-forward activations dropped with `dropout`, as before."""
    from modeling_cdnpg import CDNPGConfig

    config = CDNPGConfig.from_dict(
        {"d_model": 32, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "dropout": 0.3}
    )
    model = CDNPGForConditionalGeneration(config)
    assert model.lm_head_transform is None and model.lm_head.bias is None
    assert model.model.encoder.layers[0].activation_dropout.p == 0.3
    assert not any("lm_head_transform" in name for name in model.state_dict())
    with pytest.raises(ValueError, match="activation_dropout must be in"):
        CDNPGConfig(activation_dropout=1.5)
    bart = tiny_bart()
    bart.config.activation_dropout = 0.05
    assert from_bart(bart).config.activation_dropout == 0.05


def test_untied_embeddings_all_start_from_berts_word_embeddings():
    bert = tiny_bert()
    model = from_bert(bert, CLS, SEP, granularity_mask="none", tie_word_embeddings=False)
    words = bert.embeddings.word_embeddings.weight
    embeddings = [
        model.model.shared,
        model.model.encoder.embed_tokens,
        model.model.decoder.embed_tokens,
        model.lm_head,
    ]
    assert len({id(module.weight) for module in embeddings}) == 4
    assert all(torch.equal(module.weight, words) for module in embeddings)


@pytest.mark.parametrize("gate", ["learned", "granularity"])
@pytest.mark.parametrize("source", ["bart_dir", "bert_dir"])
def test_a_warm_start_with_copy_keeps_every_pretrained_weight_and_adds_the_copy_mechanism(source, gate, request):
    """`convert(..., copy_mechanism=...)` (and so `--init_from ... --copy_mechanism`): the copy attention and gate are
    the only parts besides the granularity heads (and, from BERT, what bert2bert adds) that the source lacks."""
    folder = request.getfixturevalue(source)
    plain, _ = convert(folder, granularity_mask="resonance")
    copying, _ = convert(folder, granularity_mask="resonance", copy_mechanism=gate)
    assert copying.config.copy_mechanism == gate
    copy_weights = {name for name in copying.state_dict() if name.startswith("copy_mechanism.")}
    expected = {"q_proj", "k_proj"} | ({"gate_proj"} if gate == "learned" else set())
    assert {name.split(".")[1] for name in copy_weights} == expected
    pretrained = {name: tensor for name, tensor in plain.state_dict().items() if "granularity_head" not in name}
    for name, tensor in pretrained.items():
        if not name.startswith(("model.decoder.layers", "lm_head")) or source == "bart_dir":
            torch.testing.assert_close(copying.state_dict()[name], tensor, msg=name)
    input_ids = torch.tensor([[CLS, 5, 6, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(
            copying(input_ids, decoder_input_ids=input_ids).logits.exp().sum(-1), torch.ones(1, 5)
        )
