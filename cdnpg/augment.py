"""Paraphrase a whole dataset: `augment` adds a model's paraphrases to a 🤗 `datasets.Dataset`, and `augment_to_folder`
writes them for any input `datasets.load_dataset` reads as Parquet shards, on one process or many through
accelerate, resumable after a crash. `cdnpg augment` is `augment_to_folder`.

Every paraphrase comes from the model's text2text pipeline (`paraphrase`, which `cdnpg paraphrase` uses too), so a
row's paraphrases are what `pipeline("text2text-generation", model=..., trust_remote_code=True)` returns for its text
with the same settings. A batch is formed only of rows with the same paraphrase length (`new_tokens`), so a row's
paraphrases never depend on its neighbours: any batch size, chunk size or number of processes gives the same
dataset.

The folder `augment_to_folder` writes is a dataset in the Hub's layout: `data/train-00000-of-00012.parquet`, ... (chunk
k holds rows [k × chunk_size, (k + 1) × chunk_size) of the input), which `datasets.load_dataset(folder,
split="train")` reads back in input order, and `augment.json`, what made it (model, input, column, settings, chunk
size, rows). Each shard is written under a hidden temporary name and renamed when complete: a run that is killed
leaves only whole shards, and the same run started again skips them. A run with anything else different is refused.

Imports only the standard library at load: the command line imports it before it knows the command.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdnpg.errors import InputError

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from cdnpg.ranking import SentenceSimilarity
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CHUNK_SIZE",
    "AugmentSettings",
    "augment",
    "augment_to_folder",
    "load_rows",
    "paraphrase",
    "paraphraser_for",
]  # fmt: skip

DEFAULT_BATCH_SIZE = 32  # rows per generate() call
DEFAULT_CHUNK_SIZE = 1000  # rows per shard: what a killed run loses at most, per process
MANIFEST = "augment.json"
SHARDS = "data"  # the shards' folder, as the Hub lays out a dataset: data/train-00000-of-00012.parquet
SPLIT = "train"
MOST_SHARDS = 99_999  # datasets' pattern for data/{split}-NNNNN-of-NNNNN.* has five digits
COLUMNS = ("paraphrases", "scores")  # the columns added
# by extension: the datasets builder that reads it, and its options
READERS = {".jsonl": ("json", {}), ".json": ("json", {}), ".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}),
           ".parquet": ("parquet", {}), ".txt": ("text", {}), ".arrow": ("arrow", {})}  # fmt: skip
TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt")  # read as UTF-8 text: checked before datasets reads them
PROGRESS_SECONDS = 1.0


# ---------------------------------------------------------------------------------------------------------------------
# Paraphrasing a batch through the pipeline
# ---------------------------------------------------------------------------------------------------------------------


def paraphrase(
    paraphraser: CDNPGText2TextPipeline,
    texts: Sequence[str],
    num_beams: int | None = None,
    num_return_sequences: int = 1,
    max_new_tokens: int | None = None,
    novelty: float | None = None,
    first_index: int = 1,
    keep_details: float | None = None,
    rank_by: str | dict[str, float] | None = None,
    num_candidates: int | None = None,
    similarity: SentenceSimilarity | None = None,
    numbers: Sequence[int] | None = None,
) -> list[list[dict[str, str | float]]]:
    """The candidates of each text, through the text2text pipeline (so the command and the pipeline check inputs,
    decode and detokenise alike), as one batch: `{"generated_text": ...}`, with `novelty`, `keep_details`, `rank_by`
    or `num_candidates` also `"score"` (what ranks them) and its parts. `rank_by`, `num_candidates` and `similarity`
    are `generation_cdnpg.ParaphraseSettings`'. Each text is one line (runs of whitespace are one space).

    A text with nothing to paraphrase (empty, blank, or only unknown tokens: `pipeline_cdnpg.unreadable`) gets none,
    and one longer than the model takes is truncated to that (not to the paper's 20 tokens), each with the
    pipeline's warning. Warnings name the texts by `numbers` (e.g. their line numbers in the input), else
    `first_index`, `first_index` + 1, ...
    """
    from cdnpg.inference import new_tokens
    from modeling_cdnpg.pipeline_cdnpg import FewerCandidatesWarning, input_limit, unreadable

    model, tokenizer = paraphraser.model, paraphraser.tokenizer
    sources = [text.strip() for text in texts]
    limit, _ = input_limit(model, tokenizer)
    longest = max((min(len(ids), limit) for ids in tokenizer(sources, verbose=False)["input_ids"]), default=0)
    longest = max(0, longest - tokenizer.num_special_tokens_to_add())  # of the text, special tokens not counted
    settings = {"max_new_tokens": new_tokens(model, longest, max_new_tokens), "max_length": None}
    given = {"num_beams": num_beams, "num_return_sequences": num_return_sequences, "novelty": novelty,
             "keep_details": keep_details, "rank_by": rank_by, "num_candidates": num_candidates,
             "similarity": similarity}  # fmt: skip
    settings |= {key: value for key, value in given.items() if value is not None}
    numbers = list(numbers) if numbers is not None else list(range(first_index, first_index + len(sources)))
    with warnings.catch_warnings():  # the pipeline's own warning of fewer candidates: said below, numbered by line
        warnings.simplefilter("ignore", FewerCandidatesWarning)
        found = paraphraser(sources, batch_size=max(1, len(sources)), input_numbers=numbers, **settings)
    for number, source, candidates in zip(numbers, sources, found):
        for candidate in candidates:  # one line each: no tabs or newlines inside
            candidate["generated_text"] = " ".join(candidate["generated_text"].split())
        # novelty keeps only distinct candidates that are not the input; an unreadable input has none, said already
        if len(candidates) < num_return_sequences and not unreadable(tokenizer, source):
            logger.warning(
                "input %d: %d of %d candidates: the beam searches found no more that differ from each other and from "
                "the input (more --num-beams may find more)",
                number,
                len(candidates),
                num_return_sequences,
            )
    return found


@dataclass(frozen=True)
class AugmentSettings:
    """How each row is paraphrased: `paraphrase`'s settings (None: the model's generation_config). `rank_by` as a
    user writes it (`cdnpg.ranking.parse_ranking`). `batch_size` is part of them: rows batched differently may round
    differently, and a resumed run must add what an uninterrupted one adds."""

    num_return_sequences: int = 1
    novelty: float | None = None
    keep_details: float | None = None
    rank_by: str | None = None
    num_beams: int | None = None
    max_new_tokens: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE

    def check(self) -> None:
        """Raises `InputError` naming the first setting out of range."""
        counts = {"num_return_sequences": self.num_return_sequences, "batch_size": self.batch_size,
                  "num_beams": self.num_beams, "max_new_tokens": self.max_new_tokens}  # fmt: skip
        for name, value in counts.items():
            if value is not None and value < 1:
                raise InputError(f"{name} must be at least 1, got {value}")
        for name, value in (("novelty", self.novelty), ("keep_details", self.keep_details)):
            if value is not None and not 0 <= value <= 1:
                raise InputError(f"{name} must be between 0 and 1, got {value}")
        if self.rank_by is not None:
            from cdnpg.ranking import parse_ranking

            try:
                parse_ranking(self.rank_by)
            except ValueError as err:
                raise InputError(f"rank_by {self.rank_by}: {err}") from err


def paraphraser_for(
    model: str | PreTrainedModel | CDNPGText2TextPipeline,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: str = "auto",
    dtype: str | None = None,
    trust_remote_code: bool = False,
) -> CDNPGText2TextPipeline:
    """The text2text pipeline of `model`: a folder or Hub id (`cdnpg.inference.load_model`, on `device`), a loaded
    model (with its `tokenizer`, else the one saved beside it) or a pipeline, which is used as it is. `dtype`
    (float32, bfloat16, float16) casts a model that is loaded here."""
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

    if isinstance(model, CDNPGText2TextPipeline):
        return model
    if isinstance(model, str):
        from cdnpg.inference import load_model

        model, tokenizer = load_model(model, device, trust_remote_code)
        if dtype is not None:
            import torch

            if dtype == "float16" and model.device.type == "cpu":
                raise InputError("--dtype float16 needs a GPU: on a CPU use bfloat16 or float32")
            model = model.to(getattr(torch, dtype))
    elif tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
    return CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)


def _similarity(paraphraser: CDNPGText2TextPipeline, rank_by: str | None) -> SentenceSimilarity | None:
    """The sentence embedder a ranking that weighs similarity needs (the ranking given, else the model's), or None."""
    from cdnpg.ranking import SentenceSimilarity, default_similarity_model, needs_similarity, parse_ranking

    model = paraphraser.model
    ranking = parse_ranking(rank_by) if rank_by is not None else getattr(model.generation_config, "rank_by", None)
    if not needs_similarity(ranking):
        return None
    return SentenceSimilarity.from_pretrained(default_similarity_model(), device=model.device)


def blank(text: object) -> bool:
    """A row with nothing to paraphrase: its text is null, empty or only whitespace."""
    return not isinstance(text, str) or not text.strip()


def paraphrase_rows(
    paraphraser: CDNPGText2TextPipeline,
    texts: Sequence[str | None],
    settings: AugmentSettings,
    similarity: SentenceSimilarity | None = None,
    first_number: int = 1,
) -> tuple[list[list[str]], list[list[float] | None]]:
    """Each text's paraphrases and their scores (None where the decoding gives none: the model's own beam search),
    in input order; a blank or null text gets none. Rows are batched `settings.batch_size` at a time among rows of
    the same paraphrase length (`cdnpg.inference.new_tokens`, which a batch's longest input sets), so that a row's
    paraphrases never depend on the rows beside it. `first_number` numbers the rows in warnings."""
    import torch

    from cdnpg.inference import new_tokens
    from cdnpg.ranking import parse_ranking
    from modeling_cdnpg.pipeline_cdnpg import input_limit

    model, tokenizer = paraphraser.model, paraphraser.tokenizer
    paraphrases: list[list[str]] = [[] for _ in texts]
    scores: list[list[float] | None] = [None if settings.novelty is None else [] for _ in texts]
    readable = [index for index, text in enumerate(texts) if not blank(text)]
    limit, _ = input_limit(model, tokenizer)
    special = tokenizer.num_special_tokens_to_add()
    lengths = [min(len(ids), limit) - special for ids in tokenizer([texts[i].strip() for i in readable],
               verbose=False)["input_ids"]] if readable else []  # fmt: skip
    groups: dict[int, list[int]] = {}  # paraphrase length -> the rows, in input order
    for index, length in zip(readable, lengths):  # a length given is every row's
        key = settings.max_new_tokens or new_tokens(model, max(0, length))
        groups.setdefault(key, []).append(index)
    rank_by = parse_ranking(settings.rank_by) if settings.rank_by is not None else None
    with torch.inference_mode():
        for rows in groups.values():
            for start in range(0, len(rows), settings.batch_size):
                batch = rows[start : start + settings.batch_size]
                found = paraphrase(
                    paraphraser,
                    [texts[i] for i in batch],
                    num_beams=settings.num_beams,
                    num_return_sequences=settings.num_return_sequences,
                    max_new_tokens=settings.max_new_tokens,
                    novelty=settings.novelty,
                    keep_details=settings.keep_details,
                    rank_by=rank_by,
                    similarity=similarity,
                    numbers=[first_number + i for i in batch],
                )
                for index, candidates in zip(batch, found):
                    paraphrases[index] = [candidate["generated_text"] for candidate in candidates]
                    if any("score" in candidate for candidate in candidates) or scores[index] is not None:
                        scores[index] = [float(candidate["score"]) for candidate in candidates]
    return paraphrases, scores


def _features(dataset: Dataset | IterableDataset):
    """The input's features and the two added columns: every shard has the same schema, null scores included."""
    from datasets import Features, List, Value

    features = dataset.features
    if features is None:  # an IterableDataset whose features are not known before it is read
        return None
    return Features({**features, "paraphrases": List(Value("string")), "scores": List(Value("float64"))})


def check_column(dataset: Dataset | IterableDataset, column: str) -> None:
    """`column` is a column of `dataset`, and the added ones are not."""
    names = list(dataset.column_names or [])
    if names and column not in names:
        raise InputError(f"--column {column}: no such column; the data has {', '.join(names)}")
    feature = (dataset.features or {}).get(column)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise InputError(f"--column {column} holds {getattr(feature, 'dtype', type(feature).__name__)}, not text")
    if taken := [name for name in COLUMNS if name in names]:
        raise InputError(f"the data already has a column {taken[0]}, which augment adds: rename or remove it first")


def warn_blank(count: int) -> None:
    if count:
        logger.warning("%d rows have an empty, blank or null text: they get no paraphrases", count)


def augment(
    dataset: Dataset | IterableDataset,
    model: str | PreTrainedModel | CDNPGText2TextPipeline,
    column: str = "text",
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    num_return_sequences: int = 1,
    novelty: float | None = None,
    keep_details: float | None = None,
    rank_by: str | None = None,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str = "auto",
    trust_remote_code: bool = False,
    keep_in_memory: bool = False,
) -> Dataset | IterableDataset:
    """`dataset` with two columns added: `paraphrases` (a list of strings) and `scores` (a float per paraphrase, or
    None where the decoding gives no score, as the model's own beam search does). Every row and column is kept, in
    order; a row whose `column` is empty, blank or null gets no paraphrases (one warning gives their count).

    `model`: a folder or Hub id (loaded on `device`), a loaded model (with its `tokenizer`), or a C-DNPG pipeline.
    The settings are the pipeline's (None: the model's generation_config). An `IterableDataset` is paraphrased as
    it is read. `keep_in_memory`: `Dataset.map`'s (else the result is cached on disk, memory-mapped).

    Raises:
        InputError: `column` is not in the dataset, a setting is out of range, or the model does not load.
    """
    settings = AugmentSettings(num_return_sequences, novelty, keep_details, rank_by, num_beams, max_new_tokens,
                               batch_size)  # fmt: skip
    settings.check()
    check_column(dataset, column)
    paraphraser = paraphraser_for(model, tokenizer, device, trust_remote_code=trust_remote_code)
    return _augmented(dataset, paraphraser, column, settings, _similarity(paraphraser, rank_by), keep_in_memory)


def _augmented(
    dataset: Dataset | IterableDataset,
    paraphraser: CDNPGText2TextPipeline,
    column: str,
    settings: AugmentSettings,
    similarity: SentenceSimilarity | None,
    keep_in_memory: bool = False,
    first_number: int = 1,
    warn: bool = True,
) -> Dataset | IterableDataset:
    from datasets import Dataset
    from datasets.fingerprint import generate_random_fingerprint

    blanks = 0

    def add(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        nonlocal blanks
        texts = batch[column]
        blanks += sum(blank(text) for text in texts)
        paraphrases, scores = paraphrase_rows(paraphraser, texts, settings, similarity, first_number + indices[0])
        return {"paraphrases": paraphrases, "scores": scores}

    options: dict[str, Any] = {"batched": True, "batch_size": 4 * settings.batch_size, "with_indices": True,
                               "features": _features(dataset)}  # fmt: skip
    if isinstance(dataset, Dataset):
        # a fresh fingerprint: datasets would hash the function, the model's weights with it (seconds a call), and
        # would reuse a cached result for a model changed in memory
        result = dataset.map(add, keep_in_memory=keep_in_memory, desc="paraphrasing",
                             new_fingerprint=generate_random_fingerprint(), **options)  # fmt: skip
        if warn:
            warn_blank(blanks)
        return result
    return dataset.map(add, **options)


# ---------------------------------------------------------------------------------------------------------------------
# Reading the input
# ---------------------------------------------------------------------------------------------------------------------


def check_utf8(path: Path) -> None:
    """A text file datasets would read (JSON, CSV, TSV, text) is UTF-8: else one line naming it, and where."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    read = 0
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                raise InputError(
                    f"--data {path}: not UTF-8 text (byte {read + err.start}: {err.reason}): convert it, e.g. with "
                    f"iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}"
                ) from None
            read += len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise InputError(f"--data {path}: not UTF-8 text (it ends inside a character)") from None


def _hub_offline() -> bool:
    import datasets
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE)


def load_rows(source: str, split: str | None = None, max_rows: int | None = None) -> Dataset:
    """The rows of `source` as a `Dataset` (Arrow, memory-mapped): a JSONL, JSON, CSV, TSV, Parquet or text file, a
    folder of them, or a Hub dataset id, through `datasets.load_dataset`; `split` where it has several; its first
    `max_rows` rows.

    Raises:
        InputError: no such file or dataset, a text file that is not UTF-8 (named), several splits and no `split`
            (listed), a split it does not have, the Hub unreachable or switched off (HF_HUB_OFFLINE) for a Hub id.
    """
    import datasets

    from cdnpg.hub import first_line

    path = Path(source)
    if path.is_file():
        if path.suffix.lower() not in READERS:
            known = ", ".join(READERS)
            raise InputError(f"--data {source}: cannot tell its format from {path.suffix or 'no extension'!r}; "
                             f"name it with one of {known}")  # fmt: skip
        builder, options = READERS[path.suffix.lower()]
        if path.suffix.lower() in TEXT_SUFFIXES:
            check_utf8(path)
        arguments: tuple = (builder,)
        options = {**options, "data_files": str(path)}
    elif path.is_dir():
        for file in sorted(path.rglob("*")):
            if file.is_file() and file.suffix.lower() in TEXT_SUFFIXES and not file.name.startswith("."):
                check_utf8(file)
        arguments, options = (str(path),), {}
    elif path.suffix.lower() in READERS or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise InputError(f"--data {source}: no such file or folder")
    elif _hub_offline():
        raise InputError(
            f"--data {source}: no such file or folder, and the Hub is switched off (HF_HUB_OFFLINE) for it as a "
            "Hub dataset id: give a local file or folder, or unset HF_HUB_OFFLINE"
        )
    else:
        from cdnpg.hub import hub_repo_problem

        if problem := hub_repo_problem(source, repo_type="dataset"):
            raise InputError(f"--data {source}: no such file or folder, and as a Hub dataset id: {problem}")
        arguments, options = (source,), {}
    try:
        found = datasets.load_dataset(*arguments, **options)
    except (ConnectionError, TimeoutError) as err:
        raise InputError(f"--data {source}: cannot reach the Hugging Face Hub for it ({first_line(err)})") from err
    except FileNotFoundError as err:
        raise InputError(f"--data {source}: no such file, folder or Hub dataset ({first_line(err)})") from err
    except (OSError, ValueError) as err:
        raise InputError(f"--data {source}: cannot read it ({first_line(err)})") from err
    except Exception as err:  # datasets' DatasetGenerationError and the Hub client's errors: the first line says why
        cause = err.__cause__ or err
        raise InputError(f"--data {source}: cannot read it ({type(cause).__name__}: {first_line(cause)})") from err
    if split is None:
        if len(found) > 1:
            raise InputError(f"--data {source} has several splits ({', '.join(found)}): choose one with --split")
        rows = next(iter(found.values()))
    elif split not in found:
        raise InputError(f"--split {split}: --data {source} has {', '.join(found)}")
    else:
        rows = found[split]
    if max_rows is not None and max_rows < len(rows):
        rows = rows.select(range(max_rows))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# The folder: shards, manifest, lock, progress
# ---------------------------------------------------------------------------------------------------------------------


def shard_path(output_dir: Path, chunk: int, chunks: int) -> Path:
    """Chunk `chunk`'s shard: data/train-00003-of-00012.parquet (datasets reads the shards in name order)."""
    return output_dir / SHARDS / f"{SPLIT}-{chunk:05d}-of-{chunks:05d}.parquet"


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary)` to a hidden name beside `path` (datasets ignores it), then rename it to `path`: a reader,
    or a run resumed after `kill -9`, sees a whole shard or none."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _model_identity(paraphraser: CDNPGText2TextPipeline, model: str) -> dict[str, Any]:
    """What says which model paraphrased: its folder (absolute) and its weights files' sizes and times, or the Hub id
    and commit."""
    folder = Path(model)
    if folder.is_dir():
        weights = {path.name: [path.stat().st_size, path.stat().st_mtime_ns]
                   for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))}  # fmt: skip
        return {"model": str(folder.resolve()), "weights": weights}
    return {"model": model, "commit": getattr(paraphraser.model.config, "_commit_hash", None)}


def manifest_difference(found: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """The first entry in which an earlier run's manifest differs from this run's, in words; None if they agree."""
    for key in wanted:
        if found.get(key) != wanted[key]:
            return f"{key} was {json.dumps(found.get(key))}, now {json.dumps(wanted[key])}"
    return None


class Progress:
    """The rows every process has finished, counted from the shards in the folder (no collective communication):
    one tqdm bar on the main process's stderr with rows per second and the time left, or, where stderr is not a
    terminal, a log line at every tenth."""

    def __init__(self, output_dir: Path, chunks: int, chunk_size: int, rows: int) -> None:
        from tqdm import tqdm

        self.output_dir, self.chunks, self.chunk_size, self.rows = output_dir, chunks, chunk_size, rows
        self.done = self.count()
        self.terminal = sys.stderr.isatty()
        self.bar = tqdm(total=rows, initial=self.done, unit="row", file=sys.stderr, disable=not self.terminal,
                        desc="paraphrasing")  # fmt: skip
        self.tenths = 10 * self.done // max(rows, 1)
        self.started, self.first = time.monotonic(), self.done
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def count(self) -> int:
        return sum(min(self.chunk_size, self.rows - chunk * self.chunk_size) for chunk in range(self.chunks)
                   if shard_path(self.output_dir, chunk, self.chunks).exists())  # fmt: skip

    def update(self) -> None:
        done = self.count()
        if done == self.done:
            return
        self.bar.update(done - self.done)
        self.done = done
        tenths = 10 * done // max(self.rows, 1)
        if not self.terminal and tenths > self.tenths:
            self.tenths = tenths
            elapsed = time.monotonic() - self.started
            rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
            left = (self.rows - done) / rate if rate > 0 else math.inf
            logger.info("%d%%: %d of %d rows, %.1f rows/s, %s left", 10 * tenths, done, self.rows, rate,
                        "unknown" if math.isinf(left) else time.strftime("%H:%M:%S", time.gmtime(left)))  # fmt: skip

    def run(self) -> None:
        while not self.stop.wait(PROGRESS_SECONDS):
            self.update()

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.update()
        self.bar.close()


@contextmanager
def _one_run(output_dir: Path, argv: Sequence[str]) -> Iterator[None]:
    """Training's run lock (`cdnpg.training.output_dir.run_lock`) on --output-dir: one run at a time."""
    from types import SimpleNamespace

    from cdnpg.training.arguments import UsageError
    from cdnpg.training.output_dir import run_lock

    try:
        with run_lock(SimpleNamespace(output_dir=str(output_dir)), argv, flag="--output-dir"):
            yield
    except UsageError as err:
        raise InputError(str(err)) from None


def check_output_dir(output_dir: Path) -> None:
    """--output-dir is, or can become, a folder this process can write (tried with a temporary file, which goes
    when closed: permissions alone do not tell, for root or on a read-only filesystem)."""
    import tempfile

    existing = next(path for path in (output_dir, *output_dir.absolute().parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == output_dir else f"is inside {existing}, a file"
        raise InputError(f"--output-dir {output_dir} {where}, not a folder: choose another --output-dir")
    for folder in (existing, output_dir / SHARDS):
        if folder.is_dir():
            try:
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as err:
                raise InputError(f"--output-dir {output_dir}: cannot write in {folder} ({err.strerror})") from None


def augment_to_folder(
    data: str,
    model: str,
    column: str,
    output_dir: str | os.PathLike,
    *,
    split: str | None = None,
    settings: AugmentSettings = AugmentSettings(),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_rows: int | None = None,
    device: str = "auto",
    dtype: str | None = None,
    trust_remote_code: bool = False,
    argv: Sequence[str] = (),
) -> int:
    """Paraphrase the rows of `data` (`load_rows`) into `output_dir` as Parquet shards of `chunk_size` rows (see the
    module's docstring); returns the number of rows. Under `accelerate launch` each process paraphrases the chunks
    k with k mod N = its index, and writes their shards; the main process shows the progress of all, and at the end
    says where the dataset is. Chunks already in `output_dir` are kept and skipped.

    Raises:
        InputError: bad input (`load_rows`, `check_column`, a setting), an `output_dir` that is a file or cannot be
            written, one that holds another run's shards (its manifest differs: the line names how) or that another
            run holds: nothing is written.
    """
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    settings.check()
    if chunk_size < 1:
        raise InputError(f"--chunk-size must be at least 1, got {chunk_size}")
    if max_rows is not None and max_rows < 1:
        raise InputError(f"--max-rows must be at least 1, got {max_rows}")
    output = Path(output_dir)
    check_output_dir(output)
    state = PartialState(cpu=not torch.cuda.is_available())
    from cdnpg.training.checks import unconnected_processes

    if launched := unconnected_processes(state.num_processes):
        raise InputError(
            f"{launched} processes were launched but not connected: each would paraphrase everything. On CPUs launch "
            "with --multi_gpu (accelerate's name for several processes) or --config_file "
            "training/configs/accelerate/ddp.yaml"
        )

    with state.main_process_first(), _datasets_quiet():  # the main process converts the input to Arrow once
        rows = load_rows(data, split, max_rows)
    check_column(rows, column)
    chunks = max(1, math.ceil(len(rows) / chunk_size))
    if chunks > MOST_SHARDS:
        raise InputError(f"--chunk-size {chunk_size}: {chunks} chunks of {len(rows)} rows, more than "
                         f"{MOST_SHARDS}; choose a --chunk-size of at least {math.ceil(len(rows) / MOST_SHARDS)}")  # fmt: skip
    if device in ("auto", "cuda") and state.device.type == "cuda":
        device = str(state.device)  # each process its own GPU
    paraphraser = paraphraser_for(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    similarity = _similarity(paraphraser, settings.rank_by)
    source = str(Path(data).resolve()) if Path(data).exists() else data
    # in the order a difference is named: the first one found
    manifest = {**_model_identity(paraphraser, model), "data": source, "split": split, "column": column,
                "settings": asdict(settings), "dtype": dtype, "chunk_size": chunk_size, "rows": len(rows),
                "input_fingerprint": rows._fingerprint}  # fmt: skip
    with _one_run(output, argv):
        refusal: list[str | None] = [None]
        if state.is_main_process:
            refusal[0] = _claim(output, manifest)
        if state.num_processes > 1:
            broadcast_object_list(refusal)
        if refusal[0] is not None:
            raise InputError(refusal[0])
        mine = [chunk for chunk in range(state.process_index, chunks, state.num_processes)]
        with (
            _progress(state.is_main_process, output, chunks, chunk_size, len(rows)),
            _each_warning_once(),
            _datasets_quiet(),
        ):
            try:
                for chunk in mine:
                    shard = shard_path(output, chunk, chunks)
                    if shard.exists():
                        continue
                    first = chunk * chunk_size
                    part = rows.select(range(first, min(first + chunk_size, len(rows))))
                    part = _augmented(part, paraphraser, column, settings, similarity, keep_in_memory=True,
                                      first_number=first + 1, warn=False)  # fmt: skip
                    write_atomically(shard, part.to_parquet)
            except KeyboardInterrupt:
                if state.is_main_process:
                    logger.info("stopped; the finished chunks are kept in %s: the same command continues", output)
                raise
            state.wait_for_everyone()
        if state.is_main_process:
            return _finish(output, chunks, len(rows), column)
    return len(rows)


def _claim(output: Path, manifest: dict[str, Any]) -> str | None:
    """On the main process, holding the lock: refuse a folder of another run (the line names the difference), or
    one with files that no run of this command wrote; else write this run's manifest."""
    path = output / MANIFEST
    if path.is_file():
        try:
            found = json.loads(path.read_text())
        except ValueError:
            return f"--output-dir {output}: its {MANIFEST} is not a manifest this command wrote: choose another folder"
        if difference := manifest_difference(found, manifest):
            return (f"--output-dir {output} holds the shards of another run: its {difference}. Run it with the "
                    "same model, input, column and settings to continue it, or choose another --output-dir")  # fmt: skip
        return None
    if output.is_dir() and any(output.iterdir()):
        entries = ", ".join(sorted(entry.name for entry in output.iterdir())[:4])
        return f"--output-dir {output} is not empty ({entries}) and holds no {MANIFEST}: choose another --output-dir"
    output.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda temporary: temporary.write_text(json.dumps(manifest, indent=2) + "\n"))
    (output / SHARDS).mkdir(exist_ok=True)
    return None


@contextmanager
def _datasets_quiet() -> Iterator[None]:
    """No progress bars of datasets' own (Progress counts the rows of every process), as they were afterwards."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    enabled = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            enable_progress_bar()


@contextmanager
def _each_warning_once() -> Iterator[None]:
    """The model's Python warnings (e.g. that its z is not calibrated), each said once as a log line of the run,
    rather than once per chunk with a source line."""
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if str(message) not in said:
            said.add(str(message))
            logger.warning("%s", message)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield


@contextmanager
def _progress(main: bool, output: Path, chunks: int, chunk_size: int, rows: int) -> Iterator[None]:
    if not main:
        yield
        return
    with Progress(output, chunks, chunk_size, rows):
        yield


def _finish(output: Path, chunks: int, rows: int, column: str) -> int:
    """After every process is done: every shard is there (a folder the machines do not share would lack some), the
    temporary files of killed runs are gone, one warning counts the blank rows, and the last line says where the
    dataset is and how to load it or push it to the Hub."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    missing = [chunk for chunk in range(chunks) if not shard_path(output, chunk, chunks).exists()]
    if missing:
        raise InputError(
            f"--output-dir {output}: {len(missing)} of {chunks} shards are missing after every process finished "
            f"(first {shard_path(output, missing[0], chunks).name}): on several machines, --output-dir must be a "
            "folder every machine sees"
        )
    for stale in (output / SHARDS).glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    blanks = 0
    for chunk in range(chunks):
        texts = pq.read_table(shard_path(output, chunk, chunks), columns=[column])[column]
        blanks += texts.null_count + (pc.sum(pc.equal(pc.utf8_trim_whitespace(texts), "")).as_py() or 0)
    warn_blank(blanks)
    logger.info(
        "wrote %d rows to %s: load them with datasets.load_dataset(%r, split=%r), and push them to the Hub with "
        ".push_to_hub(REPO_ID) on what it returns",
        rows,
        output,
        str(output),
        SPLIT,
    )
    return rows
