"""The copy mechanism (CDNPGConfig.copy_mechanism): P(y) = (1 - ρ) P_gen(y) + ρ P_copy(y), returned as
log-probabilities through `logits`. Hand-computed mixtures, the limits ρ -> 0 and ρ -> 1, the cache, save/load with
remote code, and a trained model that copies words it never saw in training."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSeq2SeqLM

from cdnpg.data import load_tokenizer, model_token_ids, template_corpus, train_wordpiece_tokenizer
from cdnpg.hub import save_checkpoint
from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration
from modeling_cdnpg.copy_cdnpg import CopyMechanism
from modeling_cdnpg.modeling_cdnpg import CACHE_NAME
from tests.conftest import (
    BOS,
    MASKS,
    PAD,
    QUICK_PARAPHRASER,
    cache_of,
    tiny_config,
    tiny_model,
    train_tiny_paraphraser,
)
from tests.test_fused_granularity import compiled_runs, traced  # noqa: F401  (fixtures)
from tests.test_hub import PYTHONS, run_isolated
from tests.test_modeling import batch

GATES = ("learned", "granularity")
GA_MASKS = [mask for mask in MASKS if mask != "none"]
# every gate with every mask it works with: "none" + learned is the paper's Transformer+Copy baseline
SETTINGS = [(gate, mask) for gate in GATES for mask in (MASKS if gate == "learned" else GA_MASKS)]


def with_gate_at(model: CDNPGForConditionalGeneration, logit: float) -> CDNPGForConditionalGeneration:
    """Pin ρ to σ(logit): the learned gate's bias, or the bias of the granularity head whose z is ρ."""
    with torch.no_grad():
        if model.config.copy_mechanism == "learned":
            model.copy_mechanism.gate_proj.weight.zero_()
            model.copy_mechanism.gate_proj.bias.fill_(logit)
        else:
            head = model.model.decoder.layers[-1].encoder_attn.granularity_head.proj
            head.weight.zero_()
            head.bias.fill_(logit)
    return model


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("gate, mask", SETTINGS)
def test_the_mixture_is_a_distribution_over_the_vocabulary(gate, mask, implementation):
    model = tiny_model(granularity_mask=mask, copy_mechanism=gate)
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = batch()  # padded rows: padding gets no copy probability
    with torch.no_grad():
        logits = model(input_ids, attention_mask, decoder_input_ids=input_ids[:, :6]).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.exp().sum(-1), torch.ones(logits.shape[:2]), atol=1e-5, rtol=0)


def uniform_copy(config: CDNPGConfig, gate_logit: float) -> CopyMechanism:
    """A learned-gate copy module with zero projections (α uniform over the copyable source tokens) and ρ pinned to
    σ(gate_logit)."""
    copy = CopyMechanism(config)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.zero_()
        copy.gate_proj.bias.fill_(gate_logit)
    return copy


def test_copy_probabilities_by_hand_repeated_source_tokens_add_up():
    """Zero attention projections: α is uniform over the real source tokens; token 5 occurs twice of three."""
    config = tiny_config(copy_mechanism="learned")
    copy = uniform_copy(config, gate_logit=0.4)
    logits = torch.randn(1, 2, config.vocab_size)
    source_ids = torch.tensor([[5, 7, 5, PAD]])
    mixed, _ = copy(logits, torch.randn(1, 2, 32), torch.randn(1, 4, 32), source_ids, torch.tensor([[1, 1, 1, 0]]))
    rho = torch.sigmoid(torch.tensor(0.4))
    expected = (1 - rho) * logits.softmax(-1)
    expected[..., 5] += rho * 2 / 3
    expected[..., 7] += rho * 1 / 3
    torch.testing.assert_close(mixed.exp(), expected)


