"""Paraphrase corpora and the default tokenizer for C-DNPG.

C-DNPG (Gu et al., "Continuous Decomposition of Granularity for Neural Paraphrase Generation", COLING 2022) is trained
and evaluated on Quora Question Pairs and the Twitter URL corpus, lowercased and BERT-basic-tokenized
(``what ' s the best way to learn ?``). This module provides:

* :func:`template_corpus`: a small corpus written for this project (no third-party text) so that training runs offline
  on a fresh machine. Sentence-level templates are paired with paraphrased templates and filled with phrase-level
  details that must be copied from source to target: the two granularities C-DNPG separates.
* :func:`load_pair_files`: local JSONL / CSV / TSV pair files, with malformed lines counted and reported.
* :func:`prepare_quora` and :func:`prepare_twitter_url`: the paper's corpora rebuilt from their raw downloads.
* :func:`train_wordpiece_tokenizer`, :func:`save_tokenizer`, :func:`load_tokenizer`: a lowercase WordPiece tokenizer
  that saves in a form both transformers 5.x and 4.57 can load.

Every loader returns ``(DatasetDict, PairDataReport)`` with columns ``source`` and ``target``. Bad lines never stop a
run: they are counted, logged with their line numbers, and returned in the report.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, Features, List, Value
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.utils.logging import tqdm

logger = logging.getLogger(__name__)

__all__ = [
    "PORTABLE_TOKENIZER_CLASS",
    "SLOT_FILLERS",
    "SPECIAL_TOKENS",
    "TEMPLATE_FAMILIES",
    "FileReport",
    "PairDataReport",
    "SlotPool",
    "UnknownWordMapper",
    "load_pair_files",
    "load_tokenizer",
    "make_tokenizer_config_portable",
    "normalize_text",
    "prepare_quora",
    "prepare_twitter_url",
    "save_tokenizer",
    "template_corpus",
    "template_slots",
    "train_wordpiece_tokenizer",
    "write_pair_files",
    "write_template_corpus",
]

PAIR_FEATURES = Features({"source": Value("string"), "target": Value("string")})
MAX_REPORTED_LINES = 5  # line numbers quoted per file in warnings; the counts are always complete
PAIR_FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv")


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
# Reports
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class FileReport:
    """What happened to the records of one input file: kept, filtered by a rule, or malformed (with line numbers)."""

    path: str
    records: int = 0  # records read, header and blank lines excluded
    kept: int = 0  # records that became pairs
    filtered: int = 0  # well-formed records dropped by a corpus rule (non-duplicate, rating <= 3)
    malformed: int = 0  # records that could not be read as a pair
    malformed_lines: list[tuple[int, str]] = field(default_factory=list)  # first few (line number, reason)

    def add_malformed(self, line: int, reason: str) -> None:
        """Count a malformed record; keep its line number and reason only for the first few, to bound memory."""
        self.malformed += 1
        if len(self.malformed_lines) < MAX_REPORTED_LINES:
            self.malformed_lines.append((line, reason))

    def summary(self) -> str:
        """One line for logs, e.g. ``train.tsv: 3 malformed of 100 records (line 5: expected 2 fields, got 3; ...)``."""
        head = f"{self.path}: {self.malformed} malformed of {self.records} records"
        if not self.malformed_lines:
            return head
        shown = "; ".join(f"line {line}: {reason}" for line, reason in self.malformed_lines)
        more = ", ..." if self.malformed > len(self.malformed_lines) else ""
        return f"{head} ({shown}{more})"


@dataclass
class PairDataReport:
    """Per-file reports, final split sizes and free-text notes (shortfalls, overlap removal, unused pairs)."""

    files: dict[str, FileReport] = field(default_factory=dict)
    split_sizes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def malformed(self) -> int:
        """Total malformed records over all files."""
        return sum(report.malformed for report in self.files.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, to be saved next to a prepared corpus."""
        return asdict(self)

    def note(self, message: str, level: int = logging.INFO) -> None:
        """Record a note and log it, so the same sentence is in the log and in the saved report."""
        self.notes.append(message)
        logger.log(level, message)

    def log_malformed(self) -> None:
        """Log one warning per file that had malformed records."""
        for report in self.files.values():
            if report.malformed:
                logger.warning("skipped malformed records: %s", report.summary())


def _pair_dataset(pairs: Sequence[tuple[str, str]]) -> Dataset:
    return Dataset.from_dict(
        {"source": [s for s, _ in pairs], "target": [t for _, t in pairs]},
        features=PAIR_FEATURES,
    )


def _progress(iterable: Iterable[Any], path: Path) -> Iterator[Any]:
    """Progress bar over the lines of a raw file; the paper's raw files have 0.4M-2M lines."""
    return iter(tqdm(iterable, desc=f"reading {path.name}", unit=" lines", leave=False))


