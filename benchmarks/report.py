#!/usr/bin/env python
"""The tables of the benchmarks' runs, markdown for the docs: quality, novelty and speed, mean ± std over seeds.

    python benchmarks/report.py runs/quality/runs.jsonl runs/quality-seed1/runs.jsonl
    python benchmarks/report.py runs/novelty-s0/runs-report.jsonl runs/novelty-s1/runs-report.jsonl
    python benchmarks/report.py speed20.json speed256.json
    python benchmarks/report.py benchmarks/results/augment-cpu.json  # benchmarks/augment.py's comparisons
    python benchmarks/report.py  # every result kept in benchmarks/results/, the documentation's tables
    python benchmarks/report.py --figures docs/  # and the documentation's figures, drawn from them

Quality runs are grouped by model, novelty runs by setting (`common.group_runs`: runs of one group made another way
are refused); the ratios and kernel counts of speed results are merged, later ones winning. The figures: the
decoding settings' trade-off (a novelty table's rows) and the speed ratios against the length L.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from common import cell, format_table, group_runs, read_runs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def augment(runs: list[dict]) -> None:
    """benchmarks/augment.py's comparisons (a ratio of sentences per second, or of peak memory), its sentences per
    second and the compiled call's warm-up, of the parts the runs measured; a later run's figure wins."""
    comparisons = {key: value for run in runs for key, value in run["comparisons"].items()}
    table = [[key, f"{r['value']:.2f}", r.get("target", "–"), status(r)] for key, r in comparisons.items()]
    print(format_table(["augment: comparison", "ratio", "target", "status"], table))
    rates = {key: values for run in runs for key, values in run["sentences_per_second"].items()}
    if rates:
        table = [[key, f"{statistics.median(values):.1f}"] for key, values in rates.items()]
        print("", format_table(["augment: call", "sentences/s (median of rounds)"], table), sep="\n")
    compile_seconds = [run["compile_seconds"] for run in runs if "compile_seconds" in run]
    if compile_seconds:
        print(f"\ncompiled static cache: warm-up (compiling, and decoding the rows once) {compile_seconds[-1]:.1f} s")


TRADE_OFF = ("ibleu", "bleu4", "rare_kept")  # the novelty figure's panels: what a setting gains, keeps and costs
ANCHOR_STYLE = {"beam": ("black", "--"), "references": ("tab:green", ":")}  # horizontal lines across the settings


def novelty_figure(table: dict) -> Figure:
    """One panel per metric of TRADE_OFF: each decoding setting's mean ± std (a novelty table's rows), beam search and
    the human references as horizontal lines."""
    from matplotlib.figure import Figure  # the tables alone need no matplotlib

    settings = [row for row in table["rows"] if row["kind"] not in ANCHOR_STYLE]
    figure = Figure(figsize=(10, 4), layout="constrained")
    for axes, key in zip(figure.subplots(1, len(TRADE_OFF)), TRADE_OFF):
        shown = [row for row in settings if row[key]["mean"] is not None]
        axes.errorbar([row[key]["mean"] for row in shown], range(len(shown)), fmt="o", capsize=3,
                      xerr=[row[key]["std"] or 0 for row in shown], label="decoding setting")  # fmt: skip
        for row in table["rows"]:
            if row["kind"] in ANCHOR_STYLE and row[key]["mean"] is not None:
                color, style = ANCHOR_STYLE[row["kind"]]
                axes.axvline(row[key]["mean"], color=color, linestyle=style, label=row["setting"])
        axes.set_yticks(range(len(shown)), [row["setting"] for row in shown] if key == TRADE_OFF[0] else [])
        axes.invert_yaxis()
        axes.set_xlabel(table["metrics"][key])
        axes.grid(alpha=0.3)
    figure.legend(*axes.get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    figure.suptitle("Decoding settings on Quora: 2 warm-started models, 2,000 report pairs (mean ± std)", fontsize=10)
    return figure


def speed_figure(runs: list[dict]) -> Figure:
    """Each time ratio of the speed results against the length L, the quartiles of its rounds as error bars, one
    series per comparison, its target as a dashed line."""
    from matplotlib.figure import Figure

    ratios = {key: ratio for run in runs for key, ratio in run.get("ratios", {}).items()}
    series: dict[str, list[tuple[int, dict]]] = {}
    for key, ratio in ratios.items():
        length, comparison = key.split("/", 1)
        series.setdefault(comparison, []).append((int(length.removeprefix("L")), ratio))
    figure = Figure(figsize=(8, 3.6), layout="constrained")
    axes = figure.subplots()
    for comparison, points in series.items():
        points.sort(key=lambda point: point[0])
        values = [ratio["value"] for _, ratio in points]
        spread = [[value - ratio["quartiles"][0] for value, (_, ratio) in zip(values, points)],
                  [ratio["quartiles"][1] - value for value, (_, ratio) in zip(values, points)]]  # fmt: skip
        axes.errorbar([length for length, _ in points], values, yerr=spread, marker="o", capsize=3, label=comparison)
    for target in {ratio["target"] for ratio in ratios.values() if "target" in ratio}:
        axes.axhline(float(target.split()[-1]), color="gray", linestyle="--", linewidth=1, label=f"target {target}")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted({length for points in series.values() for length, _ in points}))
    axes.get_xaxis().set_major_formatter("{x:.0f}")
    axes.set_xlabel("source = target length L (tokens)")
    axes.set_ylabel("time ratio (median of rounds)")
    figure.legend(loc="outside right upper", fontsize=8)
    axes.grid(alpha=0.3)
    machine = next((run["machine"] for run in runs if run.get("ratios")), {})
    axes.set_title(f"Training step, paper-size model, {machine.get('device', 'CPU')} one thread", fontsize=10)
    return figure


def draw_figures(runs: list[dict], folder: Path) -> list[Path]:
    """novelty.png and speed.png in `folder`, from the runs that hold their data; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    figures = {"speed.png": speed_figure(runs)} if any(run.get("ratios") for run in runs) else {}
    for run in runs:
        if run.get("benchmark") == "novelty-table":
            figures["novelty.png"] = novelty_figure(run)
    for name, figure in figures.items():
        figure.savefig(folder / name, dpi=90)
    return [folder / name for name in figures]


def show(runs: list[dict]) -> None:
    """The tables of every benchmark among the runs."""
    for name, draw in (("quality", quality), ("novelty", novelty), ("speed", speed), ("augment", augment)):
        mine = [run for run in runs if run.get("benchmark", "speed" if "ratios" in run else None) == name]
        if mine:
            draw(mine)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="runs.jsonl of quality.py and novelty.py, speed.py --out files "
                        "(default: every file in benchmarks/results/)")  # fmt: skip
    parser.add_argument("--figures", type=Path, metavar="FOLDER", help="also draw the docs' figures there (docs/)")
    args = parser.parse_args(argv)
    runs = read_runs(args.runs or sorted(RESULTS.glob("*.json*")))
    show(runs)
    for path in draw_figures(runs, args.figures) if args.figures else []:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
