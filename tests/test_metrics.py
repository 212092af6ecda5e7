"""Tests for cdnpg.training.paraphrase_metrics (the paper's metrics as an ``evaluate`` module) and the WordNet
installer.

Expected values are derived by hand in the comments. Tests that need WordNet fail (not skip) when it is missing,
because CI installs it; the failure says how.
"""

from __future__ import annotations

import importlib.util
import io
import math
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cdnpg.training import METRICS_SCRIPT, paraphrase_metrics

ROOT = Path(__file__).resolve().parents[1]
INSTALL_WORDNET = ROOT / "cdnpg" / "wordnet.py"
WORDNET_HINT = (
    "WordNet is not installed for NLTK. Run:\n"
    "    apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index\n"
    "    cdnpg install-wordnet"
)

# Method7 smoothing (method4, then method5) of a prediction identical to a reference of >= 5 tokens: all p_n = 1,
# method5 averages p'_n = (p'_{n-1} + p_n + p_{n+1}) / 3 starting from p'_0 = p_1 + 1 = 2, so
# p'_1 = 4/3, p'_2 = 10/9, p'_3 = 28/27, p'_4 = 82/81 (p_5 = 1 for the last one).
IDENTICAL_BLEU2 = 100 * math.sqrt(4 / 3 * 10 / 9)  # 121.716
IDENTICAL_BLEU4 = 100 * (4 / 3 * 10 / 9 * 28 / 27 * 82 / 81) ** 0.25  # 111.675


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pm() -> ModuleType:
    """The metric script imported as a plain module, to test its helpers directly."""
    return paraphrase_metrics


@pytest.fixture(scope="session")
def wordnet(pm: ModuleType) -> None:
    try:
        pm.require_wordnet()
    except LookupError as error:
        pytest.fail(f"{WORDNET_HINT}\n({error})")


@pytest.fixture(scope="session")
def metric(wordnet: None):
    """The module as users get it: evaluate.load on the directory, with the Hub switched off."""
    import evaluate

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_EVALUATE_OFFLINE", "1")
        return evaluate.load(str(METRICS_SCRIPT))


def test_normalisation_lowercases_and_splits_punctuation_like_bert(pm: ModuleType) -> None:
    assert pm.normalize("How do I lose Weight?") == ["how", "do", "i", "lose", "weight", "?"]
    assert pm.normalize("[CLS]") == ["[", "cls", "]"]
    assert pm.normalize("") == []


def test_decoded_spelling_and_corpus_spelling_score_the_same(metric) -> None:
    reference, source = "how can i lose weight fast ?", "what is the best way to lose weight ?"
    decoded = metric.compute(predictions=["How do I lose weight?"], references=[reference], sources=[source])
    corpus = metric.compute(predictions=["how do i lose weight ?"], references=[reference], sources=[source])
    assert decoded == corpus


def test_identical_sentences_get_method7_bleu_full_rouge_and_one_chunk_meteor(metric) -> None:
    sentence = "how do i lose weight fast ?"  # 7 tokens
    scores = metric.compute(predictions=[sentence], references=[sentence], sources=[sentence])
    # NLTK's method7 lifts a perfect match above 100 (see IDENTICAL_BLEU*); the paper's numbers include this.
    assert scores["bleu2"] == pytest.approx(IDENTICAL_BLEU2)
    assert scores["bleu4"] == pytest.approx(IDENTICAL_BLEU4)
    assert scores["self_bleu4"] == pytest.approx(IDENTICAL_BLEU4)
    assert scores["rougeL"] == pytest.approx(100.0)
    # METEOR: P = R = 1, one chunk over 7 matches: 100 * (1 - 0.5 * (1/7)**3) = 99.8542.
    assert scores["meteor"] == pytest.approx(100 * (1 - 0.5 / 7**3))
    assert scores["sacrebleu"] == pytest.approx(100.0)
    assert scores["sacrebleu_self"] == pytest.approx(100.0)
    # iBLEU = 0.8 * B - 0.2 * B with B the same BLEU-4 against reference and source.
    assert scores["ibleu"] == pytest.approx(0.8 * IDENTICAL_BLEU4 - 0.2 * IDENTICAL_BLEU4)
    # The released code's self reference is list("how") = h, o, w: no such one-letter token here, so 0.
    assert scores["ibleu_paper"] == pytest.approx(0.8 * IDENTICAL_BLEU4)
    assert scores["copy_rate"] == 100.0


