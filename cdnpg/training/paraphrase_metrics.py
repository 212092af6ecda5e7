"""Paraphrase-generation metrics of C-DNPG (Gu et al., COLING 2022), as an ``evaluate`` module.

Load it offline with ``cdnpg.training.load_metric()`` or ``evaluate.load(str(cdnpg.training.METRICS_SCRIPT))`` (this
file) and call ``compute(predictions=[...], references=[...], sources=[...])``. Every score is multiplied by 100;
the sentence-level ones are computed per sentence and then averaged (the released C-DNPG code averages the same way).

Normalisation
    Prediction, reference and source go through the same steps: lowercase, then BERT's basic pre-tokenisation
    (``tokenizers.pre_tokenizers.BertPreTokenizer``: split on whitespace and around every punctuation character),
    then join with single spaces. Decoded model output reads ``"weight?"`` while the corpus reads ``"weight ?"``;
    both become ``["weight", "?"]`` and score the same. Every metric below sees these tokens.

Metrics (keys of the returned dict)
    ``bleu2``, ``bleu4``
        NLTK ``sentence_bleu`` against the single reference with ``SmoothingFunction().method7``, weights
        ``(1/2, 1/2, 0, 0)`` and ``(1/4, 1/4, 1/4, 1/4)``. BLEU-2 keeps the released code's four-weight form because
        method7 includes method5, which averages each n-gram precision with its neighbours: with the two-weight form
        ``(1/2, 1/2)`` the bigram precision is averaged with the 5-gram one instead of the trigram one and the score
        changes. method5 also seeds its average with ``p1 + 1``, so a prediction identical to a reference of at
        least five tokens gets BLEU-2 = sqrt(4/3 * 10/9) = 121.7 and BLEU-4 = (4/3 * 10/9 * 28/27 * 82/81)^(1/4)
        = 111.7, not 100. The paper's numbers were produced with this behaviour, so it is kept, not clipped.
    ``ibleu``
        iBLEU (Sun & Zhou, 2012) with alpha = 0.8: ``0.8 * BLEU-4(pred, ref) - 0.2 * BLEU-4(pred, source)`` per
        sentence, then averaged. It penalises copying the input. Needs ``sources``.
    ``ibleu_paper``
        The quantity the released C-DNPG code reports as "iBLEU", to compare with the paper's tables. Its self-BLEU
        term is not computed against the source sentence. ``learner.py`` builds the term's reference with
        ``tokenizer.decode(context[0, 0].tolist(), skip_special_tokens=True).split(' ')``:

        * ``context`` is the 2-D ``[batch, length]`` source batch, so ``context[0, 0]`` is a single token id, the
          first token of the source. It is not ``[CLS]``: ``data_loader.TransformerDataset`` strips the stored
          ``[CLS]`` (``src = src_arr[1:]``), so it is the source's first WordPiece, e.g. ``what``.
        * In the transformers 3.x used by that code, ``decode`` of a single int turns the id into the string
          ``"what"`` and then loops over it as if it were a list of tokens, i.e. character by character, giving
          ``"w h a t"`` (this was later fixed in transformers with "If given is a single id, prevents splitting the
          string").

        So the self-BLEU reference the released code saw is the list of characters of the source's first token, and
        that is what ``ibleu_paper`` uses: ``0.8 * BLEU-4(pred, ref) - 0.2 * BLEU-4(pred, list(source_tokens[0]))``.
        The term is zero unless the prediction contains a one-character token that is also a letter of that word
        (``a`` or ``i`` against ``what``/``which``/``is``...), and then it is about 10 BLEU. This explains Table 2 of
        the paper: Transformer BLEU-4 26.88 but "iBLEU" 21.14, a bit below 0.8 * 26.88 = 21.50. Reading
        ``context[0, 0]`` as ``[CLS]`` (lowercased and pre-tokenised: ``[``, ``cls``, ``]``) would make the term
        always zero and ``ibleu_paper == 0.8 * bleu4`` exactly, which the table contradicts. Here the first token is
        the first normalised word of the source, not the first BERT WordPiece; they differ only when that word is
        not in BERT's vocabulary. Needs ``sources``.
        Use ``ibleu_paper`` to compare with Table 2 and ``ibleu`` (with ``self_bleu4``) to see how much the model
        copies its input.
    ``self_bleu4``
        BLEU-4(pred, source), averaged: how much the prediction copies the input. Needs ``sources``.
    ``copy_rate``
        The share (in %) of predictions whose tokens equal their source's: exact copies. Needs ``sources``.
    ``rougeL``
        ROUGE-L as defined by pycocoevalcap's ``Rouge`` (the released code copied it): with ``lcs`` the length of
        the longest common token subsequence, ``prec = lcs / len(pred)``, ``rec = lcs / len(ref)`` and
        ``score = (1 + beta^2) * prec * rec / (rec + beta^2 * prec)`` with beta = 1.2, or 0 if ``lcs`` is 0.
        pycocoevalcap itself is a 100 MB wheel (it bundles Java jars) that depends on pycocotools, so the
        twenty-line LCS is implemented here.
    ``meteor``
        NLTK ``meteor_score([ref_tokens], pred_tokens)`` (alpha 0.9, beta 3, gamma 0.5): exact, Porter-stem and
        WordNet-synonym matches. NLTK runs the synonym stage on the Porter stems left over from the stem stage, so
        only synonyms whose stems are themselves WordNet lemmas get credit (``car``/``auto`` do, ``automobile``
        whose stem is ``automobil`` does not). A prediction identical to a reference of n tokens scores
        ``100 * (1 - 0.5 / n**3)`` (one chunk). WordNet must be installed; there is no fallback: see
        ``cdnpg install-wordnet`` (``training/install_wordnet.py`` in a checkout).
    ``sacrebleu``, ``sacrebleu_self``
        Corpus-level ``sacrebleu.corpus_bleu`` with its default settings (13a tokenisation, exponential smoothing)
        on the normalised strings, against the references and, if given, the sources: a modern, comparable
        cross-check of ``bleu4`` and ``self_bleu4``.
    ``numbers_kept``, ``rare_kept``
        Detail retention, with ``common`` (the most frequent words of the training text, ``common_words``): of the
        sources' distinct words that are numbers (a digit in them), and that are rare (alphabetic, not in ``common``,
        not numbers), the share (in %) that reappears among the prediction's words, pooled over all pairs: a
        paraphrase should keep the numbers and names it was given. NaN when the sources have none. Needs ``sources``.

When ``sources`` is omitted the source-dependent keys (``ibleu``, ``ibleu_paper``, ``self_bleu4``,
``sacrebleu_self``) are absent, and reading one raises a ``KeyError`` that says to pass ``sources``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import combinations

import datasets
import evaluate
import nltk
import numpy as np
import sacrebleu
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from nltk.translate.meteor_score import meteor_score
from tokenizers.pre_tokenizers import BertPreTokenizer

from cdnpg.wordnet import WORDNET

_CITATION = """\
@inproceedings{gu2022cdnpg,
  title={Continuous Decomposition of Granularity for Neural Paraphrase Generation},
  author={Gu, Xiaodong and Zhang, Zhaowei and Lee, Sang-Woo and Yoo, Kang Min and Ha, Jung-Woo},
  booktitle={Proceedings of the 29th International Conference on Computational Linguistics (COLING 2022)},
  year={2022}
}
@inproceedings{sun2012ibleu,
  title={Joint Learning of a Dual {SMT} System for Paraphrase Generation},
  author={Sun, Hong and Zhou, Ming},
  booktitle={Proceedings of ACL 2012 (Volume 2: Short Papers)},
  year={2012}
}
"""

_DESCRIPTION = """\
BLEU-2/4, iBLEU (true and as reported by the C-DNPG release), self-BLEU, ROUGE-L (beta 1.2), METEOR (NLTK, WordNet)
and corpus sacreBLEU for paraphrase generation, on lowercased BERT-pre-tokenised text, all scaled to 0-100.
See the module docstring for the exact definitions.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated paraphrases; empty strings are allowed and score 0.
    references (`list` of `str`): one reference paraphrase per prediction.
    sources (`list` of `str`, optional): the input sentences; needed for ibleu, ibleu_paper, self_bleu4 and
        sacrebleu_self, which are left out without them.
    common (`set` of `str`, optional): the frequent words of the training text (`common_words`); with sources,
        adds numbers_kept and rare_kept.