def _check_file(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return path


def _check_text(name: str, value: Any) -> str | None:
    """The reason a field is unusable as a sentence, or None when it is a non-empty string."""
    if value is None:
        return f"missing {name!r}"
    if not isinstance(value, str):
        return f"{name!r} is not a string (got {type(value).__name__})"
    if not value.strip():
        return f"empty {name!r}"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Local pair files (JSONL / CSV / TSV)
# ---------------------------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path, source_column: str, target_column: str, report: FileReport) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    columns_found: set[str] = set()
    objects = 0
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(_progress(handle, path), start=1):
            if not line.strip():
                continue
            report.records += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                report.add_malformed(line_number, f"invalid JSON ({err.msg})")
                continue
            if not isinstance(record, dict):
                report.add_malformed(line_number, f"not a JSON object (got {type(record).__name__})")
                continue
            objects += 1
            columns_found.update(record)
            source, target = record.get(source_column), record.get(target_column)
            reason = _check_text(source_column, source) or _check_text(target_column, target)
            if reason:
                report.add_malformed(line_number, reason)
                continue
            pairs.append((source, target))
    for column in (source_column, target_column):
        if objects and column not in columns_found:
            raise ValueError(
                f"column {column!r} not found in any line of {path}; columns found: {sorted(columns_found)}"
            )
    return pairs


def _read_delimited(
    path: Path, delimiter: str, source_column: str, target_column: str, report: FileReport
) -> list[tuple[str, str]]:
    """CSV is read with standard quoting (fields may hold commas and newlines); TSV as plain tab-separated lines.

    TSV has no quoting convention (IANA text/tab-separated-values forbids tabs and newlines inside fields), and
    paraphrase TSVs are full of unbalanced quote characters, so quotes are kept as text there.
    """
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        header = next(reader, None)
        if header is None:
            return pairs
        header = [name.strip() for name in header]
        for column in (source_column, target_column):
            if column not in header:
                raise ValueError(f"column {column!r} not found in the header of {path}; columns found: {header}")
        source_index, target_index = header.index(source_column), header.index(target_column)
        pairs.extend(_delimited_rows(reader, path, len(header), source_index, target_index, report))
    return pairs


def _iter_csv_records(reader: Any, path: Path, report: FileReport) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(first physical line, fields)``; a record the csv module cannot parse is reported, not raised."""
    bar = tqdm(desc=f"reading {path.name}", unit=" lines", leave=False)
    previous_line = reader.line_num
    while True:
        start = previous_line + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            report.records += 1
            report.add_malformed(start, f"unparseable record ({err})")
            previous_line = reader.line_num
            continue
        bar.update(reader.line_num - previous_line)
        previous_line = reader.line_num
        if row:  # the csv module returns [] for blank lines
            yield start, row
    bar.close()


def _delimited_rows(
    reader: Any, path: Path, n_fields: int, source_index: int, target_index: int, report: FileReport
) -> Iterator[tuple[str, str]]:
    for line_number, row in _iter_csv_records(reader, path, report):
        report.records += 1
        if len(row) != n_fields:
            report.add_malformed(line_number, f"expected {n_fields} fields, got {len(row)}")
            continue
        source, target = row[source_index], row[target_index]
        reason = _check_text("source", source) or _check_text("target", target)
        if reason:
            report.add_malformed(line_number, reason)
            continue
        yield source, target


def load_pair_files(
    data_files: dict[str, str | os.PathLike[str]],
    source_column: str = "source",
    target_column: str = "target",
) -> tuple[DatasetDict, PairDataReport]:
    """Load paraphrase pairs from local files, one per split, chosen by extension.

    ``.jsonl`` / ``.json`` (one JSON object per line), ``.csv`` (header row, standard quoting) or ``.tsv`` (header
    row, tab-separated, no quoting). The input columns are renamed to ``source`` / ``target`` so that the rest of the
    project sees one schema. Malformed records (bad JSON, missing or empty fields, wrong field count) are skipped,
    counted and logged with their line numbers, and never shift columns. Text is kept as written (no normalisation).
    A file in which *no* record is usable (e.g. a JSON array instead of JSON lines) is a format error and raises.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: unknown extension, a column absent from the header / from every JSON line, or no usable record.
    """
    result = DatasetDict()
    report = PairDataReport()
    for split, raw_path in data_files.items():
        path = Path(raw_path)
        suffix = path.suffix.lower()
        if suffix not in PAIR_FILE_EXTENSIONS:
            raise ValueError(
                f"unsupported extension {suffix!r} for {path}; allowed: {', '.join(PAIR_FILE_EXTENSIONS)}"
            )
        path = _check_file(path)
        file_report = FileReport(path=str(path))
        if suffix in (".jsonl", ".json"):
            pairs = _read_jsonl(path, source_column, target_column, file_report)
        else:
            delimiter = "," if suffix == ".csv" else "\t"
            pairs = _read_delimited(path, delimiter, source_column, target_column, file_report)
        file_report.kept = len(pairs)
        if file_report.records and not pairs:
            raise ValueError(f"no usable pair in {path}, is it the right format? {file_report.summary()}")
        report.files[split] = file_report
        report.split_sizes[split] = len(pairs)
        result[split] = _pair_dataset(pairs)
    report.log_malformed()
    return result, report


def write_pair_files(dataset: DatasetDict, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write each split as ``<out_dir>/<split>.jsonl`` with ``source`` / ``target`` keys (UTF-8, not ASCII-escaped)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, split_data in dataset.items():
        paths[split] = out_dir / f"{split}.jsonl"
        with paths[split].open("w", encoding="utf-8") as handle:
            for source, target in zip(split_data["source"], split_data["target"]):
                handle.write(json.dumps({"source": source, "target": target}, ensure_ascii=False) + "\n")
    return paths


# ---------------------------------------------------------------------------------------------------------------------
# Splitting helpers shared by the paper's corpora
# ---------------------------------------------------------------------------------------------------------------------


def _resolve_sizes(
    available: int, sizes: dict[str, int | None], scale_if_short: bool, what: str, report: PairDataReport
) -> dict[str, int]:
    """Turn requested split sizes into actual ones; at most one size may be None, meaning "all the rest".

    A request larger than what the file holds is an error unless ``scale_if_short``, which shrinks every requested
    size by the same factor (so the split ratios of the paper are kept) and says so in the report.
    """
    fixed = {name: size for name, size in sizes.items() if size is not None}
    if any(size < 0 for size in fixed.values()):
        raise ValueError(f"split sizes must be >= 0, got {sizes}")
    requested = sum(fixed.values())
    if requested > available:
        message = f"{what}: {available} pairs available but {requested} requested ({fixed})"
        if not scale_if_short:
            raise ValueError(f"{message}; pass smaller sizes or scale_if_short=True")
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
    splits: dict[str, list[tuple[str, str]]], order: Sequence[str], report: PairDataReport
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


def _finish(splits: dict[str, list[tuple[str, str]]], report: PairDataReport) -> tuple[DatasetDict, PairDataReport]:
    result = DatasetDict({name: _pair_dataset(pairs) for name, pairs in splits.items()})
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
) -> tuple[DatasetDict, PairDataReport]:
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
    path = _check_file(raw_path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv"):
        raise ValueError(f"unsupported extension {suffix!r} for {path}; allowed: .csv, .tsv")
    clean = _cleaner(normalize, unk_vocab)
    file_report = FileReport(path=str(path))
    report = PairDataReport(files={"quora": file_report})
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="," if suffix == ".csv" else "\t")
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in QUORA_COLUMNS if name not in header]
        if missing:
            raise ValueError(f"{path} lacks the Quora columns {missing}; columns found: {header}")
        q1, q2, label = (header.index(name) for name in QUORA_COLUMNS)
        for line_number, row in _iter_csv_records(reader, path, file_report):
            file_report.records += 1
            if len(row) != len(header):
                file_report.add_malformed(line_number, f"expected {len(header)} fields, got {len(row)}")
                continue
            if row[label].strip() not in ("0", "1"):
                file_report.add_malformed(line_number, f"is_duplicate is {row[label]!r}, not 0 or 1")
                continue
            if row[label].strip() == "0":
                file_report.filtered += 1
                continue
            source, target = clean(row[q1]), clean(row[q2])
            reason = _check_text("question1", source) or _check_text("question2", target)
            if reason:
                file_report.add_malformed(line_number, reason)
                continue
            pairs.append((source, target))
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
    path: Path, clean: Callable[[str], str], report: FileReport, allow_unlabelled: bool
) -> list[tuple[str, str]]:
    """Parse ``sent1<TAB>sent2[<TAB>(pos,total)<TAB>url]`` lines; labelled lines are kept if ``pos > 3``."""
    pairs: list[tuple[str, str]] = []
    expected = "2 or 4" if allow_unlabelled else "4"
    with path.open(encoding="utf-8", newline="") as handle:
        for line_number, line in enumerate(_progress(handle, path), start=1):
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
            source, target = clean(fields[0]), clean(fields[1])
            reason = _check_text("sent1", source) or _check_text("sent2", target)
            if reason:
                report.add_malformed(line_number, reason)
                continue
            pairs.append((source, target))
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
) -> tuple[DatasetDict, PairDataReport]:
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
    report = PairDataReport()
    labelled: list[tuple[str, str]] = []
    for raw in test_paths:
        path = _check_file(raw)
        file_report = FileReport(path=str(path))
        report.files[f"labelled:{path.name}"] = file_report
        labelled.extend(_read_twitter_lines(path, clean, file_report, allow_unlabelled=False))
        report.note(f"{path.name}: {file_report.kept} pairs with rating > 3 kept, {file_report.filtered} dropped")
    sizes = _resolve_sizes(
        len(labelled), {"test": test_size, "valid": valid_size}, scale_if_short, "labelled files", report
    )
    splits = _take_splits(labelled, sizes, seed)

    path = _check_file(train_path)
    file_report = FileReport(path=str(path))
    report.files["train"] = file_report
    train_pairs = _read_twitter_lines(path, clean, file_report, allow_unlabelled=True)
    train_sizes = _resolve_sizes(len(train_pairs), {"train": train_size}, scale_if_short, path.name, report)
    splits["train"] = _take_splits(train_pairs, train_sizes, seed)["train"]
    if drop_overlap:
        splits = _drop_overlap(splits, ("train", "valid", "test"), report)
    return _finish({name: splits[name] for name in ("train", "valid", "test")}, report)


# ---------------------------------------------------------------------------------------------------------------------
# Embedded template corpus
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotPool:
    """Fillers of one slot type: ``seen`` ones fill train, ``held_out`` ones appear only in valid and test."""

    seen: tuple[str, ...]
    held_out: tuple[str, ...]


# Phrase-level details. Held-out fillers never occur in train, so a model can only produce them by copying.
# fmt: off
SLOT_FILLERS: dict[str, SlotPool] = {
    "city": SlotPool(
        seen=(
            "london", "paris", "tokyo", "berlin", "madrid", "rome", "chicago", "boston", "toronto", "sydney",
            "mumbai", "delhi", "new york", "san francisco", "los angeles", "hong kong", "cairo", "dubai", "seoul",
            "beijing", "moscow", "istanbul", "amsterdam", "vienna", "prague", "lisbon", "dublin", "seattle", "miami",
            "bangalore",
        ),
        held_out=("reykjavik", "nairobi", "lima", "oslo", "kyoto", "buenos aires", "cape town", "hanoi"),
    ),
    "country": SlotPool(
        seen=(
            "india", "china", "japan", "germany", "france", "canada", "australia", "brazil", "mexico", "italy",
            "spain", "russia", "egypt", "kenya", "nigeria", "the united states", "the united kingdom", "south korea",
            "pakistan", "sweden",
        ),
        held_out=("iceland", "peru", "vietnam", "norway", "new zealand", "argentina"),
    ),
    "vehicle": SlotPool(
        seen=("train", "bus", "car", "plane", "bike", "ferry", "taxi"), held_out=("motorcycle", "helicopter")
    ),
    "name": SlotPool(
        seen=(
            "john", "mary", "david", "sarah", "michael", "emma", "james", "olivia", "ravi", "priya", "ahmed", "fatima",
            "chen", "yuki", "carlos", "maria", "peter", "anna", "tom", "lucy",
        ),
        held_out=("ingrid", "kwame", "thiago", "anika", "dmitri", "siobhan"),
    ),
    "language": SlotPool(
        seen=(
            "english", "spanish", "french", "german", "chinese", "japanese", "hindi", "arabic", "russian", "italian",
            "korean", "portuguese",
        ),
        held_out=("swahili", "finnish", "tagalog", "hungarian"),
    ),
    "proglang": SlotPool(
        seen=("python", "java", "javascript", "c + +", "sql", "ruby", "php", "scala", "swift", "matlab"),
        held_out=("rust", "haskell", "kotlin", "fortran"),
    ),
    "subject": SlotPool(
        seen=(
            "machine learning", "data science", "physics", "chemistry", "economics", "statistics", "calculus",
            "biology", "history", "philosophy", "psychology", "accounting", "web development", "graphic design",
            "digital marketing",
        ),
        held_out=("quantum computing", "astrophysics", "linear algebra", "game theory"),
    ),
    "object": SlotPool(
        seen=(
            "laptop", "phone", "camera", "bicycle", "watch", "tablet", "television", "printer", "smartphone",
            "gaming laptop", "smart tv", "mechanical keyboard",
        ),
        held_out=("telescope", "drone", "microwave", "coffee grinder"),
    ),
    "price": SlotPool(seen=("100", "150", "200", "300", "500", "1000"), held_out=("250", "750", "1200")),
    "food": SlotPool(
        seen=(
            "pizza", "pasta", "rice", "chicken", "eggs", "bread", "salad", "sushi", "chocolate", "ice cream",
            "pancakes", "soup", "peanut butter", "oatmeal",
        ),
        held_out=("kimchi", "falafel", "lasagna", "dumplings"),
    ),
    "animal": SlotPool(
        seen=("dog", "cat", "puppy", "kitten", "parrot", "rabbit", "hamster", "horse", "goldfish", "turtle"),
        held_out=("ferret", "tortoise", "hedgehog", "guinea pig"),
    ),
    "company": SlotPool(
        seen=(
            "google", "amazon", "apple", "microsoft", "facebook", "netflix", "tesla", "ibm", "infosys", "uber",
            "samsung", "intel", "oracle", "adobe",
        ),
        held_out=("spotify", "nvidia", "siemens", "nokia"),
    ),
    "job": SlotPool(
        seen=(
            "doctor", "teacher", "lawyer", "nurse", "pilot", "chef", "data scientist", "software engineer",
            "journalist", "banker", "plumber", "web developer", "graphic designer", "police officer",
        ),
        held_out=("pharmacist", "dentist", "veterinarian", "carpenter"),
    ),
    "sport": SlotPool(
        seen=("football", "cricket", "tennis", "chess", "basketball", "golf", "volleyball", "hockey", "baseball"),
        held_out=("badminton", "rugby", "lacrosse"),
    ),
    "instrument": SlotPool(
        seen=("guitar", "piano", "violin", "drums", "flute", "keyboard"), held_out=("cello", "harp", "saxophone")
    ),
    "num": SlotPool(seen=("2", "3", "4", "5", "6", "7", "8", "10", "12", "15", "20"), held_out=("9", "11", "14", "18")),
    "year": SlotPool(
        seen=("2012", "2013", "2014", "2015", "2016", "2017", "2018", "2019"), held_out=("2008", "2021")
    ),
    "website": SlotPool(
        seen=("quora", "youtube", "instagram", "twitter", "whatsapp", "linkedin", "reddit", "snapchat"),
        held_out=("pinterest", "tumblr", "tiktok", "telegram"),
    ),
    "exam": SlotPool(
        seen=("the gre", "the gmat", "the sat", "the ielts", "the toefl", "the upsc exam", "the jee", "the bar exam"),
        held_out=("the lsat", "the mcat", "the gate exam"),
    ),
    "university": SlotPool(
        seen=("harvard", "stanford", "mit", "oxford", "cambridge", "iit bombay", "yale", "princeton", "berkeley"),
        held_out=("carnegie mellon", "tsinghua", "eth zurich"),
    ),
    "title": SlotPool(
        seen=(
            "breaking bad", "game of thrones", "the godfather", "star wars", "the office", "stranger things",
            "the matrix", "sherlock", "the simpsons", "black mirror", "narcos",
        ),
        held_out=("the wire", "twin peaks", "mad men", "fargo"),
    ),
    "goal": SlotPool(
        seen=(
            "lose weight", "wake up early", "stop procrastinating", "save money", "sleep better", "make new friends",
            "speak in public", "focus while studying", "get rid of acne", "build muscle", "quit smoking",
            "overcome shyness", "write a novel", "start a blog", "make money online", "become more productive",
        ),
        held_out=("learn to juggle", "grow tomatoes indoors", "fix a leaking tap", "stop snoring"),
    ),
}
# fmt: on

# Sentence-level templates: each family lists 2-4 paraphrases with the same slots. ``{city2}`` is a second, different
# ``city``. Written for this project in the Quora style, already lowercased and BERT-basic-tokenized.
TEMPLATE_FAMILIES: tuple[tuple[str, ...], ...] = (
    (
        "how can i get from {city} to {city2} by {vehicle} ?",
        "what is the best way to travel by {vehicle} from {city} to {city2} ?",
        "what ' s the easiest way to go from {city} to {city2} by {vehicle} ?",
        "how do i travel from {city} to {city2} by {vehicle} ?",
    ),
    (
        "what is the best way to learn {language} ?",
        "how can i learn {language} quickly ?",
        "what are some good ways to learn {language} fast ?",
        "what ' s the fastest way to learn {language} ?",
    ),
    (
        "how should i start learning {subject} ?",
        "what is the best way to get started with {subject} ?",
        "where do i begin if i want to learn {subject} ?",
    ),
    (
        "is {proglang} better than {proglang2} for beginners ?",
        "should a beginner learn {proglang} or {proglang2} ?",
        "which is easier to learn for a beginner , {proglang} or {proglang2} ?",
    ),
    (
        "how can i get a job at {company} as a {job} ?",
        "what does it take to be hired by {company} as a {job} ?",
        "how do i become a {job} at {company} ?",
    ),
    (
        "what is the average salary of a {job} in {country} ?",
        "how much does a {job} earn in {country} ?",
        "how much is a {job} paid in {country} ?",
    ),
    (
        "how can i lose {num} kg in {num2} weeks ?",
        "is it possible to lose {num} kg in {num2} weeks ?",
        "what is the fastest way to lose {num} kg within {num2} weeks ?",
    ),
    (
        "what is the best {object} i can buy under {price} dollars ?",
        "which is the best {object} to buy for less than {price} dollars ?",
        "can you recommend a good {object} under {price} dollars ?",
        "which {object} should i buy with a budget of {price} dollars ?",
    ),
    (
        "what do people in {country} think about {country2} ?",
        "how do people from {country} see {country2} ?",
        "what is the opinion of people in {country} about {country2} ?",
    ),
    (
        "how do i take care of a {animal} ?",
        "how should i care for a {animal} ?",
        "what is the right way to look after a {animal} ?",
    ),
    (
        "is eating {food} every day bad for you ?",
        "is it unhealthy to eat {food} every day ?",
        "what happens if i eat {food} every day ?",
    ),
    (
        "how do you make {food} at home ?",
        "what is the easiest way to cook {food} at home ?",
        "how can i prepare {food} at home ?",
    ),
    (
        "how long does it take to learn the {instrument} ?",
        "how many years does it take to learn to play the {instrument} ?",
        "how much time is needed to learn the {instrument} ?",
    ),
    (
        "{name} moved from {city} to {city2} last year .",
        "last year , {name} moved to {city2} from {city} .",
        "{name} left {city} for {city2} last year .",
    ),
    (
        "what is a good gift for my friend {name} who loves {sport} ?",
        "what gift should i buy for {name} , who is a big fan of {sport} ?",
        "my friend {name} loves {sport} . what should i get as a gift ?",
    ),
    (
        "why is {website} so popular ?",
        "what makes {website} so popular ?",
        "why do so many people use {website} ?",
    ),
    (
        "how do i delete my {website} account ?",
        "how can i permanently remove my {website} account ?",
        "what is the way to delete an account on {website} ?",
    ),
    (
        "how should i prepare for {exam} in {num} months ?",
        "what is the best way to prepare for {exam} in {num} months ?",
        "can i crack {exam} with {num} months of preparation ?",
    ),
    (
        "how hard is it to get into {university} for {subject} ?",
        "what does it take to get admission to {university} for {subject} ?",
        "how difficult is admission to {university} to study {subject} ?",
    ),
    (
        "is {title} worth watching ?",
        "should i watch {title} ?",
        "is it worth spending time on {title} ?",
    ),
    (
        "what are the best books to read about {subject} ?",
        "which books would you recommend on {subject} ?",
        "can you suggest some good books on {subject} ?",
    ),
    (
        "is {city} a better place to live than {city2} ?",
        "which city is better to live in , {city} or {city2} ?",
        "should i live in {city} or {city2} ?",
    ),
    (
        "what are the must - see places in {country} ?",
        "which places should i visit in {country} ?",
        "what are the best places to visit in {country} ?",
    ),
    (
        "when is the best time to visit {city} ?",
        "what is the best season to travel to {city} ?",
        "which month is best for a trip to {city} ?",
    ),
    (
        "is it healthy to sleep only {num} hours a day ?",
        "can a person survive on {num} hours of sleep per day ?",
        "is sleeping {num} hours a night enough ?",
    ),
    (
        "what are the benefits of playing {sport} ?",
        "what are the advantages of playing {sport} ?",
        "how does playing {sport} help you ?",
    ),
    (
        "how can i get better at {sport} ?",
        "how do i improve my {sport} skills ?",
        "what should i do to become good at {sport} ?",
    ),
    (
        "how can i {goal} ?",
        "what is the best way to {goal} ?",
        "what are some tips to {goal} ?",
        "what should i do to {goal} ?",
    ),
    (
        "is it possible to {goal} in {num} days ?",
        "can someone {goal} within {num} days ?",
        "how can i {goal} in just {num} days ?",
    ),
    (
        "why did {company} buy {company2} ?",
        "what was the reason {company} acquired {company2} ?",
        "why would {company} want to acquire {company2} ?",
    ),
    (
        "what is it like to work at {company} ?",
        "how is the work culture at {company} ?",
        "what ' s working at {company} really like ?",
    ),
    (
        "what is the difference between {subject} and {subject2} ?",
        "how is {subject} different from {subject2} ?",
        "what distinguishes {subject} from {subject2} ?",
    ),
    (
        "{name} has been learning {language} for {num} years .",
        "for {num} years , {name} has been studying {language} .",
        "{name} started learning {language} {num} years ago .",
    ),
    (
        "{name} bought a new {object} in {city} yesterday .",
        "yesterday {name} got a new {object} in {city} .",
        "in {city} , {name} bought a brand new {object} yesterday .",
    ),
    (
        "how can a {job} from {country} move to {country2} ?",
        "what is the process for a {job} in {country} to immigrate to {country2} ?",
        "how does a {job} from {country} get a work visa for {country2} ?",
    ),
    (
        "what were the biggest tech trends of {year} ?",
        "which technology trends defined {year} ?",
        "what were the most important tech trends in {year} ?",
    ),
    (
        "what are some fun things to do in {city} ?",
        "what can i do for fun in {city} ?",
        "what are the most enjoyable activities in {city} ?",
    ),
    (
        "how long does it take to learn {proglang} ?",
        "how many months are needed to learn {proglang} ?",
        "how quickly can someone learn {proglang} ?",
    ),
    (
        "is {proglang} good for {subject} ?",
        "should i use {proglang} for {subject} ?",
        "how useful is {proglang} for {subject} ?",
    ),
    (
        "{name} and {name2} met in {city} in {year} .",
        "in {year} , {name} met {name2} in {city} .",
        "{name} first met {name2} in {city} back in {year} .",
    ),
    (
        "why does my {animal} keep eating {food} ?",
        "what makes my {animal} eat {food} all the time ?",
        "why is my {animal} always eating {food} ?",
    ),
    (
        "is {city} safe for tourists ?",
        "how safe is {city} for travellers ?",
        "is it safe to visit {city} as a tourist ?",
    ),
    (
        "how can a {job} switch careers to become a {job2} ?",
        "what is the best way to go from being a {job} to a {job2} ?",
        "can a {job} become a {job2} later in life ?",
    ),
    (
        "why does my {object} stop working after {num} minutes ?",
        "what could cause my {object} to shut down after {num} minutes ?",
        "my {object} turns off after {num} minutes . why ?",
    ),
    (
        "how would you explain {subject} to a {num} year old ?",
        "what is a simple way to explain {subject} to a {num} - year - old child ?",
        "how can i teach {subject} to a {num} year old kid ?",
    ),
    (
        "do many people in {country} speak {language} ?",
        "how common is {language} in {country} ?",
        "is {language} widely spoken in {country} ?",
    ),
    (
        "which is better for business , {website} or {website2} ?",
        "should a business use {website} or {website2} ?",
        "is {website} or {website2} better for businesses ?",
    ),
    (
        "does {company} hire a {job} without experience ?",
        "can a {job} with no experience get hired at {company} ?",
        "will {company} hire an inexperienced {job} ?",
    ),
)

_SLOT = re.compile(r"\{(\w+?)(\d*)\}")
TEMPLATE_HELD_OUT_RATE = 0.5  # chance that a slot in valid/test is filled with a held-out filler


def template_slots(template: str) -> list[tuple[str, str]]:
    """``(slot name, slot type)`` for each distinct slot of ``template``, in order: ``{city2}`` -> ``("city2", "city")``."""
    slots: dict[str, str] = {}
    for match in _SLOT.finditer(template):
        slots.setdefault(match.group(1) + match.group(2), match.group(1))
    return list(slots.items())


def _fill(template: str, values: dict[str, str]) -> str:
    return _SLOT.sub(lambda match: values[match.group(1) + match.group(2)], template)


def _sample_template_pair(rng: random.Random, held_out_rate: float) -> tuple[int, str, str, list[str]]:
    family_index = rng.randrange(len(TEMPLATE_FAMILIES))
    family = TEMPLATE_FAMILIES[family_index]
    source_template, target_template = rng.sample(family, 2)
    values: dict[str, str] = {}
    for name, slot_type in template_slots(source_template):
        pool = SLOT_FILLERS[slot_type]
        use_held_out = rng.random() < held_out_rate
        choices = [v for v in (pool.held_out if use_held_out else pool.seen) if v not in values.values()]
        values[name] = rng.choice(choices)
    return family_index, _fill(source_template, values), _fill(target_template, values), list(values.values())


def template_corpus(
    num_train: int = 6000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
    held_out_rate: float = TEMPLATE_HELD_OUT_RATE,
    with_metadata: bool = False,
) -> DatasetDict:
    """Generate the embedded template corpus: paraphrased sentence templates filled with copied details.

    Each pair picks one of :data:`TEMPLATE_FAMILIES`, two different paraphrase templates of it (ordered: either can
    be the source), and one filler per slot, used identically in source and target. Templates are shared by all
    splits; *details* are held out: train uses only ``SlotPool.seen`` fillers, while in valid and test each slot is
    filled from ``SlotPool.held_out`` with probability ``held_out_rate``, so a model has to copy those words rather
    than recall them. Pairs are unique within a split, and valid / test sources never repeat a source of an earlier
    split (small template families saturate first, so larger ones fill the rest). Deterministic for a
    ``seed``, and each split's content depends only on the seed and its own size. ``with_metadata`` adds ``family``
    (template family index) and ``fillers`` (the slot values) columns, used by tests.
    """
    if not 0.0 <= held_out_rate <= 1.0:
        raise ValueError(f"held_out_rate must be in [0, 1], got {held_out_rate}")
    features = PAIR_FEATURES.copy()
    if with_metadata:
        features["family"] = Value("int32")
        features["fillers"] = List(Value("string"))
    seen_sources: set[str] = set()
    result = DatasetDict()
    for split, size, rate in (
        ("train", num_train, 0.0),
        ("valid", num_valid, held_out_rate),
        ("test", num_test, held_out_rate),
    ):
        rng = random.Random(f"cdnpg-template-corpus-{seed}-{split}")
        columns: dict[str, list[Any]] = {name: [] for name in features}
        split_sources: set[str] = set()
        split_pairs: set[tuple[str, str]] = set()
        attempts = 0
        while len(columns["source"]) < size:
            attempts += 1
            if attempts > 100 * size + 1000:
                raise RuntimeError(f"could not draw {size} new {split} pairs; ask for fewer")
            family, source, target, fillers = _sample_template_pair(rng, rate)
            if (source, target) in split_pairs or source in seen_sources:
                continue
            split_pairs.add((source, target))
            split_sources.add(source)
            columns["source"].append(source)
            columns["target"].append(target)
            if with_metadata:
                columns["family"].append(family)
                columns["fillers"].append(fillers)
        seen_sources |= split_sources
        result[split] = Dataset.from_dict(columns, features=features)
    return result


def write_template_corpus(
    out_dir: str | os.PathLike[str],
    num_train: int = 6000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
) -> dict[str, Path]:
    """Write :func:`template_corpus` as ``train.jsonl`` / ``valid.jsonl`` / ``test.jsonl`` in ``out_dir``."""
    corpus = template_corpus(num_train=num_train, num_valid=num_valid, num_test=num_test, seed=seed)
    return write_pair_files(corpus, out_dir)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # in id order: [PAD] is 0 as in BERT
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # a class name known to both transformers 4.57 and 5.x


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 128,
) -> PreTrainedTokenizerFast:
    """Train a lowercase BERT-style WordPiece tokenizer on ``texts``.

    Same pipeline as bert-base-uncased (BertNormalizer, BertPreTokenizer, ``[CLS] text [SEP]``), with [PAD] = 0.
    The WordPiece decoder does not "clean up" spaces, so decoding reproduces the space-separated format of the
    references ("weight ?", not "weight?"), which BLEU against the paper's data needs. ``[CLS]`` / ``[SEP]`` double
    as BOS / EOS for generation. ``model_max_length`` bounds inputs only; the paper truncates sentences to 20 tokens
    in preprocessing. The ``tokenizers`` trainer breaks frequency ties in a different order in every process, so two
    trainings on the same text may differ in a few rare pieces: save the tokenizer with the run and reuse it.
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    logger.info("trained a WordPiece tokenizer with %d tokens", tokenizer.get_vocab_size())
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: the model does not take them
        clean_up_tokenization_spaces=False,
    )