def test_copy_rate_is_the_share_of_predictions_equal_to_their_source_after_normalisation(metric) -> None:
    scores = metric.compute(
        predictions=["What's the time?", "what is the time ?", "how old are you ?", "how old are you"],
        references=["what time is it ?"] * 4,
        sources=["what ' s the time ?", "what ' s the time ?", "how old are you ?", "how old are you ?"],
    )
    assert scores["copy_rate"] == pytest.approx(50.0)  # the first (same tokens, other spelling) and the third


def test_candidate_scores_pool_copies_and_pairs_over_candidates_and_average_the_rest_over_sources(pm) -> None:
    """Source 1 has 3 candidates (its copy, its reference twice), source 2 one disjoint candidate: distinct 2 and 1,
    1 copy of 4 candidates, 3 pairs (copy/reference twice, reference/reference once), iBLEU of the first (the copy),
    mean and best per source, then averaged over the two."""
    source, reference = "how do i learn french fast ?", "how can i learn french quickly ?"
    scores = pm.candidate_scores(
        [["How do I learn French fast?", reference, reference], ["cats sleep"]],
        [source, "why is the sky blue ?"],
        [reference, "what makes the sky blue ?"],
    )
    s, r = pm.normalize(source), pm.normalize(reference)
    copy_vs_ref = 100 * pm.bleu(s, r, pm.BLEU4_WEIGHTS)
    assert scores["distinct"] == 1.5 and scores["copies_percent"] == 25.0
    assert scores["pairwise_bleu4"] == pytest.approx((2 * copy_vs_ref + IDENTICAL_BLEU4) / 3)
    of_copy = 0.8 * copy_vs_ref - 0.2 * IDENTICAL_BLEU4
    of_reference = 0.8 * IDENTICAL_BLEU4 - 0.2 * copy_vs_ref
    assert scores["ibleu_first"] == pytest.approx(of_copy / 2)  # the disjoint candidate scores 0
    assert scores["ibleu_mean"] == pytest.approx((of_copy + 2 * of_reference) / 3 / 2)
    assert scores["ibleu_best"] == pytest.approx(of_reference / 2)


def test_disjoint_sentences_score_zero(metric) -> None:
    scores = metric.compute(
        predictions=["apples are red"], references=["the sky looks blue today"], sources=["cats sleep"]
    )
    assert len(scores) == 10
    assert scores == pytest.approx(dict.fromkeys(scores, 0.0))


def test_partial_overlap_matches_hand_computed_bleu2_and_rougeL(metric) -> None:
    prediction, reference = "how can i lose belly fat", "how can i lose weight"
    scores = metric.compute(predictions=[prediction], references=[reference])
    # BLEU-2, weights (1/2, 1/2, 0, 0) as in the released code. Prediction 6 tokens, reference 5: BP = 1.
    #   p1 = 4/6 (how can i lose), p2 = 3/5 (how-can can-i i-lose), p3 = 2/4, p4 = 1/3: no zero, method4 no-op.
    #   method5: p'1 = (p1 + 1 + p1 + p2)/3 = (5/3 + 2/3 + 3/5)/3 = 44/45
    #            p'2 = (p'1 + p2 + p3)/3 = (44/45 + 3/5 + 1/2)/3 = 187/270
    #   BLEU-2 = sqrt(44/45 * 187/270) = 0.822923.
    # (The two-weight form (1/2, 1/2) would average p2 with p5 = 0 instead: sqrt(44/45 * 71/135) = 0.717.)
    assert scores["bleu2"] == pytest.approx(100 * math.sqrt(44 / 45 * 187 / 270))
    # ROUGE-L: LCS = 4, P = 4/6, R = 4/5, beta^2 = 1.44:
    #   F = 2.44 * (2/3) * (4/5) / (4/5 + 1.44 * 2/3) = 1.301333 / 1.76 = 122/165 = 0.739394.
    assert scores["rougeL"] == pytest.approx(100 * 122 / 165)


