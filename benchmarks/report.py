#!/usr/bin/env python
"""The tables and figures of the benchmarks' runs: quality, novelty and speed, grouped over seeds (mean ± std).

    python benchmarks/report.py runs/quality/runs.jsonl runs/quality-seed1/runs.jsonl --plot docs/quality.png
    python benchmarks/report.py runs/novelty-s0/runs-report.jsonl runs/novelty-s1/runs-report.jsonl
    python benchmarks/report.py speed20.json speed256.json --plot docs/speed.png

Quality runs are grouped by model, novelty runs by setting (`common.group_runs`: runs of one group made another way
are refused); the ratios of speed results are merged, later ones winning.
"""

from __future__ import annotations

import argparse
import math
import statistics
import textwrap

from common import cell, format_table, group_runs, read_runs

PAPER_QUORA = {"none": (21.14, 26.88), "resonance": (26.94, 34.05)}  # Gu et al. 2022, Table 2: ("iBLEU", BLEU-4)
LABELS = {  # metric -> column heading, for every table
    "ibleu": "true iBLEU", "ibleu_paper": "iBLEU (paper's code)", "bleu2": "BLEU-2", "bleu4": "BLEU-4",
    "rougeL": "ROUGE-L", "meteor": "METEOR", "sacrebleu": "sacreBLEU", "self_bleu4": "self-BLEU-4",
    "copy_rate": "copies %", "numbers_kept": "numbers kept %", "rare_kept": "rare words kept %",
    "s_per_step": "s/step", "best_validation_loss": "valid. loss", "high_z_kept": "high-z words kept %",
    "time_ratio": "time × beam", "distinct": "distinct", "pairwise_bleu4": "pairwise BLEU-4",
    "copies_percent": "copies %", "ibleu_first": "iBLEU 1st", "ibleu_mean": "iBLEU mean", "ibleu_best": "iBLEU best",
}  # fmt: skip
QUALITY = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4", "copy_rate",
           "numbers_kept", "rare_kept", "s_per_step", "best_validation_loss")  # fmt: skip
EXTRA = ("ibleu", "bleu4", "self_bleu4", "copy_rate")  # the columns of the --extra_test tables
NOVELTY = ("bleu4", "ibleu", "self_bleu4", "copy_rate", "numbers_kept", "rare_kept", "high_z_kept", "time_ratio")
CANDIDATES = ("distinct", "pairwise_bleu4", "copies_percent", "ibleu_first", "ibleu_mean", "ibleu_best")
ANCHORS = ("human references", "copy-source")  # the rows that are not trained, last
ROW_NAMES = {
    "none": "Transformer (none)", "resonance": "C-DNPG resonance (R)", "scope": "C-DNPG scope (S)",
    "product": "C-DNPG product (R·S)", "mean": "C-DNPG mean ((R+S)/2)", "bart": "BART (transformers, same size)",
    "bert2bert": "bert2bert (transformers EncoderDecoderModel)", "copy-source": "copy the source",
    **{f"warm-{mask}": f"warm start, {mask}" for mask in ("none", "resonance", "scope", "product", "mean")},
}  # fmt: skip
FAMILIES = {  # novelty.py's families of settings: the label and style of their curves
    "beam": ("beam search", "k*"), "copy_rule": ("the copy rule alone (novelty 0.001)", "P"),
    "z": ("novelty, z (this work)", "o-"), "uniform": ("novelty, uniform weight", "s--"),
    "mirrored": ("novelty, z the wrong way round", "v:"), "keep": ("novelty 0.5 + keep_details, z (this work)", "o-"),
    "keep_uniform": ("novelty 0.5 + keep_details, uniform weight", "s--"), "keep_alone": ("keep_details alone, z", "D"),
    "no_repeat": ("encoder_no_repeat_ngram_size", "^-."), "repetition": ("encoder_repetition_penalty", "d-."),
}  # fmt: skip


def values(runs: list[dict], key: str) -> list[float]:
    """`key` of every run that has it, among its metrics or else at its top level (s_per_step, ...). NaN is a
    metric the run could not compute (high-z words of a model without z, numbers of sources without any): absent."""
    found = (run.get("metrics", {}).get(key, run.get(key)) for run in runs)
    return [value for value in found if value is not None and not math.isnan(value)]


def mean(runs: list[dict], key: str) -> float:
    return statistics.fmean(values(runs, key) or [float("nan")])


def rows(groups: dict[str, list[dict]], keys: tuple[str, ...]) -> list[list[str]]:
    """One table row per group: its name (ROW_NAMES'), then the mean ± std of each metric over its runs."""
    return [[ROW_NAMES.get(name, name), *(cell(values(group, key), 3 if "loss" in key else 2) for key in keys)]
            for name, group in groups.items()]  # fmt: skip