Returns:
    dict of floats (x100): bleu2, bleu4, rougeL, meteor, sacrebleu, and with sources also ibleu, ibleu_paper,
    self_bleu4, sacrebleu_self.
Examples:
    >>> metric = evaluate.load(str(cdnpg.training.METRICS_SCRIPT))
    >>> scores = metric.compute(predictions=["how do i lose weight?"], references=["how can i lose weight ?"],
    ...                         sources=["what is the best way to lose weight ?"])
    >>> sorted(scores)
    ['bleu2', 'bleu4', 'ibleu', 'ibleu_paper', 'meteor', 'rougeL', 'sacrebleu', 'sacrebleu_self', 'self_bleu4']
"""

BLEU2_WEIGHTS = (0.5, 0.5, 0.0, 0.0)
BLEU4_WEIGHTS = (0.25, 0.25, 0.25, 0.25)
IBLEU_ALPHA = 0.8
ROUGE_BETA = 1.2
COMMON_WORDS = 1000  # a source word outside the most frequent words of the training text is "rare"
SOURCE_KEYS = ("ibleu", "ibleu_paper", "self_bleu4", "sacrebleu_self", "copy_rate")
WORDNET_MISSING = (
    "METEOR needs NLTK's WordNet corpus, which was not found on NLTK's data path ({path}). Install it without "
    "internet access from Debian's WordNet 3.0 packages:\n"
    "    apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index\n"
    "    cdnpg install-wordnet\n"
    "(or, with internet access, python -m nltk.downloader wordnet)."
)

_PRE_TOKENIZER = BertPreTokenizer()
_SMOOTHING = SmoothingFunction().method7


def normalize(text: str) -> list[str]:
    """Lowercase and BERT-pre-tokenise ``text`` so decoded output ("weight?") and corpus text ("weight ?") agree."""
    return [piece for piece, _ in _PRE_TOKENIZER.pre_tokenize_str(text.lower())]


def bleu(hypothesis: list[str], reference: list[str], weights: tuple[float, ...]) -> float:
    """NLTK sentence BLEU with method7 smoothing, as in the released C-DNPG code; 0 for an empty side."""
    if not hypothesis or not reference:
        return 0.0
    return float(sentence_bleu([reference], hypothesis, weights=weights, smoothing_function=_SMOOTHING))


def ibleu(to_reference, to_source):
    """iBLEU (Sun & Zhou, 2012) of BLEU-4 against the reference and against the source (floats or arrays)."""
    return IBLEU_ALPHA * to_reference - (1 - IBLEU_ALPHA) * to_source


def common_words(texts: Iterable[str], size: int = COMMON_WORDS) -> set[str]:
    """The `size` most frequent words of `texts` (the training sources and targets), as the metrics tokenize them."""
    return {word for word, _ in Counter(word for text in texts for word in normalize(text)).most_common(size)}


def detail_words(source: str, common: set[str]) -> dict[str, set[str]]:
    """A source's distinct details: its numbers (words with a digit) and its rare words (alphabetic, not common)."""
    words = set(normalize(source))
    numbers = {word for word in words if any(ch.isdigit() for ch in word)}
    return {"numbers": numbers, "rare": {w for w in words - numbers - common if any(ch.isalpha() for ch in w)}}


