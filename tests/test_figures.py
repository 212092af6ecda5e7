"""The docs' figures: `benchmarks/report.py --figures` draws each from the results kept in benchmarks/results/, as
small PNGs whose plotted points are the results' values; the novelty results hold the numbers of docs/novelty.md's
table, and every figure the docs show is one that report.py draws."""

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import report
from common import read_runs

ROOT = Path(__file__).resolve().parents[1]
RUNS = read_runs(sorted(report.RESULTS.glob("*.json*")))
NOVELTY = next(run for run in RUNS if run.get("benchmark") == "novelty-table")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def drawn(line) -> list[tuple[float, float]]:
    return list(zip(np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)))


def test_one_command_draws_every_figure_from_the_kept_results_as_a_small_png(tmp_path):
    with contextlib.redirect_stdout(io.StringIO()):
        report.main(["--figures", str(tmp_path)])
    drawn_files = sorted(path.name for path in tmp_path.iterdir())
    assert drawn_files == ["novelty.png", "speed.png"]
    for name in drawn_files:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) < 150_000, name


SCREENSHOTS = {"demo.png"}  # the demo page as scripts/demo_screenshot.py takes it, not a figure of results


def test_the_docs_show_exactly_the_figures_report_draws_and_keep_them_small():
    shown = {
        name
        for page in (ROOT / "docs").glob("*.md")
        for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    }
    assert shown - SCREENSHOTS == {"novelty.png", "speed.png"}
    for name in shown:
        data = (ROOT / "docs" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) < 150_000, name


def test_the_novelty_figure_plots_each_settings_mean_and_marks_beam_search_and_the_references():
    figure = report.novelty_figure(NOVELTY)
    settings = [row for row in NOVELTY["rows"] if row["kind"] not in report.ANCHOR_STYLE]
    for axes, key in zip(figure.axes, report.TRADE_OFF):
        (points,) = axes.containers  # the settings' means with their error bars
        expected = [row[key]["mean"] for row in settings if row[key]["mean"] is not None]
        assert [x for x, _ in drawn(points.lines[0])] == pytest.approx(expected)
        anchors = [line for line in axes.get_lines() if not line.get_label().startswith("_")]  # vertical lines
        marked = {line.get_label(): line.get_xdata()[0] for line in anchors}
        rows = {row["setting"]: row[key]["mean"] for row in NOVELTY["rows"] if row["kind"] in report.ANCHOR_STYLE}
        assert marked == {name: value for name, value in rows.items() if value is not None}
    assert "beam search" in {line.get_label() for line in figure.axes[0].get_lines()}
    assert "human references" in {line.get_label() for line in figure.axes[2].get_lines()}


def test_the_speed_figure_has_one_series_per_comparison_at_the_measured_lengths_and_ratios():
    ratios = {key: ratio["value"] for run in RUNS for key, ratio in run.get("ratios", {}).items()}
    comparisons = {key.split("/", 1)[1] for key in ratios}
    axes = report.speed_figure(RUNS).axes[0]
    series = {container.get_label(): drawn(container.lines[0]) for container in axes.containers}
    assert set(series) == comparisons and len(comparisons) >= 3
    for comparison, points in series.items():
        expected = sorted((int(key.split("/")[0][1:]), value) for key, value in ratios.items()
                          if key.split("/", 1)[1] == comparison)  # fmt: skip
        assert np.allclose(points, expected)
    assert {length for points in series.values() for length, _ in points} >= {20, 64, 128}


def number(text: str) -> tuple[float | None, float | None]:
    """A table cell: "26.43 ± 0.33" -> (26.43, 0.33), "0" -> (0.0, None), "–" -> (None, None)."""
    values = [float(part.strip("*")) for part in text.split("±")] if text.strip("* ") != "–" else [None]
    return values[0], values[1] if len(values) > 1 else None


def test_the_novelty_results_hold_the_numbers_of_the_docs_table():
    page = (ROOT / "docs" / "novelty.md").read_text(encoding="utf-8").split("## Results", 1)[1]
    table = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| decoding")]
    assert len(table) == len(NOVELTY["rows"])
    columns = ("bleu4", "ibleu", "copy_rate", "numbers_kept", "rare_kept", "time_ratio")
    for line, row in zip(table, NOVELTY["rows"]):
        cells = [cell.strip() for cell in line.strip("|").split("|")][1:]
        assert [number(cell) for cell in cells] == [(row[key]["mean"], row[key]["std"]) for key in columns], line
    assert json.loads((report.RESULTS / "novelty-report.json").read_text())["transcribed"]
