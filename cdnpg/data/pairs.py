"""Local paraphrase pair files: JSON lines, CSV or TSV, one file per split.

JSON lines are read with datasets' ``"text"`` builder (one row per line, so a row's index is its line number) and
parsed line by line in ``Dataset.map``. Not with the ``"json"`` builder: it parses a whole file into one Arrow table,
so a single bad line, or a number where other lines have text, fails the file without saying which line. CSV and TSV
go through the csv module: with standard quoting a record may span lines, and pandas (datasets' ``"csv"`` builder)
pads short rows and does not say on which line a skipped row was.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from pathlib import Path
from typing import Any

import sacrebleu
from datasets import Dataset, DatasetDict, Features, List, Value, concatenate_datasets, load_dataset

from .records import (
    MAX_REPORTED_LINES,
    DataFileError,
    FileReport,
    MissingColumnError,
    PairDataReport,
    check_file,
    check_text,
    csv_records,
)

PAIR_FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv")
# one row per record: its first line, the pair (None when malformed) and what is wrong with it (None when usable)
RECORD_FEATURES = Features(
    {"line": Value("int64"), "source": Value("string"), "target": Value("string"), "problem": Value("string")}
)


def _checked(source: Any, target: Any, source_column: str, target_column: str) -> tuple[Any, Any, str | None]:
    """``(source, target, None)`` for a usable pair, else :func:`_malformed` with the reason."""
    problem = check_text(source_column, source) or check_text(target_column, target)
    return (source, target, None) if problem is None else _malformed(problem)


def _malformed(problem: str) -> tuple[None, None, str]:
    return None, None, problem


def _parse_json_lines(
    batch: dict[str, list[str]], indices: list[int], source_column: str, target_column: str
) -> dict[str, list[Any]]:
    """Parse a batch of lines: a record per non-blank line, with the keys it has (None when it is not an object)."""
    records: dict[str, list[Any]] = {name: [] for name in (*RECORD_FEATURES, "keys")}
    for index, text in zip(indices, batch["text"]):
        if not text.strip():
            continue
        keys = None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            pair = _malformed(f"invalid JSON ({err.msg})")
        else:
            if isinstance(record, dict):
                keys = list(record)
                pair = _checked(record.get(source_column), record.get(target_column), source_column, target_column)
            else:
                pair = _malformed(f"not a JSON object (got {type(record).__name__})")
        for name, value in zip(records, (index + 1, *pair, keys)):
            records[name].append(value)
    return records


def _read_json_lines(path: Path, source_column: str, target_column: str) -> Dataset:
    data_files = glob.escape(str(path))  # a file name, not a pattern: "train[1].jsonl" is that file
    lines = load_dataset("text", data_files=data_files, split="train", features=Features({"text": Value("string")}))
    records = lines.map(
        _parse_json_lines,
        batched=True,
        with_indices=True,
        remove_columns=["text"],
        features=Features({**RECORD_FEATURES, "keys": List(Value("string"))}),
        fn_kwargs={"source_column": source_column, "target_column": target_column},
        desc=f"reading {path.name}",
    )
    objects = records.filter(lambda keys: keys is not None, input_columns="keys")
    if len(objects):
        found = sorted({key for keys in objects["keys"] for key in keys})
        for column in (source_column, target_column):
            if column not in found:
                raise MissingColumnError(f"column {column!r} not found in any line of {path}; columns found: {found}")
    return records.remove_columns("keys")


def _read_delimited(path: Path, source_column: str, target_column: str) -> Dataset:
    """CSV is read with standard quoting (fields may hold commas and newlines); TSV as plain tab-separated lines.

    TSV has no quoting convention (IANA text/tab-separated-values forbids tabs and newlines inside fields), and
    paraphrase TSVs are full of unbalanced quote characters, so quotes are kept as text there.
    """
    csv_file = path.suffix.lower() == ".csv"
    records: dict[str, list[Any]] = {name: [] for name in RECORD_FEATURES}
    with path.open(encoding="utf-8", newline="") as handle:
        delimiter, quoting = ("," if csv_file else "\t"), (csv.QUOTE_MINIMAL if csv_file else csv.QUOTE_NONE)
        header, rows = csv_records(handle, path, delimiter, quoting)
        for column in (source_column, target_column) if header is not None else ():
            if column not in header:
                raise MissingColumnError(
                    f"column {column!r} not found in the header of {path}; columns found: {header}"
                )
        for line, row, problem in rows:
            if problem is not None:
                pair = _malformed(problem)
            elif len(row) != len(header):
                pair = _malformed(f"expected {len(header)} fields, got {len(row)}")
            else:
                source, target = row[header.index(source_column)], row[header.index(target_column)]
                pair = _checked(source, target, source_column, target_column)
            for name, value in zip(records, (line, *pair)):
                records[name].append(value)
    return Dataset.from_dict(records, features=RECORD_FEATURES)


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
        DataFileError: unknown extension, a column absent from the header / from every JSON line, or no usable
            record.
    """
    result = DatasetDict()
    report = PairDataReport()
    for split, raw_path in data_files.items():
        path = Path(raw_path)
        suffix = path.suffix.lower()
        if suffix not in PAIR_FILE_EXTENSIONS:
            raise DataFileError(
                f"unsupported extension {suffix!r} for {path}; allowed: {', '.join(PAIR_FILE_EXTENSIONS)}"
            )
        path = check_file(path)
        file_report = report.files[split] = FileReport(path=str(path))
        if path.stat().st_size == 0:  # datasets refuses to build an empty split
            records = Dataset.from_dict({name: [] for name in RECORD_FEATURES}, features=RECORD_FEATURES)
        elif suffix in (".jsonl", ".json"):
            records = _read_json_lines(path, source_column, target_column)
        else:
            records = _read_delimited(path, source_column, target_column)
        problems = records.filter(lambda problem: problem is not None, input_columns="problem")
        shown = problems.select(range(min(MAX_REPORTED_LINES, len(problems))))
        file_report.malformed_lines = list(zip(shown["line"], shown["problem"]))
        pairs = records.filter(lambda problem: problem is None, input_columns="problem")
        file_report.records, file_report.malformed, file_report.kept = len(records), len(problems), len(pairs)
        if file_report.records and not len(pairs):
            raise DataFileError(f"no usable pair in {path}, is it the right format? {file_report.summary()}")
        report.split_sizes[split] = len(pairs)
        result[split] = pairs.select_columns(["source", "target"])
    report.log_malformed()
    return result, report


