#!/usr/bin/env python
"""The tables of the benchmarks' runs, markdown for the docs: quality, novelty and speed, mean ± std over seeds.

    python benchmarks/report.py runs/quality/runs.jsonl runs/quality-seed1/runs.jsonl
    python benchmarks/report.py runs/novelty-s0/runs-report.jsonl runs/novelty-s1/runs-report.jsonl
    python benchmarks/report.py speed20.json speed256.json
    python benchmarks/report.py  # every result kept in benchmarks/results/, the documentation's tables

Quality runs are grouped by model, novelty runs by setting (`common.group_runs`: runs of one group made another way
are refused); the ratios and kernel counts of speed results are merged, later ones winning.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from common import cell, format_table, group_runs, read_runs

RESULTS = Path(__file__).resolve().parent / "results"  # the runs the documentation's tables come from
PAPER_QUORA = {"none": (21.14, 26.88), "resonance": (26.94, 34.05)}  # Gu et al. 2022, Table 2: ("iBLEU", BLEU-4)
LABELS = {  # metric -> column heading, for every table
    "ibleu": "true iBLEU", "ibleu_paper": "iBLEU (paper's code)", "bleu2": "BLEU-2", "bleu4": "BLEU-4",
    "rougeL": "ROUGE-L", "meteor": "METEOR", "sacrebleu": "sacreBLEU", "self_bleu4": "self-BLEU-4",
    "copy_rate": "copies %", "numbers_kept": "numbers kept %", "rare_kept": "rare words kept %",
    "s_per_step": "s/step", "best_validation_loss": "valid. loss", "high_z_kept": "high-z words kept %",
    "time_ratio": "time × beam",
}  # fmt: skip
QUALITY = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4", "copy_rate",
           "numbers_kept", "rare_kept", "s_per_step", "best_validation_loss")  # fmt: skip
NOVELTY = ("bleu4", "ibleu", "self_bleu4", "copy_rate", "numbers_kept", "rare_kept", "high_z_kept", "time_ratio")
ANCHORS = ("human references", "copy-source")  # the rows that are not trained, last
ROW_NAMES = {
    "none": "Transformer (none)", "resonance": "C-DNPG resonance (R)", "scope": "C-DNPG scope (S)",
    "product": "C-DNPG product (R·S)", "mean": "C-DNPG mean ((R+S)/2)", "bart": "BART (transformers, same size)",
    "bert2bert": "bert2bert (transformers EncoderDecoderModel)", "copy-source": "copy the source",
    **{f"warm-{mask}": f"warm start, {mask}" for mask in ("none", "resonance", "scope", "product", "mean")},
}  # fmt: skip


def values(runs: list[dict], key: str) -> list[float]:
    """`key` of every run that has it, among its metrics or else at its top level (s_per_step, ...). NaN is a
    metric the run could not compute (high-z words of a model without z, numbers of sources without any): absent."""
    found = (run.get("metrics", {}).get(key, run.get(key)) for run in runs)
    return [value for value in found if value is not None and not math.isnan(value)]


def rows(groups: dict[str, list[dict]], keys: tuple[str, ...]) -> list[list[str]]:
    """One table row per group: its name (ROW_NAMES'), then the mean ± std of each metric over its runs."""
    return [[ROW_NAMES.get(name, name), *(cell(values(group, key), 3 if "loss" in key else 2) for key in keys)]
            for name, group in groups.items()]  # fmt: skip


def quality(runs: list[dict]) -> None:
    groups = group_runs(runs)
    groups = {name: groups[name] for name in sorted(groups, key=lambda name: name in ANCHORS)}
    trained = [group[0]["settings"] for name, group in groups.items() if name not in ANCHORS] or [runs[0]["settings"]]
    title = "; ".join(f"{key} {value}" for key, value in trained[0].items() if value not in (None, False))
    print(f"Quality: {title}\n")
    table = rows(groups, QUALITY)
    for row, (name, group) in zip(table, groups.items()):  # the seeds, and the paper's numbers
        row.append(",".join(str(run["seed"]) for run in group) if name not in ANCHORS else "–")
        row += [f"{number:.2f}" for number in PAPER_QUORA.get(name, ())] or ["–", "–"]
    print(format_table(["model", *map(LABELS.get, QUALITY), "seeds", 'paper "iBLEU"', "paper BLEU-4"], table))
    print('\nPaper: Gu et al. 2022, Table 2 (Quora), 100K training pairs, the paper-size model; its "iBLEU" is the '
          "released code's quantity (our ibleu_paper), and its test set differs from ours.")  # fmt: skip


def novelty(runs: list[dict]) -> None:
    groups = group_runs(runs, key="setting", replicate="model")
    print(format_table(["setting", *map(LABELS.get, NOVELTY)], rows(groups, NOVELTY)))
    for model, calibration in {run["model"]: run.get("calibration") for run in runs}.items():
        if calibration:
            print(f"{model}: z {calibration}")


def status(ratio: dict) -> str:
    return ("PASS" if ratio["passed"] else "MISS") if "target" in ratio else "info"


def speed(runs: list[dict]) -> None:
    """The time ratios, the kernels of every model and their ratios; a later run's figure wins."""
    ratios, kernels, kernel_ratios = ({k: v for run in runs for k, v in run.get(part, {}).items()}
                                      for part in ("ratios", "kernels", "kernel_ratios"))  # fmt: skip
    if ratios:
        table = [[key, f"{r['value']:.3f}", r.get("target", "–"), status(r), "–".join(f"{q:.3f}" for q in
                  r["quartiles"])] for key, r in ratios.items()]  # fmt: skip
        print(format_table(["L/part/ratio", "time", "target", "status", "quartiles"], table))
    if kernels:
        columns = ("forward", "backward", "total", "step", "generate_per_token")
        table = [[key, *(f"{c[k]:.0f}" if k in c else "–" for k in columns)] for key, c in kernels.items()]
        print("", format_table(["L/part/model (kernels)", *columns], table), sep="\n")
    if kernel_ratios:
        table = [[key, f"{r['value']:.3f}", r.get("target", "–"), status(r)] for key, r in kernel_ratios.items()]
        print("", format_table(["L/part/ratio", "kernels", "target", "status"], table), sep="\n")


def show(runs: list[dict]) -> None:
    """The tables of every benchmark among the runs."""
    for name, draw in (("quality", quality), ("novelty", novelty), ("speed", speed)):
        mine = [run for run in runs if run.get("benchmark", "speed" if "ratios" in run else None) == name]
        if mine:
            draw(mine)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="runs.jsonl of quality.py and novelty.py, speed.py --out files "
                        "(default: every file in benchmarks/results/)")  # fmt: skip
    args = parser.parse_args(argv)
    show(read_runs(args.runs or sorted(RESULTS.glob("*.json*"))))


if __name__ == "__main__":
    main()