def retention(details: list[dict[str, set[str]]], outputs: list[str]) -> dict[str, float]:
    """% of the sources' detail words, per kind, that reappear in the outputs (pooled over all pairs)."""
    kept, total = Counter(), Counter()
    for words, output in zip(details, outputs, strict=True):
        present = set(normalize(output))
        for kind, wanted in words.items():
            kept[kind] += len(wanted & present)
            total[kind] += len(wanted)
    return {kind: 100 * kept[kind] / total[kind] if total[kind] else float("nan") for kind in total}


def candidate_scores(candidates: list[list[str]], sources: list[str], references: list[str]) -> dict[str, float]:
    """What several candidates per source (`num_return_sequences`) give, averaged over the sources: how many are
    distinct, how alike they are (pairwise BLEU-4), how many copy the source, and the true iBLEU of the first-ranked
    candidate, of the mean one and of the best one."""
    distinct, alike, copies, first, mean, best = [], [], [], [], [], []
    for texts, source, reference in zip(candidates, sources, references, strict=True):
        tokens, source, reference = [normalize(text) for text in texts], normalize(source), normalize(reference)
        distinct.append(len({tuple(t) for t in tokens}))
        alike += [100 * bleu(a, b, BLEU4_WEIGHTS) for a, b in combinations(tokens, 2)]
        copies += [100.0 * (t == source) for t in tokens]
        scores = [100 * ibleu(bleu(t, reference, BLEU4_WEIGHTS), bleu(t, source, BLEU4_WEIGHTS)) for t in tokens]
        if scores:
            first.append(scores[0])
            mean.append(sum(scores) / len(scores))
            best.append(max(scores))
    stats = {"distinct": distinct, "pairwise_bleu4": alike, "copies_percent": copies, "ibleu_first": first}
    stats |= {"ibleu_mean": mean, "ibleu_best": best}
    return {key: sum(values) / len(values) if values else float("nan") for key, values in stats.items()}


def lcs_length(first: list[str], second: list[str]) -> int:
    """Length of the longest common subsequence of two token lists (dynamic programming, one row of memory)."""
    if len(first) < len(second):
        first, second = second, first
    row = [0] * (len(second) + 1)
    for token in first:
        diagonal = 0
        for j, other in enumerate(second, start=1):
            above = row[j]
            row[j] = diagonal + 1 if token == other else max(above, row[j - 1])
            diagonal = above
    return row[-1]