def both_directions(pairs: Dataset) -> Dataset:
    """The pairs followed by each pair reversed (target -> source), for a symmetric relation such as Quora's
    duplicates: twice the training data. A reversed pair already among the pairs is not added twice."""
    present = set(zip(pairs["source"], pairs["target"]))
    reverse = pairs.map(
        lambda batch: {"source": batch["target"], "target": batch["source"]}, batched=True, desc="Reversing pairs"
    )
    reverse = reverse.filter(
        lambda sources, targets: [pair not in present for pair in zip(sources, targets)],
        input_columns=["source", "target"],
        batched=True,
    )
    return concatenate_datasets([pairs, reverse])


def near_copy_bleu(pairs: Dataset) -> list[float]:
    """sacreBLEU's sentence BLEU (0 to 100, lowercased) of each pair's target against its source: how much of the
    source a target repeats."""
    return [
        sacrebleu.sentence_bleu(target, [source], lowercase=True).score
        for source, target in zip(pairs["source"], pairs["target"])
    ]


def drop_near_copies(pairs: Dataset, max_bleu: float) -> Dataset:
    """The pairs whose target repeats its source less than `max_bleu` (`near_copy_bleu`). A model with a copy
    mechanism learns from near-copies that copying the source whole is likely, and beam search then returns it."""
    if not 0 < max_bleu <= 100:
        raise ValueError(f"max_bleu must be in (0, 100], got {max_bleu}")
    scores = near_copy_bleu(pairs)
    return pairs.select([i for i, score in enumerate(scores) if score < max_bleu])


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
