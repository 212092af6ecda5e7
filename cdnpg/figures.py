"""Drawing the granularity z of every layer (:func:`cdnpg.granularity.word_granularities`): the paper's Figure 2 as a
heat map (PNG/SVG/PDF through matplotlib), a self-contained HTML page or a terminal table.

The three use one colour scale, so that they read the same. The heat map is laid out by matplotlib's constrained
layout; this module only chooses the page size, so that each word gets a cell of the same size whatever the titles
and labels around it need.
"""

from __future__ import annotations

import functools
import html
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cdnpg.granularity import LayerRow

# ---------------------------------------------------------------------------------------------------------------------
# Colours: one scale shared by the PNG, the HTML page and the terminal, so the three read the same
# ---------------------------------------------------------------------------------------------------------------------

# z -> colour stops, linear in RGB between them: matplotlib's "coolwarm" end and mid points. Diverging on purpose,
# both ends mean something (blue: sentence-level template, red: phrase-level detail), 0.5 is neutral grey.
COLOR_STOPS = ((0.0, (59, 76, 192)), (0.5, (221, 221, 221)), (1.0, (180, 4, 38)))
SCALE_LABEL = "z: 0 = sentence-level template, 1 = phrase-level detail"
AGGREGATION_NOTE = "One cell per word: the largest z of its word pieces. [CLS] and [SEP] are omitted."


def z_to_rgb(z: float) -> tuple[int, int, int]:
    """The colour of z in [0, 1] (clamped), as 0-255 RGB."""
    z = min(1.0, max(0.0, float(z)))
    for (z0, c0), (z1, c1) in itertools.pairwise(COLOR_STOPS):
        if z <= z1:
            t = (z - z0) / (z1 - z0)
            return tuple(round(a + (b - a) * t) for a, b in zip(c0, c1))
    return COLOR_STOPS[-1][1]