def figure(panels: int, width: float, height: float, **kwargs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, panels, figsize=(width * panels, height), layout="constrained", **kwargs)


def quality(runs: list[dict], plot_path: str | None) -> None:
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
    for name, group in groups.items():  # how far z moved from 0.5; the logged training loss by quarter of the steps
        spreads = [run["z_spread"] for run in group if run.get("z_spread")]
        parts = [f"{part} " + " ".join(f"{statistics.fmean(layer):.3f}" for layer in zip(*(s[part] for s in spreads)))
                 for part in (spreads[0] if spreads else {}) if spreads[0][part]]  # fmt: skip
        if parts:
            print(f"- {ROW_NAMES.get(name, name)}: std of z per layer, " + "; ".join(parts))
        logs = [(int(step), loss) for run in group for step, loss in (run.get("train_loss") or {}).items()]
        last = max((step for step, _ in logs), default=0)
        quarters = [[loss for step, loss in logs if q * last < 4 * step <= (q + 1) * last] for q in range(4)]
        if all(quarters):
            means = " / ".join(f"{statistics.fmean(quarter):.2f}" for quarter in quarters)
            print(f"- {ROW_NAMES.get(name, name)}: training loss by quarter of the {last} steps {means}")
    for test in dict.fromkeys(test for run in runs for test in run.get("extra", {})):
        scored = {name: [{"metrics": run["extra"][test]} for run in group] for name, group in groups.items()
                  if all(test in run.get("extra", {}) for run in group)}  # fmt: skip
        print(f"\n{test}:\n", format_table(["model", *map(LABELS.get, EXTRA)], rows(scored, EXTRA)), sep="\n")
    print('\nPaper: Gu et al. 2022, Table 2 (Quora), 100K training pairs, the paper-size model; its "iBLEU" is the '
          "released code's quantity (our ibleu_paper), and its test set differs from ours.")  # fmt: skip
    if not plot_path:
        return
    names = [name for name in groups if name != "human references"]
    panels = {"ibleu": "true iBLEU (α = 0.8, vs source)", "bleu4": "BLEU-4", "copy_rate": "exact copies (%)"}
    if all(values(groups[name], "rare_kept") for name in names):
        panels["rare_kept"] = "rare source words kept (%)"
    fig, axes = figure(len(panels), 5, 4.2)
    colors = ["C7" if n in ANCHORS else "C1" if n.startswith("warm-") else "C2" if n == "bert2bert" else "C0"
              for n in names]  # fmt: skip
    for axis, (key, panel) in zip(axes, panels.items()):
        stats = [(statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0) for v in
                 (values(groups[n], key) for n in names)]  # fmt: skip
        axis.bar(range(len(names)), [m for m, _ in stats], yerr=[s for _, s in stats], color=colors)
        axis.set_xticks(range(len(names)), [ROW_NAMES.get(n, n) for n in names], rotation=30, ha="right", fontsize=8)
        axis.set(title=panel)
        axis.grid(axis="y", alpha=0.3)
        if key == "rare_kept" and "human references" in groups:
            axis.axhline(mean(groups["human references"], key), color="grey", linestyle=":", label="human references")
            axis.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 200), fontsize=8)
    fig.savefig(plot_path, dpi=120)


