"""What the benchmark scripts share: the machine they ran on, results written atomically, markdown tables."""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
import transformers

from cdnpg.training.paraphrase_metrics import normalize

COMMON_WORDS = 1000  # a source word outside the most frequent words of the training text is "rare"
DETAIL_KINDS = ("numbers", "rare")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict:
    """Software versions, CPU, cores, torch threads, GPU (if any) and the load average when called."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def write_json(results: dict, path: Path) -> None:
    """`results` as JSON at `path`, replaced atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, the first column left-aligned and the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * (len(header) - 1)]) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def common_words(texts: Iterable[str], size: int = COMMON_WORDS) -> set[str]:
    """The `size` most frequent words of `texts` (the training sources and targets), as the metrics tokenize them."""
    return {word for word, _ in Counter(word for text in texts for word in normalize(text)).most_common(size)}


def detail_words(source: str, common: set[str]) -> dict[str, set[str]]:
    """A source's distinct details: its numbers (words with a digit) and its rare words (alphabetic, not common)."""
    words = set(normalize(source))
    numbers = {word for word in words if any(ch.isdigit() for ch in word)}
    return {"numbers": numbers, "rare": {w for w in words - numbers - common if any(ch.isalpha() for ch in w)}}


def retention(details: list[dict[str, set[str]]], outputs: list[str]) -> dict[str, float]:
    """% of the sources' detail words, per kind, that reappear in the outputs (pooled over all pairs): a paraphrase
    should keep the numbers and names it was given."""
    kept, total = Counter(), Counter()
    for words, output in zip(details, outputs, strict=True):
        present = set(normalize(output))
        for kind, wanted in words.items():
            kept[kind] += len(wanted & present)
            total[kind] += len(wanted)
    return {kind: 100 * kept[kind] / total[kind] if total[kind] else float("nan") for kind in total}
