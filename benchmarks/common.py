"""The benchmarks' harness: the shared data and its splits, the decoding, one JSON line per run, and the grouping of
runs into mean ± std. Every benchmark uses it; report.py reads what they write."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import datasets
import torch
import transformers

import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes)
from cdnpg import training
from cdnpg.data import load_pair_files, load_tokenizer
from cdnpg.training.paraphrase_metrics import common_words

ROOT = Path(__file__).resolve().parents[1]
QUORA = ROOT.parent / "shared" / "data" / "quora"  # train.jsonl (10,691 pairs), valid.jsonl (the paper's 4,000)
DECODING = {"num_beams": 8, "max_new_tokens": 20}  # the paper's, and training/run.py's defaults


def read_pairs(path: Path | str, limit: int | None = None, half: str | None = None) -> datasets.Dataset:
    """The pairs of a JSON-lines file, or of its first ("tune") or second ("report") half ("all" or None: every pair);
    the first `limit` of them when given. The halves of the shared valid.jsonl are the benchmarks' tuning and test
    splits; "all" is for a set used for neither, such as the out-of-domain Twitter URL pairs."""
    pairs = load_pair_files({"pairs": str(path)})[0]["pairs"]
    if half not in (None, "all"):
        pairs = pairs.shard(2, ("tune", "report").index(half), contiguous=True)
    return pairs.select(range(min(limit, len(pairs)))) if limit else pairs


def decoding_parser(description: str, split: str, output_dir: str) -> argparse.ArgumentParser:
    """The options every benchmark that decodes a checkpoint on a half of valid.jsonl takes (novelty.py,
    ranking.py); `check_positive` checks their counts once parsed."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("checkpoint", help="a C-DNPG checkpoint folder (model, tokenizer, generation_config.json)")
    add("--split", choices=("tune", "report", "all"), default=split, help="a half of valid.jsonl (all: every pair)")
    add("--valid_file", default=str(QUORA / "valid.jsonl"), help="split in two halves")
    add("--train_file", default=str(QUORA / "train.jsonl"), help="word frequencies (rare words)")
    add("--max_pairs", type=int, default=None, help="decode only the first N pairs of the split")
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add("--output_dir", default=output_dir, help="runs-<split>.jsonl goes here")
    add("--quick", action="store_true", help="a few pairs: the smoke test")
    return parser


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """A usage error of one line for a count option given below 1."""
    for name in names:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")


def load_checkpoint(args: argparse.Namespace) -> tuple:
    """What decoding_parser's options name: the checkpoint's model (eval mode, --threads) and tokenizer, the training
    pairs and their common words (rare-word retention), the pairs of --split, and the paraphrase metric."""
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(args.checkpoint).eval()
    train, pairs = read_pairs(args.train_file), read_pairs(args.valid_file, args.max_pairs, half=args.split)
    common = common_words([*train["source"], *train["target"]])
    return model, load_tokenizer(args.checkpoint), train, common, pairs, training.load_metric()


def machine_info() -> dict:
    """Versions, CPU (/proc/cpuinfo's model name on Linux), cores, torch threads, GPU and the load average now."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), None)
    return {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpu": cpu or platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}  # fmt: skip


def append_run(path: Path, run: dict) -> None:
    """Append one run (benchmark, model, seed, settings, metrics, ...) to a JSON-lines file, with the command that
    produced it and the machine: an interrupted benchmark keeps every run it finished."""
    run = {**run, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "machine": machine_info()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(run, default=str) + "\n")


def read_runs(paths: list[Path | str]) -> list[dict]:
    """Every run of the files, in order: JSON lines, or a file that is one JSON object (a speed.py result)."""
    runs = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        try:
            runs.append(json.loads(text))
        except json.JSONDecodeError:
            runs += [json.loads(line) for line in text.splitlines() if line]
    return runs


def check_setup(path: Path, settings: dict) -> None:
    """Refuse, before anything is trained or decoded, to add runs of another setup to a runs file: report.py would
    refuse to average them with those already there."""
    for run in read_runs([path]) if path.is_file() else []:
        if run.get("settings", {}).keys() == settings.keys() and (keys := differing([run["settings"], settings])):
            raise SystemExit(f"{path} holds runs of another setup ({', '.join(keys)} differ): use another folder")


def differing(settings: list[dict]) -> list[str]:
    """The keys on which some of these settings differ."""
    return sorted({key for s in settings for key in s if any(s.get(key) != t.get(key) for t in settings)})


def group_runs(runs: list[dict], key: str = "model", replicate: str = "seed") -> dict[str, list[dict]]:
    """Runs grouped by `key` (first appearance first), one per `replicate` (the last run of a seed replaces earlier
    ones). Runs of one group whose settings differ are refused, naming the settings."""
    groups: dict[str, dict] = {}
    for run in runs:
        groups.setdefault(run[key], {})[run.get(replicate, 0)] = run
    for name, by_seed in groups.items():
        if keys := differing([run.get("settings", {}) for run in by_seed.values()]):
            raise SystemExit(f"{name}: runs of another setup ({', '.join(keys)} differ)")
    return {name: list(by_seed.values()) for name, by_seed in groups.items()}


def cell(values: list[float], digits: int = 2) -> str:
    """ "mean ± std" over seeds (the sample std), the mean alone for one seed, "–" for none."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "–"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, the first column left-aligned and the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * (len(header) - 1)]) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def write_json(results: dict, path: Path) -> None:
    """`results` as JSON at `path`, replaced atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