def rouge_l(candidate: list[str], reference: list[str], beta: float = ROUGE_BETA) -> float:
    """pycocoevalcap's ROUGE-L F-measure (recall weighted by ``beta``); 0 when nothing is shared."""
    lcs = lcs_length(candidate, reference)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return (1 + beta**2) * precision * recall / (recall + beta**2 * precision)


def released_code_self_reference(source: list[str]) -> list[str]:
    """The self-BLEU reference of the released code: the characters of the source's first token (module docstring)."""
    return list(source[0]) if source else []


def require_wordnet() -> None:
    """Load WordNet (`WORDNET`) or raise a ``LookupError`` that says how to install it offline."""
    try:
        WORDNET.ensure_loaded()
    except LookupError as error:
        raise LookupError(WORDNET_MISSING.format(path=", ".join(nltk.data.path))) from error


class ParaphraseScores(dict):
    """The result dict; reading a source-dependent key that is absent says that ``sources`` was not given."""

    def __missing__(self, key: str) -> float:
        if key in SOURCE_KEYS:
            raise KeyError(f"{key!r} needs the input sentences: call compute(..., sources=[...]) to get it")
        raise KeyError(key)


def _check_lengths(**columns: list[str] | None) -> None:
    """Raise a ValueError naming each field and its length unless all given fields have the same length."""
    lengths = {name: len(values) for name, values in columns.items() if values is not None}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{name}={length}" for name, length in lengths.items())
        raise ValueError(f"predictions, references and sources must have the same length, got {described}")
    if not any(lengths.values()):
        raise ValueError("no predictions to score: predictions and references are empty")


def paraphrase_scores(
    predictions: list[str], references: list[str], sources: list[str] | None = None, common: set[str] | None = None
) -> dict:
    """Compute all metrics (x100); the ``evaluate`` wrapper below delegates here."""
    _check_lengths(predictions=predictions, references=references, sources=sources)
    require_wordnet()
    hyps = [normalize(text) for text in predictions]
    refs = [normalize(text) for text in references]
    bleu4s = np.array([bleu(h, r, BLEU4_WEIGHTS) for h, r in zip(hyps, refs)])
    scores = ParaphraseScores(
        bleu2=100 * float(np.mean([bleu(h, r, BLEU2_WEIGHTS) for h, r in zip(hyps, refs)])),
        bleu4=100 * float(bleu4s.mean()),
        rougeL=100 * float(np.mean([rouge_l(h, r) for h, r in zip(hyps, refs)])),
        meteor=100 * float(np.mean([meteor_score([r], h, wordnet=WORDNET) for h, r in zip(hyps, refs)])),
        sacrebleu=float(sacrebleu.corpus_bleu([" ".join(h) for h in hyps], [[" ".join(r) for r in refs]]).score),
    )
    if sources is not None:
        srcs = [normalize(text) for text in sources]
        self_bleu4s = np.array([bleu(h, s, BLEU4_WEIGHTS) for h, s in zip(hyps, srcs)])
        paper_self = np.array([bleu(h, released_code_self_reference(s), BLEU4_WEIGHTS) for h, s in zip(hyps, srcs)])
        scores["ibleu"] = 100 * float(np.mean(ibleu(bleu4s, self_bleu4s)))
        scores["ibleu_paper"] = 100 * float(np.mean(ibleu(bleu4s, paper_self)))
        scores["self_bleu4"] = 100 * float(self_bleu4s.mean())
        scores["copy_rate"] = 100 * float(np.mean([h == s for h, s in zip(hyps, srcs)]))
        corpus_self = sacrebleu.corpus_bleu([" ".join(h) for h in hyps], [[" ".join(s) for s in srcs]])
        scores["sacrebleu_self"] = float(corpus_self.score)
        if common is not None:
            kept = retention([detail_words(source, common) for source in sources], predictions)
            scores.update({f"{kind}_kept": kept.get(kind, float("nan")) for kind in ("numbers", "rare")})
    return scores


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ParaphraseMetrics(evaluate.Metric):
    """C-DNPG's evaluation metrics; ``sources`` is a compute keyword, not a feature, so that it can be omitted."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            codebase_urls=["https://github.com/guxd/C-DNPG"],
        )

    def _compute(
        self, predictions: list[str], references: list[str], sources: list[str] | None = None, common=None
    ) -> dict:
        return paraphrase_scores(
            list(predictions), list(references), None if sources is None else list(sources), common
        )
