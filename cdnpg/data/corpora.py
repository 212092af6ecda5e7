"""The paper's corpora rebuilt from their raw downloads: Quora Question Pairs and the Twitter URL corpus.

C-DNPG (Gu et al., COLING 2022) is trained and evaluated on both, lowercased and BERT-basic-tokenized
(``what ' s the best way to learn ?``): :func:`normalize_text` reproduces that format, and :class:`UnknownWordMapper`
the ``[UNK]`` of words bert-base-uncased cannot spell. Each loader returns ``(DatasetDict, PairDataReport)`` with
columns ``source`` and ``target``.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from datasets import DatasetDict
from tokenizers import models, normalizers, pre_tokenizers

from . import records

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# Text normalisation
# ---------------------------------------------------------------------------------------------------------------------

# BERT's uncased basic tokenizer: clean control characters, space out CJK, lowercase, strip accents, then split on
# whitespace and punctuation. The paper's released data has no accented letters at all, so accents are stripped.
_NORMALIZER = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
)
_PRE_TOKENIZER = pre_tokenizers.BertPreTokenizer()


class UnknownWordMapper:
    """Maps a word to ``[UNK]`` when a WordPiece vocabulary cannot spell it, as BERT's tokenizer does.

    The paper's released data went through bert-base-uncased, so emoji and rare CJK characters appear there as
    ``[UNK]`` (e.g. ``what is kaizen ( [UNK] [UNK] ) ?``). Passing this mapper reproduces that exactly.
    """

    def __init__(self, vocab_path: str | os.PathLike[str]) -> None:
        path = Path(vocab_path)
        if path.is_dir():
            path = path / "vocab.txt"
        if not path.is_file():
            raise FileNotFoundError(f"WordPiece vocabulary not found: {path}")
        # 100 characters per word: bert-base-uncased's limit, longer words become [UNK]
        self._model = models.WordPiece.from_file(str(path), unk_token="[UNK]", max_input_chars_per_word=100)
        self._cache: dict[str, str] = {}

    def __call__(self, word: str) -> str:
        if word not in self._cache:
            pieces = self._model.tokenize(word)
            self._cache[word] = "[UNK]" if any(piece.value == "[UNK]" for piece in pieces) else word
        return self._cache[word]


def normalize_text(text: str, unknown_words: UnknownWordMapper | None = None) -> str:
    """Lowercase and BERT-basic-tokenize ``text``, joined by single spaces: the format of the paper's data.

    With ``unknown_words``, words outside that WordPiece vocabulary become ``[UNK]``, as in the paper's data.

    >>> normalize_text("What's the weight?")
    "what ' s the weight ?"
    """
    words = (piece for piece, _ in _PRE_TOKENIZER.pre_tokenize_str(_NORMALIZER.normalize_str(text)))
    if unknown_words is not None:
        words = (unknown_words(word) for word in words)
    return " ".join(words)


def _cleaner(normalize: bool, unk_vocab: str | os.PathLike[str] | None) -> Callable[[str], str]:
    """The text function of the paper-corpus loaders: full normalisation, or whitespace collapsing only."""
    if not normalize:
        if unk_vocab is not None:
            raise ValueError("unk_vocab needs normalize=True: [UNK] mapping works on BERT-tokenized words")
        return lambda text: " ".join(text.split())
    unknown_words = UnknownWordMapper(unk_vocab) if unk_vocab is not None else None
    return lambda text: normalize_text(text, unknown_words)


# ---------------------------------------------------------------------------------------------------------------------
# Splitting helpers shared by the paper's corpora
# ---------------------------------------------------------------------------------------------------------------------


def _add_pair(
    pairs: list[tuple[str, str]],
    report: records.FileReport,
    line: int,
    source: tuple[str, str],
    target: tuple[str, str],
) -> None:
    """Append a ``(source, target)`` pair given as ``(field name, text)``, or count it as malformed, naming the field."""
    reason = records.check_text(*source) or records.check_text(*target)
    if reason:
        report.add_malformed(line, reason)
    else:
        pairs.append((source[1], target[1]))


def _resolve_sizes(
    available: int, sizes: dict[str, int | None], scale_if_short: bool, what: str, report: records.PairDataReport
) -> dict[str, int]:
    """Turn requested split sizes into actual ones; at most one size may be None, meaning "all the rest".

    A request larger than what the file holds is a `TooFewPairsError` unless ``scale_if_short``, which shrinks every
    requested size by the same factor (so the split ratios of the paper are kept) and says so in the report.
    """
    fixed = {name: size for name, size in sizes.items() if size is not None}
    if any(size < 0 for size in fixed.values()):
        raise ValueError(f"split sizes must be >= 0, got {sizes}")
    requested = sum(fixed.values())
    if requested > available:
        message = f"{what}: {available} pairs available but {requested} requested ({fixed})"
        if not scale_if_short:
            raise records.TooFewPairsError(
                f"{message}; pass smaller sizes or scale_if_short=True", available, requested
            )
        factor = available / requested
        fixed = {name: int(size * factor) for name, size in fixed.items()}
        report.note(f"{message}; scaled every split by {factor:.3f} to {fixed}", level=logging.WARNING)
    rest = available - sum(fixed.values())
    resolved = {name: fixed[name] if size is not None else rest for name, size in sizes.items()}
    unused = available - sum(resolved.values())
    if unused:
        report.note(f"{what}: {unused} of {available} pairs left unused by the requested split sizes")
    return resolved


def _take_splits(pairs: list[tuple[str, str]], sizes: dict[str, int], seed: int) -> dict[str, list[tuple[str, str]]]:
    """Shuffle with ``seed`` and cut consecutive slices in the order of ``sizes``."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    splits: dict[str, list[tuple[str, str]]] = {}
    start = 0
    for name, size in sizes.items():
        splits[name] = [pairs[i] for i in order[start : start + size]]
        start += size
    return splits