def make_tokenizer_config_portable(directory: str | os.PathLike[str]) -> bool:
    """Rewrite ``tokenizer_class`` in a saved ``tokenizer_config.json`` to one transformers 4.57 can load.

    transformers 5.x saves generic fast tokenizers as ``"TokenizersBackend"``, a class 4.57 does not have. Call this
    on any directory a 5.x ``save_pretrained`` wrote (checkpoints included). Returns True when the file changed.
    """
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") not in (None, "TokenizersBackend"):
        return False
    config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` plus :func:`make_tokenizer_config_portable`, so the files load in transformers 4.57 too."""
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(str(out_dir))
    make_tokenizer_config_portable(out_dir)
    return out_dir


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` on a local directory (or the local HF cache), never downloading.

    BERT tokenizers have no BOS/EOS; ``[CLS]`` / ``[SEP]`` are set as BOS / EOS when missing so that seq2seq
    generation has its start and end tokens, as in :func:`train_wordpiece_tokenizer`.
    """
    path = Path(name_or_path)
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"a tokenizer is loaded from a directory, got the file {path}")
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True)
        except (OSError, ValueError) as err:
            raise FileNotFoundError(
                f"tokenizer {str(name_or_path)!r} not found: no such directory and not in the local Hugging Face "
                "cache (this project never downloads from the Hub)"
            ) from err
    if tokenizer.bos_token is None and tokenizer.cls_token is not None:
        tokenizer.bos_token = tokenizer.cls_token
    if tokenizer.eos_token is None and tokenizer.sep_token is not None:
        tokenizer.eos_token = tokenizer.sep_token
    return tokenizer


if __name__ == "__main__":  # pragma: no cover - convenience: python -m cdnpg.data OUT_DIR writes the template corpus
    logging.basicConfig(level=logging.INFO)
    for split_name, split_path in write_template_corpus(sys.argv[1] if len(sys.argv) > 1 else "data/template").items():
        logger.info("wrote %s to %s", split_name, split_path)
