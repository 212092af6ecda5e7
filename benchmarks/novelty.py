#!/usr/bin/env python
"""What `generate(novelty=...)` buys over plain beam search, and over the knobs that need no z.

    # the reported run: the last 2,000 Quora validation pairs (see docs/benchmarks.md for the numbers)
    python benchmarks/novelty.py CHECKPOINT --split report --output_dir runs/novelty --plot docs/novelty.png
    # where the rule and its constants were chosen: the first 2,000
    python benchmarks/novelty.py CHECKPOINT --split tune --output_dir runs/novelty-tune
    # a tiny model and a few pairs (the smoke test)
    python benchmarks/novelty.py CHECKPOINT --quick --train_file F --valid_file F --output_dir /tmp/novelty

Every setting decodes the same pairs the way users reach it, through the text2text pipeline (beam 8, at most 20 new
tokens, the model's input limit), and is scored by the project's metric module (`cdnpg.training.score`: BLEU-4,
true iBLEU = 0.8 BLEU-4(reference) - 0.2 BLEU-4(source), self-BLEU-4, the exact-copy rate):

- plain beam search (`novelty` not given: the model's own decoding; `novelty=0` is the same, byte for byte);
- `novelty` 0.001: a penalty of 0.002 nats, i.e. the copy rule alone (an exact copy of the source may not end);
- `novelty` 0.25, 0.5, 0.75, 1 with the checkpoint's z (calibrated on train.jsonl when the checkpoint is not);
- the same rule with a uniform weight (`novelty_z_layer=None`: every bigram weighs 1), and with z the wrong way
  round (the mirror image of the calibrated layer), the ablations of z;
- `keep_details` 0.25, 0.5, 1 on top of `novelty` 0.5, alone at 1, and at 0.5 and 1 with a uniform weight (both rules
  without z), the pull towards the source's details;
- transformers' knobs that need no z: `encoder_no_repeat_ngram_size` 2, 3, 4 and `encoder_repetition_penalty` < 1.

Detail retention: of the distinct source words that are numbers, that are rare (outside the 1,000 most frequent words
of train.jsonl, numbers excluded) and that are details by z (z >= 0.5 in the calibrated layer, a word's z the mean of
its pieces as `cdnpg granularity` shows it), the share that reappears in the output (words as the metric module
normalises them). The human references and the source itself are scored the same way, as anchors.

Decoding time: the pairs are decoded in chunks, every setting on a chunk before the next chunk, so that a change in
the load of a shared machine falls on all settings alike; each setting's total over plain beam search's.

Candidates: on the first `--candidate_pairs` pairs, 5 candidates from beam search (its 5 best beams) and from
`novelty` 0.5 (its diverse candidates): how many are distinct, how alike they are (mean pairwise BLEU-4), how many
copy the source, and the true iBLEU of the first-ranked candidate against their mean and the best one.

Results: `OUTPUT_DIR/results-<split>.json` and a markdown table on stdout; `--plot` draws BLEU-4 against true iBLEU
and against rare-word retention for every family of settings.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import combinations
from pathlib import Path

import torch
import transformers
from common import common_words, detail_words, format_table, machine_info, retention, write_json

import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes)
from cdnpg import training
from cdnpg.data import load_pair_files, load_tokenizer
from cdnpg.granularity import word_granularities
from cdnpg.training.paraphrase_metrics import BLEU4_WEIGHTS, IBLEU_ALPHA, bleu, normalize
from modeling_cdnpg import CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import calibrate_granularity

ROOT = Path(__file__).resolve().parents[1]
QUORA = ROOT.parent / "shared" / "data" / "quora"
NOVELTIES = (0.25, 0.5, 0.75, 1.0)
KEEPS = (0.25, 0.5, 1.0)  # keep_details on top of novelty 0.5
DECODING = {"num_beams": 8, "max_new_tokens": 20}
METRIC_KEYS = ("bleu4", "ibleu", "self_bleu4", "copy_rate")
RETENTION_KEYS = ("numbers", "rare", "high_z")
FAMILIES = {  # plot label and style of each family of settings
    "beam": ("beam search", "k*"),
    "copy_rule": ("the copy rule alone (novelty 0.001)", "P"),
    "z": ("novelty, z (this work)", "o-"),
    "uniform": ("novelty, uniform weight", "s--"),
    "mirrored": ("novelty, z the wrong way round", "v:"),
    "keep": ("novelty 0.5 + keep_details, z (this work)", "o-"),
    "keep_uniform": ("novelty 0.5 + keep_details, uniform weight", "s--"),
    "keep_alone": ("keep_details alone, z", "D"),
    "no_repeat": ("encoder_no_repeat_ngram_size", "^-."),
    "repetition": ("encoder_repetition_penalty", "d-."),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a C-DNPG checkpoint folder (model, tokenizer, generation_config.json)")
    parser.add_argument("--split", choices=("tune", "report"), default="report", help="which half of valid.jsonl")
    parser.add_argument("--train_file", default=str(QUORA / "train.jsonl"), help="word frequencies, calibration")
    parser.add_argument("--valid_file", default=str(QUORA / "valid.jsonl"), help="split in two halves")
    parser.add_argument("--max_pairs", type=int, default=None, help="decode only the first N pairs of the split")
    parser.add_argument("--candidate_pairs", type=int, default=200, help="pairs of the candidates comparison")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per generate() call")
    parser.add_argument("--chunk", type=int, default=256, help="pairs per round of the interleaved timing")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--output_dir", default="runs/novelty", help="results-<split>.json goes here")
    parser.add_argument("--plot", default=None, help="write the BLEU-4 / iBLEU / retention figure to this file")
    parser.add_argument("--quick", action="store_true", help="a few pairs and settings: the smoke test")
    parser.add_argument(
        "--settings",
        nargs="+",
        metavar="NAME",
        help='decode only these settings (as the table names them, e.g. "novelty 0.25" "novelty 0.5"); '
        "beam search, the reference of the timings, always",
    )
    parser.add_argument("--report_only", action="store_true", help="decode nothing: reprint results-<split>.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_pairs = args.max_pairs or 12
        args.candidate_pairs = min(args.candidate_pairs, 4)
        args.chunk = min(args.chunk, 6)
    for name in ("max_pairs", "candidate_pairs", "batch_size", "chunk", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be positive, got {getattr(args, name)}")
    return args


def settings(model, quick: bool) -> dict[str, tuple[str, float, dict]]:
    """name -> (family, the family's knob value, generate() keyword arguments)."""
    rows = {
        "beam search": ("beam", 0.0, {}),
        "novelty 0.001 (the copy rule alone)": ("copy_rule", 0.001, {"novelty": 0.001}),
    }
    novelties = (0.5,) if quick else NOVELTIES
    has_z = model.config.granularity_mask != "none"
    for value in novelties:
        if has_z:
            rows[f"novelty {value}"] = ("z", value, {"novelty": value})
        rows[f"novelty {value}, uniform"] = ("uniform", value, {"novelty": value, "novelty_z_layer": None})
    if has_z:
        mirrored = not model.generation_config.novelty_z_inverted
        for value in (0.5,) if quick else (0.25, 0.5):
            rows[f"novelty {value}, z mirrored"] = (
                "mirrored",
                value,
                {"novelty": value, "novelty_z_inverted": mirrored},
            )
    for value in (1.0,) if quick else KEEPS:
        kwargs = {"novelty": 0.5, "keep_details": value}
        rows[f"novelty 0.5, keep details {value}"] = ("keep" if has_z else "keep_uniform", value, kwargs)
        if has_z and value >= 0.5:
            uniform = {**kwargs, "novelty_z_layer": None}
            rows[f"novelty 0.5, keep details {value}, uniform"] = ("keep_uniform", value, uniform)
    rows["keep details 1.0"] = ("keep_alone", 1.0, {"keep_details": 1.0})
    for size in (3,) if quick else (2, 3, 4):
        rows[f"encoder_no_repeat_ngram_size={size}"] = ("no_repeat", size, {"encoder_no_repeat_ngram_size": size})
    for penalty in (0.7,) if quick else (0.9, 0.7, 0.5):
        rows[f"encoder_repetition_penalty={penalty}"] = (
            "repetition",
            penalty,
            {"encoder_repetition_penalty": penalty},
        )
    return rows


def chosen(rows: dict[str, tuple], names: list[str] | None) -> dict[str, tuple]:
    """The settings named by --settings (all when none is), beam search always: the other timings are read against
    it. A name that is not a setting of this model is refused with the list of those that are."""
    if not names:
        return rows
    unknown = [name for name in names if name not in rows]
    if unknown:
        raise SystemExit(f"--settings {', '.join(unknown)}: not a setting of this model; one of: {', '.join(rows)}")
    return {name: row for name, row in rows.items() if name == "beam search" or name in names}


# ---------------------------------------------------------------------------------------------------------------------
# Decoding and scoring
# ---------------------------------------------------------------------------------------------------------------------


def decode(paraphraser, sources: list[str], batch_size: int, n: int = 1, **kwargs) -> list[list[str]]:
    """Each source's candidates (best first) through the pipeline; none for an input it finds unreadable."""
    results = paraphraser(sources, batch_size=batch_size, num_return_sequences=n, **DECODING, **kwargs)
    return [[candidate["generated_text"] for candidate in candidates] for candidates in results]


def decode_interleaved(paraphraser, rows: dict, sources: list[str], args) -> tuple[dict[str, list[str]], dict]:
    """The first candidate of every source under every setting, and each setting's decoding time in seconds."""
    predictions = {name: [] for name in rows}
    seconds = dict.fromkeys(rows, 0.0)
    for start in range(0, len(sources), args.chunk):
        chunk = sources[start : start + args.chunk]
        for name, (_, _, kwargs) in rows.items():
            began = time.perf_counter()
            outputs = decode(paraphraser, chunk, args.batch_size, **kwargs)
            seconds[name] += time.perf_counter() - began
            predictions[name] += [candidates[0] if candidates else "" for candidates in outputs]
        print(f"decoded {start + len(chunk)} / {len(sources)} pairs with {len(rows)} settings", flush=True)
    return predictions, seconds


def source_details(model, tokenizer, sources: list[str], common: set[str]) -> list[dict[str, set[str]]]:
    """Per source, its distinct words that are numbers, rare, and details by z (calibrated layer, z >= 0.5)."""
    layer = model.generation_config.novelty_z_layer if model.config.granularity_mask != "none" else None
    details = []
    for source in sources:
        high_z = set()
        if layer is not None:
            row = word_granularities(model, tokenizer, source)[layer]
            inverted = model.generation_config.novelty_z_inverted
            high_z = {word.lower() for word, z in zip(row.words, row.z) if (1 - z if inverted else z) >= 0.5}
        details.append({**detail_words(source, common), "high_z": high_z})
    return details


def true_ibleu(prediction: str, reference: str, source: str) -> float:
    hypothesis = normalize(prediction)
    to_reference = bleu(hypothesis, normalize(reference), BLEU4_WEIGHTS)
    return 100 * (IBLEU_ALPHA * to_reference - (1 - IBLEU_ALPHA) * bleu(hypothesis, normalize(source), BLEU4_WEIGHTS))


def candidate_stats(candidates: list[list[str]], pairs) -> dict[str, float]:
    """How distinct, alike and copied the candidates are, and how good the first-ranked one is."""
    distinct, alike, copies, count, first, mean, best = [], [], 0, 0, [], [], []
    for texts, source, reference in zip(candidates, pairs["source"], pairs["target"]):
        tokens = [normalize(text) for text in texts]
        distinct.append(len({tuple(t) for t in tokens}))
        alike += [bleu(a, b, BLEU4_WEIGHTS) for a, b in combinations(tokens, 2)]
        copies += sum(t == normalize(source) for t in tokens)
        count += len(tokens)
        scores = [true_ibleu(text, reference, source) for text in texts]
        if scores:
            first.append(scores[0])
            mean.append(sum(scores) / len(scores))
            best.append(max(scores))
    average = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
    return {
        "distinct": average(distinct),
        "pairwise_bleu4": 100 * average(alike),
        "copies_percent": 100 * copies / max(count, 1),
        "ibleu_first": average(first),
        "ibleu_mean": average(mean),
        "ibleu_best": average(best),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    header = ["setting", "BLEU-4", "true iBLEU", "self-BLEU-4", "copies %", "numbers kept %", "rare words kept %"]
    header += ["high-z words kept %", "time × beam"]
    rows = []
    for name, row in [*results["settings"].items(), *results["anchors"].items()]:
        cells = [f"{row['metrics'][key]:.2f}" for key in METRIC_KEYS]
        cells[-1] = f"{row['metrics']['copy_rate']:.1f}"
        cells += [f"{row['retention'][key]:.1f}" for key in RETENTION_KEYS]
        cells.append(f"{row['time_ratio']:.2f}" if "time_ratio" in row else "–")
        rows.append([name, *cells])
    tables = [format_table(header, rows)]
    if results.get("candidates"):
        head = [
            "5 candidates from",
            "distinct",
            "pairwise BLEU-4",
            "copies %",
            "iBLEU 1st",
            "iBLEU mean",
            "iBLEU best",
        ]
        keys = ("distinct", "pairwise_bleu4", "copies_percent", "ibleu_first", "ibleu_mean", "ibleu_best")
        rows = [[name, *(f"{stats[key]:.2f}" for key in keys)] for name, stats in results["candidates"].items()]
        tables.append(format_table(head, rows))
    return "\n\n".join(tables)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    for family, (label, style) in FAMILIES.items():
        rows = [row for row in results["settings"].values() if row["family"] == family]
        if not rows:
            continue
        if family in ("keep", "keep_uniform"):  # a curve along keep_details, from novelty 0.5 alone when decoded
            start = [results["settings"]["novelty 0.5"]] if "novelty 0.5" in results["settings"] else []
            rows = [*start, *sorted(rows, key=lambda row: row["value"])]
        elif family != "beam":
            rows = [results["settings"]["beam search"], *sorted(rows, key=lambda row: -row["metrics"]["bleu4"])]
        x = [row["metrics"]["bleu4"] for row in rows]
        size, order = (14, 3) if family == "beam" else (7, 2)
        left.plot(x, [row["metrics"]["ibleu"] for row in rows], style, label=label, markersize=size, zorder=order)
        right.plot(x, [row["retention"]["rare"] for row in rows], style, label=label, markersize=size, zorder=order)
    copy, human = results["anchors"]["copy the source"], results["anchors"]["human reference"]
    left.plot(
        copy["metrics"]["bleu4"], copy["metrics"]["ibleu"], "X", color="grey", markersize=9, label="copy the source"
    )
    right.axhline(human["retention"]["rare"], color="grey", linestyle=":", label="human references")
    left.set(xlabel="BLEU-4 (reference)", ylabel="true iBLEU", title="Adequacy against novelty")
    right.set(xlabel="BLEU-4 (reference)", ylabel="rare source words kept (%)", title="Detail retention")
    for axes in (left, right):
        axes.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    right.legend(fontsize=8, loc="lower right")
    figure.suptitle(
        f"{results['config']['checkpoint']}: {results['config']['pairs']} Quora pairs ({results['config']['split']})"
    )
    figure.savefig(path, dpi=110)


def report(results: dict, plot_path: str | None) -> None:
    print(markdown(results))
    calibration = results["config"].get("calibration")
    if calibration:
        print(f"\nz: {calibration}")
    if plot_path:
        plot(results, plot_path)
        print(f"wrote {plot_path}")


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def load_split(args: argparse.Namespace):
    pairs = load_pair_files({"valid": args.valid_file})[0]["valid"]
    half = len(pairs) // 2
    pairs = pairs.select(range(half) if args.split == "tune" else range(half, len(pairs)))
    return pairs.select(range(min(args.max_pairs, len(pairs)))) if args.max_pairs else pairs


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out_dir = Path(args.output_dir)
    results_path = out_dir / f"results-{args.split}.json"
    if args.report_only:
        results = json.loads(results_path.read_text(encoding="utf-8"))
        report(results, args.plot)
        return results
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(args.checkpoint).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    train = load_pair_files({"train": args.train_file})[0]["train"]
    calibration = None
    if model.config.granularity_mask != "none":
        if not hasattr(model.generation_config, "novelty_z_layer"):  # in memory only: the checkpoint is left as it is
            calibration = calibrate_granularity(model, tokenizer, train["source"])
        else:
            calibration = {
                key: getattr(model.generation_config, key) for key in ("novelty_z_layer", "novelty_z_inverted")
            }
    common = common_words([*train["source"], *train["target"]])
    pairs = load_split(args)
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    metric = training.load_metric()
    rows = chosen(settings(model, args.quick), args.settings)

    predictions, seconds = decode_interleaved(paraphraser, rows, list(pairs["source"]), args)
    details = source_details(model, tokenizer, list(pairs["source"]), common)
    results = {
        "config": {
            "checkpoint": str(args.checkpoint),
            "split": args.split,
            "pairs": len(pairs),
            "decoding": DECODING,
            "calibration": calibration,
            "batch_size": args.batch_size,
        },
        "machine": machine_info(),
        "settings": {},
        "anchors": {},
    }
    for name, (family, value, kwargs) in rows.items():
        scores = training.score(metric, predictions[name], pairs)
        results["settings"][name] = {
            "family": family,
            "value": value,
            "kwargs": kwargs,
            "metrics": {key: scores[f"test_{key}"] for key in METRIC_KEYS},
            "retention": retention(details, predictions[name]),
            "time_s": round(seconds[name], 2),
            "time_ratio": seconds[name] / seconds["beam search"],
        }
    for name, texts in (("human reference", pairs["target"]), ("copy the source", pairs["source"])):
        scores = training.score(metric, texts, pairs)
        results["anchors"][name] = {
            "metrics": {key: scores[f"test_{key}"] for key in METRIC_KEYS},
            "retention": retention(details, texts),
        }
    few = pairs.select(range(min(args.candidate_pairs, len(pairs))))
    results["candidates"] = {
        "beam search (5 best beams)": candidate_stats(
            decode(paraphraser, list(few["source"]), args.batch_size, 5), few
        ),
    }
    if "novelty 0.5" in rows:
        results["candidates"]["novelty 0.5"] = candidate_stats(
            decode(paraphraser, list(few["source"]), args.batch_size, 5, novelty=0.5), few
        )
    write_json(results, results_path)
    samples = {name: predictions[name][:20] for name in rows}
    (out_dir / f"samples-{args.split}.json").write_text(
        json.dumps(
            {"source": list(pairs["source"][:20]), "reference": list(pairs["target"][:20]), **samples}, indent=1
        )
        + "\n",
        encoding="utf-8",
    )
    report(results, args.plot)
    return results


if __name__ == "__main__":
    main()