def _drop_overlap(
    splits: dict[str, list[tuple[str, str]]], order: Sequence[str], report: records.PairDataReport
) -> dict[str, list[tuple[str, str]]]:
    """Remove from each split the pairs sharing a sentence with any later split in ``order`` (e.g. train vs test)."""
    protected: set[str] = set()
    for name in reversed(order):
        before = len(splits[name])
        splits[name] = [pair for pair in splits[name] if pair[0] not in protected and pair[1] not in protected]
        if before != len(splits[name]):
            report.note(f"dropped {before - len(splits[name])} {name} pairs sharing a sentence with a later split")
        protected.update(sentence for pair in splits[name] for sentence in pair)
    return splits


def _finish(
    splits: dict[str, list[tuple[str, str]]], report: records.PairDataReport
) -> tuple[DatasetDict, records.PairDataReport]:
    result = DatasetDict({name: records.pair_dataset(pairs) for name, pairs in splits.items()})
    report.split_sizes = {name: len(pairs) for name, pairs in splits.items()}
    report.log_malformed()
    logger.info("split sizes: %s", report.split_sizes)
    return result, report


# ---------------------------------------------------------------------------------------------------------------------
# Quora Question Pairs
# ---------------------------------------------------------------------------------------------------------------------

QUORA_COLUMNS = ("question1", "question2", "is_duplicate")