def novelty(runs: list[dict], plot_path: str | None) -> None:
    groups = group_runs(runs, key="setting", replicate="model")
    candidates = {name: group for name, group in groups.items() if group[0]["family"] == "candidates"}
    settings = {name: group for name, group in groups.items() if name not in candidates}
    print(format_table(["setting", *map(LABELS.get, NOVELTY)], rows(settings, NOVELTY)))
    if candidates:
        header = ["5 candidates from", *map(LABELS.get, CANDIDATES)]
        print("", format_table(header, rows(candidates, CANDIDATES)), sep="\n")
    for model, calibration in {run["model"]: run.get("calibration") for run in runs}.items():
        if calibration:
            print(f"{model}: z {calibration}")
    if not plot_path:
        return
    point = {name: {"family": group[0]["family"], "value": group[0]["value"]} | {key: mean(group, key) for key in
             NOVELTY} for name, group in settings.items()}  # fmt: skip
    fig, (left, right) = figure(2, 6, 4.6)
    for family, (label, style) in FAMILIES.items():
        curve = [row for row in point.values() if row["family"] == family]
        if family in ("keep", "keep_uniform"):  # a curve along keep_details, from novelty 0.5 alone when decoded
            start = [point["novelty 0.5"]] if "novelty 0.5" in point else []
            curve = start + sorted(curve, key=lambda row: row["value"])
        elif family != "beam" and curve:  # a curve from beam search, along falling BLEU-4
            curve = [point["beam search"], *sorted(curve, key=lambda row: -row["bleu4"])]
        size, order = (14, 3) if family == "beam" else (7, 2)
        for axis, key in ((left, "ibleu"), (right, "rare_kept")) if curve else ():
            x, y = [row["bleu4"] for row in curve], [row[key] for row in curve]
            axis.plot(x, y, style, label=label, markersize=size, zorder=order)
    copy, human = point["copy the source"], point["human reference"]
    left.plot(copy["bleu4"], copy["ibleu"], "X", color="grey", markersize=9, label="copy the source")
    right.axhline(human["rare_kept"], color="grey", linestyle=":", label="human references")
    left.set(xlabel="BLEU-4 (reference)", ylabel="true iBLEU", title="Adequacy against novelty")
    right.set(xlabel="BLEU-4 (reference)", ylabel="rare source words kept (%)", title="Detail retention")
    for axis, where in ((left, "lower left"), (right, "lower right")):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc=where)
    models, first = ", ".join(dict.fromkeys(run["model"] for run in runs)), runs[0]["settings"]
    fig.suptitle(f"{models}: {first['pairs']} pairs ({first['split']})")
    fig.savefig(plot_path, dpi=110)


def speed(runs: list[dict], plot_path: str | None) -> None:
    ratios = {key: ratio for run in runs for key, ratio in run["ratios"].items()}  # a later run's ratio wins
    table = []
    for key, r in ratios.items():
        status = ("PASS" if r["passed"] else "MISS") if "target" in r else "info"
        memory = f"{r['memory']:.3f}" if "memory" in r else "–"
        quartiles = f"{r['quartiles'][0]:.3f}–{r['quartiles'][1]:.3f}"
        table.append([key, f"{r['value']:.3f}", r.get("target", "–"), status, quartiles, memory])
    print(format_table(["L/ratio", "value", "target", "status", "quartiles", "peak memory"], table))
    if not plot_path:
        return
    lengths = list(dict.fromkeys(key.split("/", 1)[0] for key in ratios))
    names = list(dict.fromkeys(key.split("/", 1)[1] for key in ratios))
    panels = [[n for n in names if "nocache" not in n], [n for n in names if "nocache" in n]]
    fig, axes = figure(2, 7, 5.5, width_ratios=[len(panels[0]) + 1, len(panels[1]) + 2])
    width = 0.8 / len(lengths)
    for axis, panel in zip(axes, panels):
        for i, length in enumerate(lengths):
            positions = [j + (i - (len(lengths) - 1) / 2) * width for j in range(len(panel))]
            heights = [ratios.get(f"{length}/{n}", {}).get("value", float("nan")) for n in panel]
            bars = axis.bar(positions, heights, width, label=f"L {length[1:]}")
            axis.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
        targets = {r["target"] for n in panel for key, r in ratios.items() if key.endswith(n) and "target" in r}
        for j, target in enumerate(sorted(targets)):
            axis.axhline(float(target.split()[1]), color=f"C{3 + j}", ls="--", lw=1, label=f"target {target}")
        axis.axhline(1.0, color="black", lw=0.5)
        axis.set_xticks(range(len(panel)), panel, rotation=35, ha="right", fontsize=8)
        axis.set_ylim(0, axis.get_ylim()[1] * 1.3)
        axis.legend(fontsize=7, loc="upper center", ncol=3)
    axes[0].set_ylabel("time ratio (< 1: numerator faster)")
    axes[1].set_ylabel("use_cache=False time / cached time")
    machine = runs[0]["machine"]
    fig.suptitle(f"C-DNPG speed ratios: {machine['cuda'] or machine['cpu']}, torch {machine['torch']}")
    fig.savefig(plot_path, dpi=120)


def show(runs: list[dict], plot_path: str | None = None) -> None:
    """The tables (and the figure) of every benchmark among the runs."""
    for name, draw in (("quality", quality), ("novelty", novelty), ("speed", speed)):
        mine = [run for run in runs if run.get("benchmark", "speed" if "ratios" in run else None) == name]
        if mine:
            draw(mine, plot_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="runs.jsonl files of quality.py and novelty.py, speed.py --out files")
    parser.add_argument("--plot", help="write the figure to this file (PNG)")
    args = parser.parse_args(argv)
    show(read_runs(args.runs), args.plot)


if __name__ == "__main__":
    main()
