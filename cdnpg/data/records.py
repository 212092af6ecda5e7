"""What every loader reports about its input files, and the record-level checks they share.

Bad records never stop a run: they are counted, logged with their line numbers, and returned in the report, which
training saves next to its results.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from datasets import Dataset, Features, Value
from transformers.utils.logging import tqdm

if TYPE_CHECKING:
    import tqdm.std

logger = logging.getLogger(__name__)

PAIR_FEATURES = Features({"source": Value("string"), "target": Value("string")})


class DataFileError(ValueError):
    """An input file that cannot be read as pairs at all (its extension, a missing column, no usable record): the
    message names the file and what was found; `training/run.py` prints it as one line."""


class MissingColumnError(DataFileError):
    """A column the loader was told to read is in no line (or not in the header) of a file."""


class TooFewPairsError(DataFileError):
    """A file holds fewer usable pairs than the split sizes ask for (`available` < `requested`)."""

    def __init__(self, message: str, available: int, requested: int):
        super().__init__(message)
        self.available, self.requested = available, requested


MAX_REPORTED_LINES = 5  # line numbers quoted per file in warnings; the counts are always complete
PROGRESS_DELAY = 2.0  # seconds: a file read faster than this draws no progress bar


def reading_progress(path: Path, lines: Iterable[str] | None = None) -> tqdm.std.tqdm:
    """The progress bar of reading `path` (over `lines`, or updated by hand), drawn only once reading takes longer
    than PROGRESS_DELAY: a small file is read without one."""
    return tqdm(lines, desc=f"reading {path.name}", unit=" lines", leave=False, delay=PROGRESS_DELAY)


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


def pair_dataset(pairs: Sequence[tuple[str, str]]) -> Dataset:
    return Dataset.from_dict(
        {"source": [s for s, _ in pairs], "target": [t for _, t in pairs]},
        features=PAIR_FEATURES,
    )


def check_file(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return path


def check_text(name: str, value: Any) -> str | None:
    """The reason a field is unusable as a sentence, or None when it is a non-empty string."""
    if value is None:
        return f"missing {name!r}"
    if not isinstance(value, str):
        return f"{name!r} is not a string (got {type(value).__name__})"
    if not value.strip():
        return f"empty {name!r}"
    return None


def csv_records(
    handle: TextIO, path: Path, delimiter: str, quoting: int = csv.QUOTE_MINIMAL
) -> tuple[list[str] | None, Iterator[tuple[int, list[str], str | None]]]:
    """The header of a delimited file (None when the file is empty), and its records as ``(first physical line,
    fields, problem)``: problem is None, or why the csv module could not parse the record (its fields are then []).

    Blank lines are skipped. With standard quoting a record may span several lines (a quoted newline), so line
    numbers come from the reader, not from a counter.
    """
    reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
    header = next(reader, None)
    if header is not None:
        header = [name.strip() for name in header]

    def records() -> Iterator[tuple[int, list[str], str | None]]:
        bar = reading_progress(path)
        previous_line = reader.line_num
        while True:
            start = previous_line + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                yield start, [], f"unparseable record ({err})"
                previous_line = reader.line_num
                continue
            bar.update(reader.line_num - previous_line)
            previous_line = reader.line_num
            if row:  # the csv module returns [] for blank lines
                yield start, row, None
        bar.close()

    return header, records()