def _text_rgb(background: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white text, whichever reads better on the background (relative luminance)."""
    r, g, b = background
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255)


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


# ---------------------------------------------------------------------------------------------------------------------
# Panels: consecutive rows over the same words, one heat map each (the encoder rows, then the decoder rows)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class _Panel:
    """Consecutive rows over the same words: one heat map (the encoder rows, then the decoder rows)."""

    description: str
    sentence: str
    words: list[str]
    rows: list[LayerRow]


def _panels(rows: Sequence[LayerRow]) -> list[_Panel]:
    if not rows:
        raise ValueError("no rows to render")
    panels: list[_Panel] = []
    for row in rows:
        last = panels[-1] if panels else None
        if last and (last.description, last.sentence, last.words) == (row.description, row.sentence, row.words):
            last.rows.append(row)
        else:
            panels.append(_Panel(row.description, row.sentence, row.words, [row]))
    return panels


def _title(rows: Sequence[LayerRow]) -> str:
    return f'Granularity z per layer: "{rows[0].sentence}"'


def _panel_title(panel: _Panel) -> str:
    title = panel.description[0].upper() + panel.description[1:]
    return title if panel.rows[0].stack == "encoder" else f'{title}: "{panel.sentence}"'


# ---------------------------------------------------------------------------------------------------------------------
# The heat map
# ---------------------------------------------------------------------------------------------------------------------

# In inches. The page is sized so that constrained layout gives every word a CELL_WIDTH x ROW_HEIGHT cell per layer,
# then rounded up to 1/4 inch, so that inches x DPI is an exact pixel count.
DPI = 100
CELL_WIDTH = 0.75  # one word: fits "0.53" at 8 pt and a word of ~9 characters at 10 pt; longer ones are rotated 45°
ROW_HEIGHT = 0.4  # one layer
COLORBAR_WIDTH, COLORBAR_HEIGHT = 4.5, 0.18  # at most as wide as the widest heat map
MIN_WIDTH = 6.5  # room for the colour bar's label and the caption even for a two-word sentence
PAD = 0.05  # around every element and the page, in inches
LABEL_POINTS, VALUE_POINTS, TITLE_POINTS, PANEL_TITLE_POINTS, NOTE_POINTS = 10, 8, 12, 10, 9
LABEL_MAX_CHARS = 20  # longer words are shortened with "…" in labels (URLs, long numbers)
LABEL_GAP = 0.1  # at least between two word labels, else they are rotated
TITLE_WORD_MAX_CHARS = 30  # titles wrap between words only: a longer word is shortened so that it fits a line


def _shorten(word: str, limit: int) -> str:
    return word if len(word) <= limit else word[: limit - 1] + "…"


@functools.cache
def _drawable() -> frozenset[int]:
    """The characters matplotlib's default font has glyphs for."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap())


def _mpl_text(text: str, word_limit: int = TITLE_WORD_MAX_CHARS) -> str:
    """Text for matplotlib: the characters its font cannot draw left out (a word of none of them is "?"), words
    shortened to `word_limit`, "$" escaped (so that "$5 or $6" is not mathematics)."""
    drawn = ["".join(c for c in word if ord(c) in _drawable()) or ("?" if word else "") for word in text.split(" ")]
    return " ".join(_shorten(word, word_limit) for word in drawn).replace("$", r"\$")


def _draw_panel(axes: Axes, panel: _Panel, cmap) -> None:
    """One row per layer, one column per word, each cell coloured and labelled by its z."""
    axes.imshow([row.z for row in panel.rows], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i, row in enumerate(panel.rows):
        for j, z in enumerate(row.z):
            color = _hex(_text_rgb(z_to_rgb(z)))
            axes.text(j, i, f"{z:.2f}", ha="center", va="center", fontsize=VALUE_POINTS, color=color)
    axes.set_xticks(range(len(panel.words)), [_mpl_text(w, LABEL_MAX_CHARS) for w in panel.words])
    axes.set_yticks(range(len(panel.rows)), [row.name for row in panel.rows])
    axes.tick_params(length=0, labelsize=LABEL_POINTS)
    axes.set_title(_mpl_text(_panel_title(panel)), fontsize=PANEL_TITLE_POINTS, loc="left", wrap=True)
    for spine in axes.spines.values():
        spine.set_visible(False)


def _rotate_crowded_labels(figure: Figure, heatmaps: list[Axes]) -> None:
    """Rotate a heat map's word labels 45° when one of them, as drawn, is wider than its cell less LABEL_GAP: side
    by side, a label must be read as its own column's."""
    figure.draw_without_rendering()
    for axes in heatmaps:
        labels = axes.get_xticklabels()
        left, right = axes.get_xlim()
        cell = axes.get_window_extent().width / (right - left)
        if max(label.get_window_extent().width for label in labels) > cell - LABEL_GAP * figure.dpi:
            for label in labels:
                label.set(rotation=45, ha="right", rotation_mode="anchor")


def _fit_page(figure: Figure, heatmaps: list[Axes], width: float | None = None, height: float | None = None) -> None:
    """Resize the page so that constrained layout gives the heat maps `width` (the widest) or `height` (in all)
    inches, whatever the titles and labels around them take. Measured on a draw: wrapped titles and rotated labels
    take what matplotlib gives them, and everything but the cells keeps its size, so one step is enough."""
    figure.draw_without_rendering()
    page_width, page_height = figure.get_size_inches()
    boxes = [axes.get_position() for axes in heatmaps]  # fractions of the page
    if width is not None:
        page_width = max(MIN_WIDTH, page_width + width - max(box.width for box in boxes) * page_width)
    if height is not None:
        page_height += height - sum(box.height for box in boxes) * page_height
    figure.set_size_inches(math.ceil(page_width * 4) / 4, math.ceil(page_height * 4) / 4)


def granularity_figure(rows: Sequence[LayerRow]) -> Figure:
    """The heat map as a matplotlib Figure (no pyplot, no global backend change): a heat map per panel, one row per
    layer and one cell per word, the sentence as title, and a colour bar that explains the scale.

    A grid row per panel, and one for the colour bar; every heat map spans the width of the longest, so that cells
    line up. Constrained layout places every text clear of the others and inside the page; the page is then sized
    so that a cell is CELL_WIDTH x ROW_HEIGHT (wider when MIN_WIDTH leaves room).
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.figure import Figure

    panels = _panels(rows)
    columns = max(len(panel.words) for panel in panels)
    cmap = LinearSegmentedColormap.from_list(
        "cdnpg_granularity", [(z, tuple(c / 255 for c in rgb)) for z, rgb in COLOR_STOPS]
    )
    heights = [len(panel.rows) * ROW_HEIGHT for panel in panels]
    # a first guess with room to spare for titles and rotated labels: _fit_page sizes the page
    guess = (max(MIN_WIDTH, columns * CELL_WIDTH + 2), sum(heights) + 2.5 * len(panels) + 2)
    figure = Figure(figsize=guess, dpi=DPI, layout="constrained")
    figure.get_layout_engine().set(w_pad=PAD, h_pad=PAD)
    grid = figure.add_gridspec(len(panels) + 1, columns, height_ratios=[*heights, COLORBAR_HEIGHT])
    heatmaps = [figure.add_subplot(grid[row, :]) for row in range(len(panels))]
    for axes, panel in zip(heatmaps, panels):
        _draw_panel(axes, panel, cmap)
        axes.set_xlim(-0.5, columns - 0.5)  # a shorter panel leaves the rest of its row empty
    bar_columns = max(1, min(columns, round(COLORBAR_WIDTH / CELL_WIDTH)))
    colorbar = figure.colorbar(
        ScalarMappable(Normalize(0.0, 1.0), cmap),
        cax=figure.add_subplot(grid[-1, :bar_columns]),
        orientation="horizontal",
    )
    colorbar.set_ticks([0, 0.25, 0.5, 0.75, 1])
    colorbar.ax.tick_params(labelsize=9)
    colorbar.set_label(SCALE_LABEL, fontsize=LABEL_POINTS)
    figure.suptitle(_mpl_text(_title(rows)), fontsize=TITLE_POINTS, wrap=True)
    figure.supxlabel(AGGREGATION_NOTE, fontsize=NOTE_POINTS, color="#444444")

    _fit_page(figure, heatmaps, width=columns * CELL_WIDTH)  # first: the width decides where titles wrap
    _rotate_crowded_labels(figure, heatmaps)
    _fit_page(figure, heatmaps, height=sum(heights))
    return figure


def figure_size(rows: Sequence[LayerRow]) -> tuple[float, float]:
    """Width and height in inches of the heat map of `rows`: a cell per word (the panel with the most words decides)
    and per layer, plus what the titles, the word labels (taller when rotated), the colour bar and the caption need;
    at least MIN_WIDTH wide. The PNG is (width × DPI, height × DPI) pixels."""
    width, height = granularity_figure(rows).get_size_inches()
    return float(width), float(height)


def png_size(rows: Sequence[LayerRow]) -> tuple[int, int]:
    """Pixel width and height of the PNG `render_png` writes for `rows`."""
    width, height = figure_size(rows)
    return round(width * DPI), round(height * DPI)


def render_png(rows: Sequence[LayerRow], path: str | os.PathLike[str]) -> Path:
    """Write the heat map to `path`; the format follows the suffix (.png, also .svg or .pdf)."""
    path = Path(path)
    granularity_figure(rows).savefig(path, dpi=DPI)
    return path


_HTML_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.2em; font-weight: 600; overflow-wrap: anywhere; }
h2 { font-size: 1em; font-weight: 600; margin-top: 1.6em; overflow-wrap: anywhere; }
table { border-collapse: separate; border-spacing: 3px; }
th { text-align: right; font-weight: normal; color: #555; padding-right: 0.8em; white-space: nowrap; }
td { padding: 0; }
td .cdnpg-word { display: block; margin: 0; text-align: center; }
.cdnpg-legend { margin-top: 2em; }
.note { color: #555; font-size: 0.9em; }
"""


WORD_STYLE = ("padding:0.25em 0.5em;margin:0.15em;border-radius:4px;display:inline-block;white-space:nowrap;"
              'font-family:ui-monospace,"SFMono-Regular",Menlo,monospace;cursor:default')  # fmt: skip
SCALE_ENDS = ("0 = sentence-level template", "1 = phrase-level detail")


def word_span(word: str, value: float, tooltip: str) -> str:
    """One word as an HTML span on the colour of `value` (`z_to_rgb`), styled inline (it needs no style sheet), the
    value in `data-z` and `tooltip` on hover."""
    background = z_to_rgb(value)
    style = f"background:{_hex(background)};color:{_hex(_text_rgb(background))};{WORD_STYLE}"
    return (
        f'<span class="cdnpg-word" data-z="{value:.4f}" style="{style}" title="{html.escape(tooltip)}">'
        f"{html.escape(word)}</span>"
    )


def legend_html(ends: tuple[str, str] = SCALE_ENDS) -> str:
    """The colour scale from 0 to 1 as an HTML bar between its two `ends`, styled inline."""
    gradient = ", ".join(f"{_hex(rgb)} {round(z * 100)}%" for z, rgb in COLOR_STOPS)
    return (
        '<div class="cdnpg-legend" style="display:flex;align-items:center;gap:0.8em;font-size:0.9em;margin-top:0.5em">'
        f'<span>{html.escape(ends[0])}</span><span style="width:18em;height:1em;border-radius:3px;'
        f'background:linear-gradient(to right, {gradient})"></span><span>{html.escape(ends[1])}</span></div>'
    )


def words_html(
    words: Sequence[str], values: Sequence[float], caption: str, ends: tuple[str, str] = SCALE_ENDS, name: str = "z"
) -> str:
    """A fragment for a page: `caption`, then the words in a row, each on the colour of its value (`word_span`,
    "`name` = value" on hover), then the legend of the scale (`legend_html`)."""
    spans = "".join(word_span(word, value, f"{name} = {value:.2f}") for word, value in zip(words, values))
    return (
        f'<div class="cdnpg-words"><p style="font-size:0.85em;margin:0 0 0.3em 0">{html.escape(caption)}</p>'
        f"<div>{spans}</div>{legend_html(ends)}</div>"
    )


def render_html(rows: Sequence[LayerRow], path: str | os.PathLike[str] | None = None) -> str:
    """A self-contained HTML page (inline CSS, no external assets): per layer a row of words coloured by z
    (`word_span`), z in each word's tooltip, and a legend (`legend_html`). Written to `path` when given; returned
    either way."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8">',
        f"<title>{esc(_title(rows))}</title>",
        f"<style>{_HTML_STYLE}</style></head>",
        "<body>",
        f"<h1>{esc(_title(rows))}</h1>",
    ]
    for panel in _panels(rows):
        parts.append(f"<h2>{esc(_panel_title(panel))}</h2>")
        parts.append("<table>")
        for row in panel.rows:
            cells = "".join(
                f"<td>{word_span(word, z, f'{word}: z = {z:.2f} ({row.name})')}</td>"
                for word, z in zip(row.words, row.z)
            )
            parts.append(f"<tr><th>{esc(row.name)}</th>{cells}</tr>")
        parts.append("</table>")
    parts += [
        legend_html(),
        f'<p class="note">z (eq. 4 of Gu et al., 2022) of each layer\'s granularity head. {esc(AGGREGATION_NOTE)} '
        "Hover a word for its value.</p>",
        "</body>",
        "</html>",
    ]
    page = "\n".join(parts) + "\n"
    if path is not None:
        Path(path).write_text(page, encoding="utf-8")
    return page


def render_text(rows: Sequence[LayerRow], color: bool = False) -> str:
    """A terminal table per panel: one line per word, one column per layer, z to 2 decimals; with `color`, each
    value on its colour (24-bit ANSI background)."""
    lines = [_title(rows), ""]
    for panel in _panels(rows):
        lines.append(_panel_title(panel))
        labels = [_shorten(w, LABEL_MAX_CHARS) for w in panel.words]
        word_width = max(4, *(len(w) for w in labels))
        columns = [max(6, len(row.name)) for row in panel.rows]
        header = "word".ljust(word_width) + "".join(f"  {row.name:>{w}}" for row, w in zip(panel.rows, columns))
        lines += [header, "-" * len(header)]
        for j, word in enumerate(labels):
            cells = []
            for row, w in zip(panel.rows, columns):
                cell = f"{row.z[j]:.2f}".rjust(w)
                if color:
                    background = z_to_rgb(row.z[j])
                    cell = f"{_ansi(48, background)}{_ansi(38, _text_rgb(background))}{cell}\x1b[0m"
                cells.append("  " + cell)
            lines.append(word.ljust(word_width) + "".join(cells))
        lines.append("")
    lines += [SCALE_LABEL + ".", AGGREGATION_NOTE]
    return "\n".join(lines) + "\n"


HTML_SUFFIXES = (".html", ".htm")  # `render` writes a page (`render_html`); else a matplotlib figure
FIGURE_SUFFIXES = (".png", ".svg", ".pdf", *HTML_SUFFIXES)  # what `render` writes


def _ansi(code: int, rgb: tuple[int, int, int]) -> str:
    """24-bit ANSI colour: code 48 background, 38 foreground."""
    return f"\x1b[{code};2;{rgb[0]};{rgb[1]};{rgb[2]}m"


def render(rows: Sequence[LayerRow], path: str | os.PathLike[str]) -> Path:
    """Write `rows` to `path` as HTML (.html, .htm) or a matplotlib figure (.png, .svg, .pdf)."""
    path = Path(path)
    if path.suffix.lower() in HTML_SUFFIXES:
        render_html(rows, path)
        return path
    return render_png(rows, path)