@pytest.mark.usefixtures("traced")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_excluded_tokens_get_no_copy_probability_and_a_source_of_them_only_is_generated_by_hand(compiled):
    """copy_excluded_token_ids 5 and 8, zero projections: in row 0, α is uniform over the copyable 7 and 9 and token
    5 keeps (1 - ρ) P_gen alone; row 1 holds excluded tokens only, so ρ = 0 and P = P_gen. The loss read at the
    labels is the NLL of that distribution. The same with the formulas compiled (compile_granularity_masks)."""
    config = tiny_config(copy_mechanism="learned", copy_excluded_token_ids=[5, 8], compile_granularity_masks=compiled)
    copy = uniform_copy(config, gate_logit=0.4)
    logits = torch.randn(2, 2, config.vocab_size)
    source_ids, mask = torch.tensor([[5, 7, 5, 9], [8, 5, 8, PAD]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    labels = torch.tensor([[5, 7], [8, 3]])
    mixed, nll = copy(logits, torch.randn(2, 2, 32), torch.randn(2, 4, 32), source_ids, mask, labels=labels)
    rho = torch.sigmoid(torch.tensor(0.4))
    expected = logits.softmax(-1)
    expected[0] *= 1 - rho
    expected[0, :, 7] += rho / 2
    expected[0, :, 9] += rho / 2
    torch.testing.assert_close(mixed.exp(), expected)
    torch.testing.assert_close(nll, -expected.log().gather(-1, labels[..., None]).sum())


@pytest.mark.parametrize("gate", GATES)
def test_a_model_whose_source_tokens_are_all_excluded_trains_and_scores_as_the_model_without_copy(gate):
    plain = tiny_model(granularity_mask="resonance")
    input_ids, attention_mask = batch()
    copying = tiny_model(
        granularity_mask="resonance",
        copy_mechanism=gate,
        copy_excluded_token_ids=sorted(set(input_ids.flatten().tolist())),
    )
    copying.load_state_dict(plain.state_dict(), strict=False)
    labels = input_ids[:, 1:7]
    expected = plain(input_ids, attention_mask, labels=labels)
    got = copying(input_ids, attention_mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits.log_softmax(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, expected.loss)
    got.loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in copying.parameters())


def test_the_copy_limits_are_checked_where_they_are_set(tokenizer_dir):
    """The config names the field; run.py's flag needs a copy gate; the pipeline counts the training tokens."""
    from datasets import Dataset

    from cdnpg.training import UsageError, parse_args
    from cdnpg.training.model import build_model, common_tokens

    with pytest.raises(ValueError, match="copy_excluded_token_ids is set but copy_mechanism is None"):
        CDNPGConfig(copy_excluded_token_ids=[5])
    with pytest.raises(
        ValueError, match=r"copy_excluded_token_ids must be token ids in \[0, vocab_size=60\), got \[60\]"
    ):
        tiny_config(copy_mechanism="learned", copy_excluded_token_ids=[3, 60])
    with pytest.raises(UsageError, match=r"--copy_common_tokens 100 .* needs --copy_mechanism"):
        parse_args(["--copy_common_tokens", "100", "--output_dir", "unused"])
    # 7: 4 times, 4: 3 times, 9: twice (-100 is padding, never counted)
    features = Dataset.from_dict({"input_ids": [[7, 4, 7], [9, 4]], "labels": [[7, 4, -100], [7, 9]]})
    assert common_tokens(features, 2) == [7, 4]
    model_args = parse_args(["--copy_mechanism", "learned", "--copy_common_tokens", "3", "--output_dir", "unused"])[0]
    model = build_model(model_args, load_tokenizer(tokenizer_dir), features)
    assert model.config.copy_excluded_token_ids == [7, 4, 9]
    assert model.copy_mechanism.excluded_token_ids == (7, 4, 9)


@pytest.mark.usefixtures("traced")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_mixture_its_loss_and_their_gradients_equal_the_dense_formula_with_repeated_source_tokens(compiled):
    """The module changes only the source's tokens (each distinct one once); the dense formula builds the whole copy
    distribution: log((1 - ρ) softmax(logits) + ρ scatter_add(α)). Values and every gradient agree, also where the
    source repeats a token (a write per occurrence would count its gradient twice); with the formulas compiled too."""
    torch.manual_seed(0)
    config = tiny_config(copy_mechanism="learned", compile_granularity_masks=compiled)
    copy = CopyMechanism(config)
    logits = torch.randn(2, 3, config.vocab_size, requires_grad=True)
    states, encoder_states = torch.randn(2, 3, 32, requires_grad=True), torch.randn(2, 5, 32, requires_grad=True)
    source_ids, mask = torch.tensor([[5, 9, 5, 5, 7], [8, 8, 6, PAD, PAD]]), torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    weight = torch.randn(2, 3, config.vocab_size)  # a loss that reads every vocabulary entry

    def dense() -> torch.Tensor:
        scores = (copy.q_proj(states) @ copy.k_proj(encoder_states).transpose(1, 2)) * copy.scaling
        alpha = scores.masked_fill(~mask.bool()[:, None, :], torch.finfo(scores.dtype).min).softmax(-1)
        gate = copy.gate_proj(torch.cat([states, alpha @ encoder_states], -1)).squeeze(-1)
        copied = torch.zeros_like(logits).scatter_add(-1, source_ids[:, None, :].expand_as(alpha), alpha)
        rho = torch.sigmoid(gate)[..., None]
        return ((1 - rho) * logits.softmax(-1) + rho * copied).log()

    inputs = [logits, states, encoder_states, *copy.parameters()]
    labels = torch.tensor([[5, 7, 2], [6, -100, 8]])  # copied twice over, once, never; a padded position

    def mixture() -> tuple[torch.Tensor, torch.Tensor]:  # a graph per gradient: a compiled backward runs only once
        return copy(logits, states, encoder_states, source_ids, mask, labels=labels)

    got, nll = mixture()
    expected = dense()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(torch.autograd.grad((got * weight).sum(), inputs),
                             torch.autograd.grad((expected * weight).sum(), inputs, retain_graph=True)):  # fmt: skip
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    # the loss, read at the labels alone, is the NLL of the dense distribution, with the same gradients
    dense_nll = F.nll_loss(expected.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    _, nll = mixture()
    torch.testing.assert_close(nll, dense_nll, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(torch.autograd.grad(nll, inputs), torch.autograd.grad(dense_nll, inputs)):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


# aten ops of the copy's attention and mixture alone (the model's attention runs none of them on a CPU)
COPY_OPS = {"aten::logaddexp", "aten::tril", "aten::_log_softmax", "aten::log_sigmoid_forward", "aten::any"}


@pytest.mark.parametrize("gate", GATES)
def test_with_compiled_masks_the_copy_formulas_run_in_generated_kernels_with_the_same_loss_and_gradients(gate):
    """compile_granularity_masks compiles the copy's attention and mixture on their own, as it does the masks (their
    ~45 aten kernels each way would be more than a tenth of a training step with compiled masks): a training step
    launches none of their aten ops, which the eager model launches, and computes the same loss and gradients."""
    torch.compiler.reset()  # inductor from dynamo's first state: after other backends' graphs, torch 2.13 may read
    # an incompatible graph from inductor's on-disk cache (a stride assertion fails inside the kernel)
    models = {
        compiled: tiny_model(
            granularity_mask="resonance",
            copy_mechanism=gate,
            compile_granularity_masks=compiled,
            dropout=0.0,
            attention_dropout=0.0,
        )
        for compiled in (False, True)
    }
    models[True].load_state_dict(models[False].state_dict())
    input_ids, attention_mask = batch()
    labels = input_ids[:, 1:7].clone()
    labels[0, -2:] = -100
    ops, losses, grads = {}, {}, {}
    for compiled, model in models.items():
        model(input_ids, attention_mask, labels=labels).loss.backward()  # compiles, outside the profile
        model.zero_grad()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            losses[compiled] = model(input_ids, attention_mask, labels=labels).loss
            losses[compiled].backward()
        ops[compiled] = {event.name for event in profile.events()} & COPY_OPS
        grads[compiled] = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    assert ops[False] >= {"aten::logaddexp", "aten::tril", "aten::_log_softmax"}
    assert ops[True] == set()
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-6, atol=1e-6)
    assert grads[True].keys() == grads[False].keys()
    assert any(name.startswith("copy_mechanism.") for name in grads[True])
    for name, grad in grads[True].items():
        torch.testing.assert_close(grad, grads[False][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.usefixtures("traced")
def test_compiled_masks_switched_on_after_construction_as_run_py_does_give_the_same_granularity_copy_loss(
    compiled_runs,  # noqa: F811  (the fixture imported above)
):
    """run.py sets compile_granularity_masks on a built model's config: the masks and the copy read it at each call,
    so the model switched on after construction runs them compiled, with the eager model's loss."""
    model = tiny_model(granularity_mask="resonance", copy_mechanism="granularity", dropout=0.0, attention_dropout=0.0)
    input_ids, attention_mask = batch()
    labels = input_ids[:, 1:7]
    with torch.no_grad():
        expected = model(input_ids, attention_mask, labels=labels).loss
        assert compiled_runs == []
        model.config.compile_granularity_masks = True
        got = model(input_ids, attention_mask, labels=labels).loss
    assert set(compiled_runs) == {"granularity_bias", "copy_attention", "copy_distribution"}
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gate", GATES)
def test_the_loss_of_a_copy_model_is_the_cross_entropy_of_its_log_probabilities(gate):
    """The loss of a copy model skips cross-entropy's log_softmax (its logits are log-probabilities already): the
    same mean over the target tokens, padding (-100) left out."""
    model = tiny_model(granularity_mask="resonance", copy_mechanism=gate)
    input_ids, attention_mask = batch()
    labels = input_ids[:, 1:7].clone()
    labels[0, -2:] = -100
    out = model(input_ids, attention_mask, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("gate, mask", [("learned", "none"), ("learned", "resonance"), ("granularity", "scope")])
def test_with_rho_zero_the_logits_are_those_of_the_model_without_copy(gate, mask):
    plain = tiny_model(granularity_mask=mask)
    copying = tiny_model(granularity_mask=mask, copy_mechanism=gate)
    copying.load_state_dict(plain.state_dict(), strict=False)  # the same weights; the copy module stays its own
    with_gate_at(copying, -1e4)
    if gate == "granularity":  # the same cross-attention z in both models
        with_gate_at(plain, -1e4)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        expected = plain(input_ids, attention_mask, decoder_input_ids=input_ids[:, :6]).logits.log_softmax(-1)
        got = copying(input_ids, attention_mask, decoder_input_ids=input_ids[:, :6]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("gate", GATES)
def test_a_source_token_the_vocabulary_ranks_last_is_reachable_through_the_copy(gate):
    model = with_gate_at(tiny_model(copy_mechanism=gate), 1e4)  # ρ = 1: only copying
    input_ids, attention_mask = batch()
    with torch.no_grad():
        decoder_ids = input_ids[:1, :3]
        plain = model.lm_head(model.model(input_ids[:1], attention_mask[:1], decoder_input_ids=decoder_ids)[0])
        last = int(plain[0, -1, 3:].argmin()) + 3  # the token the vocabulary distribution likes least
        source = input_ids[:1].clone()
        source[0, 2] = last
        logits = model(source, attention_mask[:1], decoder_input_ids=decoder_ids).logits[0, -1]
    source_tokens = set(source[0][attention_mask[0].bool()].tolist())
    assert int(logits.argmax()) in source_tokens and logits[last] > -20
    others = torch.tensor([token not in source_tokens for token in range(logits.shape[0])])
    assert logits.exp()[others].sum() < 1e-6


@pytest.mark.parametrize(
    "gate, mask, excluded",
    [("learned", "none", None), ("learned", "product", None), ("granularity", "resonance", None),
     ("granularity", "resonance", list(range(0, 60, 2)))],  # half the vocabulary never copied
)  # fmt: skip
def test_cached_decoding_equals_uncached_decoding_with_copy(gate, mask, excluded):
    model = tiny_model(granularity_mask=mask, copy_mechanism=gate, copy_excluded_token_ids=excluded)
    input_ids, attention_mask = batch()
    for settings in ({"num_beams": 1}, {"num_beams": 3, "num_return_sequences": 2}):
        runs = [
            model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, **settings, **cache)
            for cache in ({"use_cache": True}, {"use_cache": False}, {"cache_implementation": "static"})
        ]
        assert torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[1]), settings


def test_the_granularity_gate_reads_the_source_z_from_the_cache_after_the_first_step():
    """z of the source is computed once per generation, by the last cross-attention's head, which the cache keeps:
    a later cached step runs that head on its new query alone (not again over the source for the gate), and its
    log-probabilities equal an uncached forward's over the whole prefix."""
    model = tiny_model(granularity_mask="resonance", copy_mechanism="granularity").eval()
    input_ids, attention_mask = batch()
    decoder_input_ids = torch.tensor([[BOS, 7, 9, 11]]).expand(input_ids.shape[0], -1)
    head = model.model.decoder.layers[-1].encoder_attn.granularity_head
    positions_seen = []
    head.register_forward_hook(lambda module, args, output: positions_seen.append(args[0].shape[1]))
    first = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids[:, :3], use_cache=True)
    assert positions_seen == [3, input_ids.shape[1]]  # the queries, then the source once
    positions_seen.clear()
    later = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids[:, 3:], use_cache=True,
                  **{CACHE_NAME: cache_of(first)})  # fmt: skip
    assert positions_seen == [1]
    full = model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False)
    torch.testing.assert_close(later.logits[:, -1], full.logits[:, -1])


def test_the_granularity_gate_needs_granularity_heads_in_cross_attention():
    with pytest.raises(ValueError, match="copy_mechanism='granularity' reads z"):
        CDNPGConfig(granularity_mask="none", copy_mechanism="granularity")
    with pytest.raises(ValueError, match="copy_mechanism must be one of"):
        CDNPGConfig(copy_mechanism="pointer")


def test_decoding_from_encoder_states_without_the_source_ids_is_refused():
    model = tiny_model(copy_mechanism="learned")
    input_ids, attention_mask = batch()
    states = model.get_encoder()(input_ids, attention_mask).last_hidden_state
    with pytest.raises(ValueError, match="source token ids"):
        model(attention_mask=attention_mask, encoder_outputs=(states,), decoder_input_ids=input_ids[:, :2])


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("gate, excluded", [("learned", None), ("granularity", None), ("learned", "common")])
def test_a_saved_copy_model_generates_the_same_ids_with_remote_code(python, gate, excluded, tmp_path, tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    excluded = tokenizer(["how can i get to ?"])["input_ids"][0] if excluded else None
    model = tiny_model(**model_token_ids(tokenizer), copy_mechanism=gate, copy_excluded_token_ids=excluded)
    folder = save_checkpoint(model, tokenizer, tmp_path / "copy")
    sources = ["how can i get from paris to rome by train ?", "why is pinterest so popular ?"]
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=6, num_beams=3).tolist()
        reloaded = AutoModelForSeq2SeqLM.from_pretrained(folder).generate(**inputs, max_new_tokens=6, num_beams=3)
    assert reloaded.tolist() == expected
    got = run_isolated(
        python,
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        inputs = {{name: torch.tensor(value) for name, value in { ({k: v.tolist() for k, v in inputs.items()})!r}.items()}}
        with torch.no_grad():
            print(json.dumps(model.generate(**inputs, max_new_tokens=6, num_beams=3).tolist()))
        """,
        cwd=tmp_path,
    )
    assert got == expected


def unseen_words_kept(model, tokenizer, pairs, seen: set[str]) -> float:
    """The share of the test sources' words never seen in training that the greedy paraphrase writes."""
    inputs = tokenizer(list(pairs["source"]), padding=True, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=1)
    outputs = [set(text.split()) for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    unseen = [[word for word in source.split() if word not in seen] for source in pairs["source"]]
    total = sum(len(words) for words in unseen)
    assert total >= 50, "the test split should hold words the training split lacks"
    return sum(word in output for words, output in zip(unseen, outputs) for word in words) / total


@pytest.mark.slow
def test_a_model_trained_with_copy_writes_source_words_it_never_saw_in_training():
    """The template corpus fills its slots with details some of which occur only in the test split. With a
    vocabulary that holds them (as a pretrained tokenizer would), a model that must regenerate them through its
    softmax never writes them (measured: 0 of 82), one with either copy gate copies most (70% and 77%), on the
    short schedule of conftest's paraphrasers."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=64, seed=0)
    texts = [text for split in ("train", "test") for column in ("source", "target") for text in corpus[split][column]]
    tokenizer = train_wordpiece_tokenizer(texts, vocab_size=1500)
    seen = {word for text in [*corpus["train"]["source"], *corpus["train"]["target"]] for word in text.split()}
    kept = {
        gate: unseen_words_kept(
            train_tiny_paraphraser(tokenizer, "resonance", copy_mechanism=gate, **QUICK_PARAPHRASER),
            tokenizer,
            corpus["test"],
            seen,
        )
        for gate in (None, "learned", "granularity")
    }
    assert kept[None] < 0.1 and kept["learned"] > 0.4 and kept["granularity"] > 0.4, kept
