#!/usr/bin/env python
"""The figure of a benchmarks/speed.py result file: time ratios with their targets, and the cache speed-up.

python benchmarks/speed_plot.py speed.json speed.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="speed.py's --out files (their ratios are merged)")
    parser.add_argument("figure", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    results = json.loads(args.results[0].read_text())
    for other in args.results[1:]:
        results["ratios"].update(json.loads(other.read_text())["ratios"])
    lengths = list(dict.fromkeys(key.split("/", 1)[0] for key in results["ratios"]))
    names = list(dict.fromkeys(key.split("/", 1)[1] for key in results["ratios"]))
    panels = [[n for n in names if "nocache" not in n], [n for n in names if "nocache" in n]]
    figure, axes = plt.subplots(
        1, 2, figsize=(14, 5.5), width_ratios=[len(panels[0]) + 1, len(panels[1]) + 2], layout="constrained"
    )
    width = 0.8 / len(lengths)
    for axis, panel in zip(axes, panels):
        for i, length in enumerate(lengths):
            ratios = [results["ratios"].get(f"{length}/{n}", {}) for n in panel]
            positions = [j + (i - (len(lengths) - 1) / 2) * width for j in range(len(panel))]
            bars = axis.bar(positions, [r.get("value", float("nan")) for r in ratios], width, label=f"L {length[1:]}")
            axis.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
        targets = {
            r["target"] for n in panel for key, r in results["ratios"].items() if key.endswith(n) and "target" in r
        }
        for j, target in enumerate(sorted(targets)):
            axis.axhline(float(target.split()[1]), color=f"C{3 + j}", ls="--", lw=1, label=f"target {target}")
        axis.axhline(1.0, color="black", lw=0.5)
        axis.set_xticks(range(len(panel)), panel, rotation=35, ha="right", fontsize=8)
        axis.set_ylim(0, axis.get_ylim()[1] * 1.3)
        axis.legend(fontsize=7, loc="upper center", ncol=3)
    axes[0].set_ylabel("time ratio (< 1: numerator faster)")
    axes[1].set_ylabel("use_cache=False time / cached time")
    machine = results["machine"]
    figure.suptitle(f"C-DNPG speed ratios: {machine['cuda'] or machine['cpu']}, torch {machine['torch']}")
    figure.savefig(args.figure, dpi=120)


if __name__ == "__main__":
    main()