def test_rougeL_lcs_agrees_with_google_rouge_score(pm: ModuleType) -> None:
    from rouge_score import rouge_scorer

    class Whitespace:
        def tokenize(self, text: str) -> list[str]:
            return text.split()

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=Whitespace())
    pairs = [
        ("how can i lose belly fat", "how can i lose weight"),
        ("a b c d e f", "f e d c b a"),
        ("the cat sat on the mat", "the mat sat on the cat ?"),
        ("x y", "z"),
    ]
    for candidate, reference in pairs:
        google = scorer.score(reference, candidate)["rougeL"]
        lcs = pm.lcs_length(candidate.split(), reference.split())
        assert lcs / len(candidate.split()) == pytest.approx(google.precision)
        assert lcs / len(reference.split()) == pytest.approx(google.recall)
    assert pm.rouge_l(["a", "b"], ["a", "b"]) == pytest.approx(1.0)
    assert pm.rouge_l([], ["a"]) == 0.0


def test_ibleu_paper_replaces_the_source_by_the_letters_of_its_first_word(metric, pm: ModuleType) -> None:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    assert pm.released_code_self_reference(["what", "is", "a"]) == ["w", "h", "a", "t"]
    assert pm.released_code_self_reference([]) == []
    predictions = ["what is a good way to learn python ?", "how do i learn python quickly ?"]
    references = ["how do i learn python ?", "what is the fastest way to learn python ?"]
    sources = ["what is the best way to learn python ?", "how can i learn python fast ?"]
    scores = metric.compute(predictions=predictions, references=references, sources=sources)

    def bleu4(hypothesis: str, reference: list[str]) -> float:
        return 100 * sentence_bleu([reference], hypothesis.split(), smoothing_function=SmoothingFunction().method7)

    # First pair: the one-letter token "a" matches a letter of "what"; second: h, o, w match nothing.
    paper_self = [bleu4(predictions[0], list("what")), bleu4(predictions[1], list("how"))]
    assert paper_self[0] > 5 and paper_self[1] == 0
    true_self = [bleu4(p, s.split()) for p, s in zip(predictions, sources)]
    assert scores["self_bleu4"] == pytest.approx(sum(true_self) / 2)
    assert scores["ibleu"] == pytest.approx(0.8 * scores["bleu4"] - 0.2 * scores["self_bleu4"])
    assert scores["ibleu_paper"] == pytest.approx(0.8 * scores["bleu4"] - 0.2 * sum(paper_self) / 2)
    # Copying the input is penalised by ibleu, hardly by ibleu_paper.
    assert scores["ibleu"] < scores["ibleu_paper"] < 0.8 * scores["bleu4"]


def test_meteor_gives_credit_for_a_wordnet_synonym(metric) -> None:
    reference = "the child is happy"
    synonym = metric.compute(predictions=["the kid is happy"], references=[reference])["meteor"]
    unrelated = metric.compute(predictions=["the rock is happy"], references=[reference])["meteor"]
    # kid ~ child (synset child.n.01): 4 matches in one chunk -> 100 * (1 - 0.5 / 4**3) = 99.21875.
    assert synonym == pytest.approx(100 * (1 - 0.5 / 4**3))
    # rock: 3 of 4 match in 2 chunks -> Fmean 0.75, penalty 0.5 * (2/3)**3 -> 75 * (1 - 4/27) = 63.8889.
    assert unrelated == pytest.approx(75 * (1 - 4 / 27))


def test_the_wordnet_reader_reads_nltks_synsets_and_meteor_without_nltks_identity_map(pm: ModuleType, wordnet) -> None:
    """NLTK's own reader of WordNet 3.0 still maps 3.0 onto itself at every load (when this fails, NLTK no longer
    does, and `WordNet30Reader` can go); the metric's reader does not, reads the lemma index and the exception lists
    into the same maps through its own files, and gives the same synsets, lemmas and METEOR."""
    import nltk
    from nltk.translate.meteor_score import meteor_score

    theirs, ours = nltk.corpus.wordnet, pm.WORDNET
    assert theirs.get_version() == ours.get_version() == "3.0"
    # every synset onto its own offset (an adjective key also names its satellite): the identity
    assert theirs.map30 and all(key[:-2] == value[:-2] for key, value in theirs.map30.items())
    assert ours.map30 is None
    assert ours._lemma_pos_offset_map == theirs._lemma_pos_offset_map and len(ours._lemma_pos_offset_map) > 140_000
    assert ours._exception_map == theirs._exception_map
    with ours.open("index.noun") as index, theirs.open("index.noun") as nltks:
        assert isinstance(index, io.TextIOWrapper) and not isinstance(nltks, io.TextIOWrapper)
    words = ["child", "kid", "car", "auto", "happy", "glad", "learn", "study", "fast", "quick", "run", "bank", "rock"]
    words += [lemma.name() for synset in theirs.synsets("dog") + theirs.synsets("run") for lemma in synset.lemmas()]
    for word in words:
        assert [synset.name() for synset in ours.synsets(word)] == [synset.name() for synset in theirs.synsets(word)]
        assert [lemma.name() for lemma in ours.lemmas(word)] == [lemma.name() for lemma in theirs.lemmas(word)]
    pairs = [
        ("the kid is happy", "the child is happy"),
        ("the auto is fast", "the car is quick"),
        ("how do i study math ?", "how can i learn mathematics ?"),
        ("the rock is glad", "the stone is happy"),
    ]
    for prediction, reference in pairs:
        scores = [meteor_score([reference.split()], prediction.split(), wordnet=reader) for reader in (ours, theirs)]
        assert scores[0] == scores[1], (prediction, reference)