def prepare_quora(
    raw_path: str | os.PathLike[str],
    seed: int = 0,
    train_size: int | None = 100_000,
    valid_size: int = 4_000,
    test_size: int = 20_000,
    normalize: bool = True,
    unk_vocab: str | os.PathLike[str] | None = None,
    scale_if_short: bool = False,
    drop_overlap: bool = False,
) -> tuple[DatasetDict, records.PairDataReport]:
    """Rebuild the paper's Quora split from the Kaggle Quora Question Pairs file.

    The file is CSV (Kaggle ``train.csv``) or TSV (Quora's ``quora_duplicate_questions.tsv``), chosen by extension,
    with header ``id, qid1, qid2, question1, question2, is_duplicate``; both use standard quoting, so fields may
    contain the delimiter and newlines. Only duplicates (``is_duplicate == 1``) are kept, question1 -> source and
    question2 -> target. The pairs are shuffled with ``seed`` and cut as test first, then valid, then train
    (100K / 4K / 20K as in the paper), so the test set does not change with ``train_size``; ``train_size=None``
    takes all remaining pairs. The paper's exact split cannot be recovered (its seed is not published).

    Args:
        normalize: lowercase + BERT basic tokenization (the paper's format); False only collapses whitespace.
        unk_vocab: a WordPiece ``vocab.txt`` (or a directory holding one, e.g. bert-base-uncased): words it cannot
            spell become ``[UNK]``, exactly like the paper's released data. None keeps every word.
        scale_if_short: if the file has fewer duplicates than requested, shrink all splits proportionally instead
            of raising ValueError.
        drop_overlap: remove train (valid) pairs that share a sentence with valid/test (test). Off by default:
            the paper split pairs at random, and Quora questions recur across pairs.
    """
    path = records.check_file(raw_path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv"):
        raise records.DataFileError(f"unsupported extension {suffix!r} for {path}; allowed: .csv, .tsv")
    clean = _cleaner(normalize, unk_vocab)
    file_report = records.FileReport(path=str(path))
    report = records.PairDataReport(files={"quora": file_report})
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8", newline="") as handle:
        header, rows = records.csv_records(handle, path, delimiter="," if suffix == ".csv" else "\t")
        header = header or []
        missing = [name for name in QUORA_COLUMNS if name not in header]
        if missing:
            raise records.MissingColumnError(f"{path} lacks the Quora columns {missing}; columns found: {header}")
        q1, q2, label = (header.index(name) for name in QUORA_COLUMNS)
        for line_number, row, problem in rows:
            file_report.records += 1
            if problem is not None:
                file_report.add_malformed(line_number, problem)
                continue
            if len(row) != len(header):
                file_report.add_malformed(line_number, f"expected {len(header)} fields, got {len(row)}")
                continue
            if row[label].strip() not in ("0", "1"):
                file_report.add_malformed(line_number, f"is_duplicate is {row[label]!r}, not 0 or 1")
                continue
            if row[label].strip() == "0":
                file_report.filtered += 1
                continue
            _add_pair(pairs, file_report, line_number, ("question1", clean(row[q1])), ("question2", clean(row[q2])))
    file_report.kept = len(pairs)
    report.note(f"{path.name}: {len(pairs)} duplicate pairs kept, {file_report.filtered} non-duplicates dropped")
    sizes = _resolve_sizes(
        len(pairs), {"test": test_size, "valid": valid_size, "train": train_size}, scale_if_short, path.name, report
    )
    splits = _take_splits(pairs, sizes, seed)
    if drop_overlap:
        splits = _drop_overlap(splits, ("train", "valid", "test"), report)
    return _finish({name: splits[name] for name in ("train", "valid", "test")}, report)


# ---------------------------------------------------------------------------------------------------------------------
# Twitter URL corpus
# ---------------------------------------------------------------------------------------------------------------------

_RATING = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
TWITTER_MIN_POSITIVE = 4  # Lan et al. (2017): pairs with more than 3 of 6 annotators saying "paraphrase" are positive


def _read_twitter_lines(
    path: Path, clean: Callable[[str], str], report: records.FileReport, allow_unlabelled: bool
) -> list[tuple[str, str]]:
    """Parse ``sent1<TAB>sent2[<TAB>(pos,total)<TAB>url]`` lines; labelled lines are kept if ``pos > 3``."""
    pairs: list[tuple[str, str]] = []
    expected = "2 or 4" if allow_unlabelled else "4"
    with path.open(encoding="utf-8", newline="") as handle:
        for line_number, line in enumerate(records.reading_progress(path, handle), start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            report.records += 1
            fields = line.split("\t")
            if len(fields) == 4:
                rating = _RATING.match(fields[2].strip())
                if not rating:
                    report.add_malformed(line_number, f"rating {fields[2]!r} is not '(positive,total)'")
                    continue
                if int(rating.group(1)) < TWITTER_MIN_POSITIVE:
                    report.filtered += 1
                    continue
            elif not (allow_unlabelled and len(fields) == 2):
                report.add_malformed(line_number, f"expected {expected} tab-separated fields, got {len(fields)}")
                continue
            _add_pair(pairs, report, line_number, ("sent1", clean(fields[0])), ("sent2", clean(fields[1])))
    report.kept = len(pairs)
    return pairs


def prepare_twitter_url(
    train_path: str | os.PathLike[str],
    test_paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    seed: int = 0,
    train_size: int | None = 110_000,
    valid_size: int = 1_000,
    test_size: int | None = 5_000,
    normalize: bool = True,
    unk_vocab: str | os.PathLike[str] | None = None,
    scale_if_short: bool = False,
    drop_overlap: bool = False,
) -> tuple[DatasetDict, records.PairDataReport]:
    """Rebuild the paper's Twitter URL splits (Lan et al., 2017) from the raw files.

    Train: the automatically collected file, ``sent1<TAB>sent2`` per line, shuffled with ``seed`` and cut to
    ``train_size`` (110K as in the paper; None keeps all). Lines that do carry a human rating (the 4-field format
    below) are filtered like the labelled files.

    Valid / test: the human-labelled files (``Twitter_URL_Corpus_train.txt`` and/or ``..._test.txt``), lines
    ``sent1<TAB>sent2<TAB>(pos,total)<TAB>url``, keeping pairs with ``pos > 3`` (a majority of the 6 annotators).
    The positives of all labelled files are pooled, shuffled with ``seed`` and cut as test first (5,000, or all
    remaining pairs when ``test_size`` is None), then valid (1,000); the paper's 1,000-pair validation set contains
    pairs from the labelled *train* file, hence the pooling. Remaining labelled positives are not used for training,
    as in the paper.

    ``sent1`` -> source, ``sent2`` -> target. Fields are stripped (the raw files have a space before each tab).
    The report has one entry per file: ``"train"`` and ``"labelled:<file name>"``. See :func:`prepare_quora` for
    ``normalize``, ``unk_vocab``, ``scale_if_short`` and ``drop_overlap``.
    """
    if isinstance(test_paths, (str, os.PathLike)):
        test_paths = [test_paths]
    clean = _cleaner(normalize, unk_vocab)
    report = records.PairDataReport()
    labelled: list[tuple[str, str]] = []
    for raw in test_paths:
        path = records.check_file(raw)
        file_report = records.FileReport(path=str(path))
        report.files[f"labelled:{path.name}"] = file_report
        labelled.extend(_read_twitter_lines(path, clean, file_report, allow_unlabelled=False))
        report.note(f"{path.name}: {file_report.kept} pairs with rating > 3 kept, {file_report.filtered} dropped")
    sizes = _resolve_sizes(
        len(labelled), {"test": test_size, "valid": valid_size}, scale_if_short, "labelled files", report
    )
    splits = _take_splits(labelled, sizes, seed)

    path = records.check_file(train_path)
    file_report = records.FileReport(path=str(path))
    report.files["train"] = file_report
    train_pairs = _read_twitter_lines(path, clean, file_report, allow_unlabelled=True)
    train_sizes = _resolve_sizes(len(train_pairs), {"train": train_size}, scale_if_short, path.name, report)
    splits["train"] = _take_splits(train_pairs, train_sizes, seed)["train"]
    if drop_overlap:
        splits = _drop_overlap(splits, ("train", "valid", "test"), report)
    return _finish({name: splits[name] for name in ("train", "valid", "test")}, report)