def test_empty_prediction_scores_zero_without_crashing(metric) -> None:
    scores = metric.compute(predictions=[""], references=["how can i lose weight ?"], sources=["what is a diet ?"])
    assert len(scores) == 10
    assert scores == pytest.approx(dict.fromkeys(scores, 0.0))
    mixed = metric.compute(predictions=["", "a b c d e"], references=["x y", "a b c d e"])
    assert mixed["rougeL"] == pytest.approx(50.0)


def test_mismatched_lengths_raise_value_error_naming_fields_and_lengths(metric, pm: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"predictions \(2\) and references \(1\)"):
        metric.compute(predictions=["a", "b"], references=["a"])
    with pytest.raises(ValueError, match=r"predictions=1, references=1, sources=2"):
        metric.compute(predictions=["a"], references=["a"], sources=["a", "b"])
    with pytest.raises(ValueError, match=r"predictions=2, references=1"):
        pm.paraphrase_scores(["a", "b"], ["a"])


def test_source_scores_need_sources_and_say_so(metric) -> None:
    scores = metric.compute(predictions=["how do i lose weight ?"], references=["how can i lose weight ?"])
    assert set(scores) == {"bleu2", "bleu4", "rougeL", "meteor", "sacrebleu"}
    with pytest.raises(KeyError, match=r"needs the input sentences.*sources="):
        scores["ibleu"]


def test_missing_wordnet_raises_error_that_explains_the_install(pm: ModuleType, monkeypatch) -> None:
    class AbsentWordNet:
        def ensure_loaded(self) -> None:
            raise LookupError("Resource wordnet not found.")

    monkeypatch.setattr(pm, "WORDNET", AbsentWordNet())
    with pytest.raises(LookupError, match=r"apt-get install .*wordnet-base(.|\n)*cdnpg install-wordnet"):
        pm.paraphrase_scores(["a"], ["a"])


def test_evaluate_load_works_offline(monkeypatch, wordnet: None) -> None:
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise OSError("network access attempted during an offline test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    loaded = evaluate.load(str(METRICS_SCRIPT))
    scores = loaded.compute(predictions=["a b c d e"], references=["a b c d e"])
    assert scores["bleu4"] == pytest.approx(IDENTICAL_BLEU4)


def test_lexnames_table_is_the_documented_wordnet_30_table() -> None:
    installer = _load_file("install_wordnet_under_test", INSTALL_WORDNET)
    lines = installer.lexnames_text().splitlines()
    assert len(lines) == 45
    assert lines[0] == "00\tadj.all\t3" and lines[3] == "03\tnoun.Tops\t1" and lines[44] == "44\tadj.ppl\t3"
    assert [int(line.split("\t")[0]) for line in lines] == list(range(45))
    # Compared with Debian's lexnames(5WN) where the man page is installed (images often drop man pages).
    installer.check_lexnames_against_man_page()


def test_the_wordnet_benchmark_loads_both_readers_and_prints_their_ratio(wordnet, capsys) -> None:
    """`benchmarks/wordnet_load.py`: each round loads the metric's reader and NLTK's; no timing is asserted."""
    import json

    import wordnet_load

    result = wordnet_load.main(["--rounds", "1"])
    assert {name: len(seconds) for name, seconds in result["cpu_seconds"].items()} == {"WordNet30Reader": 1, "nltk": 1}
    assert result["ratio"] == result["median_s"]["WordNet30Reader"] / result["median_s"]["nltk"] > 0
    assert json.loads(capsys.readouterr().out) == result
