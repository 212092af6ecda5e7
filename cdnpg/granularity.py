"""The paper's Figure 2 for any sentence: the granularity z (eq. 4) of every layer, per word.

z = sigmoid(W_G h) is what each GA-attention module computes for each token: z ≈ 1 phrase-level detail, z ≈ 0
sentence-level template. This module runs a C-DNPG model on one sentence, reads z from every encoder self-attention
(and, optionally, every decoder self-attention over the model's own paraphrase), aggregates word pieces into words
and renders the result as a heat map (PNG/SVG/PDF through matplotlib), a self-contained HTML page or a terminal
table.

Aggregation rule: a word's z is the mean of the z of its word pieces (words as the fast tokenizer's `word_ids()`
defines them); special tokens ([CLS], [SEP], ...) are omitted.

It also holds the inference helpers the `cdnpg` command line shares with it: the input-length limit and the
truncation warning, and the generation length defaults.

    from cdnpg.granularity import word_granularities, render_png, render_html, render_text

    rows = word_granularities(model, tokenizer, "how do i learn python ?", decoder=True)
    render_png(rows, "figure.png")
    print(render_text(rows))
"""

from __future__ import annotations

import functools
import html
import itertools
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure
    from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------------------
# Colours: one scale shared by the PNG, the HTML page and the terminal, so the three read the same
# ---------------------------------------------------------------------------------------------------------------------

# z -> colour stops, linear in RGB between them: matplotlib's "coolwarm" end and mid points. Diverging on purpose,
# both ends mean something (blue: sentence-level template, red: phrase-level detail), 0.5 is neutral grey.
COLOR_STOPS = ((0.0, (59, 76, 192)), (0.5, (221, 221, 221)), (1.0, (180, 4, 38)))
SCALE_LABEL = "z: 0 = sentence-level template, 1 = phrase-level detail"
AGGREGATION_NOTE = "One cell per word: the mean z of its word pieces. [CLS] and [SEP] are omitted."


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
# Inference helpers shared with the command line
# ---------------------------------------------------------------------------------------------------------------------

_NO_LIMIT = 10**6  # transformers' "no limit" model_max_length is 1e30; anything this large is no real limit


def input_limit(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, str]:
    """The most input tokens (specials included) the model can take, and where that limit comes from.

    The learned position table (`max_position_embeddings`) is the hard limit; a tokenizer that declares a smaller
    `model_max_length` lowers it. The paper's 20-token truncation is a preprocessing choice, deliberately not applied.
    """
    limit, reason = None, ""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:
        limit, reason = int(positions), f"the model's max_position_embeddings={positions}"
    tokenizer_max = getattr(tokenizer, "model_max_length", None)
    if tokenizer_max and tokenizer_max < _NO_LIMIT and (limit is None or tokenizer_max < limit):
        limit, reason = int(tokenizer_max), f"the tokenizer's model_max_length={tokenizer_max}"
    if limit is None:
        limit, reason = _NO_LIMIT, "no limit declared"
    return limit, reason


def encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limit: int,
    reason: str,
    numbers: Sequence[int] | None = None,
) -> BatchEncoding:
    """Tokenize a batch, truncating only what the model cannot take, with one warning per truncated input.

    `numbers` names the inputs in the warnings (default 1, 2, ...), e.g. their line numbers in the input file.
    """
    numbers = list(numbers) if numbers is not None else list(range(1, len(texts) + 1))
    # verbose=False: this warning replaces transformers' own "sequence length is longer than" one
    for number, ids in zip(numbers, tokenizer(list(texts), verbose=False)["input_ids"]):
        if len(ids) > limit:
            logger.warning(
                "input %d has %d tokens, more than the model takes: truncated to its first %d tokens (%s)",
                number,
                len(ids),
                limit,
                reason,
            )
    return tokenizer(
        list(texts),
        truncation=True,
        max_length=limit,
        padding=True,
        return_tensors="pt",
        return_token_type_ids=False,  # BERT tokenizers add them; the model (and generate) takes none
    )


def generation_kwargs(
    model: PreTrainedModel,
    input_tokens: int,
    num_beams: int | None = None,
    num_return_sequences: int = 1,
    max_new_tokens: int | None = None,
) -> dict[str, int | None]:
    """Keyword arguments for `model.generate`: the model's generation_config unless overridden, within what fits.

    `input_tokens`: the longest input of the batch in tokens, special tokens excluded.
    Length: `max_new_tokens` if given. Otherwise the generation_config's length (`max_new_tokens`, or `max_length`;
    20 new tokens for C-DNPG, the paper's setting), raised to `input_tokens` for a longer input so that its paraphrase
    is not cut at the paper's 20 tokens; 2 × `input_tokens` + 10 when the config sets no length. Never more than the
    decoder's position table holds (`max_position_embeddings` - 1: the start token takes one position).
    Beams: `num_beams` if given, else the generation_config's (1 if unset), raised to `num_return_sequences` when
    that is larger (beam search returns at most one sequence per beam).
    """
    config = model.generation_config
    positions = getattr(model.config, "max_position_embeddings", None)
    cap = int(positions) - 1 if positions else _NO_LIMIT
    if max_new_tokens is not None:
        if max_new_tokens > cap:
            logger.warning(
                "max_new_tokens=%d is more than the decoder can take: using %d (max_position_embeddings=%s)",
                max_new_tokens,
                cap,
                positions,
            )
        length = max_new_tokens
    elif config.max_new_tokens is not None:
        length = max(config.max_new_tokens, input_tokens)
    elif config.max_length is not None:  # encoder-decoder: max_length counts the start token
        length = max(config.max_length - 1, input_tokens)
    else:
        length = 2 * input_tokens + 10
    length = max(1, min(length, cap))
    beams = num_beams if num_beams is not None else (config.num_beams or 1)
    if num_return_sequences > beams and not config.do_sample:
        if num_beams is not None:
            raise ValueError(f"num_return_sequences={num_return_sequences} cannot exceed num_beams={num_beams}")
        logger.info("using %d beams to return %d sequences", num_return_sequences, num_return_sequences)
        beams = num_return_sequences
    # max_length=None: max_new_tokens alone decides, without transformers' "both were set" warning
    return {
        "num_beams": beams,
        "num_return_sequences": num_return_sequences,
        "max_new_tokens": length,
        "max_length": None,
    }


def content_tokens(tokenizer: PreTrainedTokenizerBase, batch: BatchEncoding) -> int:
    """The longest input of an encoded batch in tokens, not counting the special tokens the tokenizer adds."""
    return max(0, int(batch["attention_mask"].sum(-1).max()) - tokenizer.num_special_tokens_to_add())


def decoding_name(model: PreTrainedModel, num_beams: int) -> str:
    """How the paraphrase was decoded, in words, for the figure's decoder rows."""
    if model.generation_config.do_sample:
        return "sampling"
    return "greedy decoding" if num_beams == 1 else f"beam search, {num_beams} beams"


# ---------------------------------------------------------------------------------------------------------------------
# z per word
# ---------------------------------------------------------------------------------------------------------------------


class GranularityUnavailableError(ValueError):
    """The model computes no z: the `granularity_mask="none"` baseline, or not a C-DNPG model at all."""


@dataclass
class LayerRow:
    """z of one layer's granularity head (eq. 4), one value per word of `sentence`.

    name: "encoder 1", "decoder 2", ... (1-based). stack: "encoder" or "decoder". sentence: the text the words come
    from (the input for encoder rows, the model's paraphrase for decoder rows). description: what the row shows,
    e.g. "decoder self-attention over the model's paraphrase (beam search, 8 beams)".
    """

    name: str
    stack: str
    words: list[str]
    z: list[float]
    sentence: str
    description: str


def _group_by_word(word_ids: Sequence[int | None]) -> list[list[int]]:
    """Token positions of each word, in order; positions with no word (special tokens) are left out."""
    groups: dict[int, list[int]] = {}
    for position, word in enumerate(word_ids):
        if word is not None:
            groups.setdefault(word, []).append(position)
    return list(groups.values())


def _span_text(text: str, offsets: Sequence[tuple[int, int]], positions: list[int]) -> str:
    return text[min(offsets[p][0] for p in positions) : max(offsets[p][1] for p in positions)]


def _decoder_words(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> tuple[str, list[str], list[list[int]]]:
    """The paraphrase's text, its words and each word's positions in `ids` (special tokens omitted).

    Words come from re-tokenizing the decoded text when that reproduces the generated pieces exactly; otherwise
    (e.g. a sequence that starts with a "##" continuation) pieces are joined by the WordPiece continuation prefix.
    """
    special = set(tokenizer.all_special_ids)
    kept = [p for p, token in enumerate(ids) if token not in special]
    pieces = [ids[p] for p in kept]
    text = tokenizer.decode(pieces, skip_special_tokens=True)
    again = tokenizer(text, add_special_tokens=False)
    if again["input_ids"] == pieces and again.encodings is not None:
        piece_groups = _group_by_word(again.word_ids())  # indices into `pieces`
        words = [_span_text(text, again.encodings[0].offsets, group) for group in piece_groups]
        return text, words, [[kept[i] for i in group] for group in piece_groups]
    prefix = getattr(getattr(tokenizer.backend_tokenizer, "model", None), "continuing_subword_prefix", None) or "##"
    words, groups = [], []
    for position, token in zip(kept, tokenizer.convert_ids_to_tokens(pieces)):
        if token.startswith(prefix) and words:
            words[-1] += token[len(prefix) :]
            groups[-1].append(position)
        else:
            words.append(token)
            groups.append([position])
    return text, words, groups


def _check_model(model: PreTrainedModel) -> None:
    if getattr(model.config, "granularity_mask", None) == "none":
        raise GranularityUnavailableError(
            "this model was trained with granularity_mask='none' (the plain Transformer baseline): it has no "
            "granularity heads, so there is no z to show"
        )
    if getattr(model.config, "model_type", None) != "cdnpg":
        raise GranularityUnavailableError(
            f"z exists only in C-DNPG models; this is a {getattr(model.config, 'model_type', '?')!r} model"
        )


def _mean_rows(
    granularities: Sequence[torch.Tensor],
    groups: list[list[int]],
    words: list[str],
    stack: str,
    sentence: str,
    description: str,
) -> list[LayerRow]:
    rows = []
    for layer, z in enumerate(granularities, start=1):
        values = z[0].float().cpu()
        means = [float(values[group].mean()) for group in groups]
        rows.append(LayerRow(f"{stack} {layer}", stack, list(words), means, sentence, description))
    return rows


@torch.inference_mode()
def word_granularities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    decoder: bool = False,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
) -> list[LayerRow]:
    """z per word of every encoder layer for `text`; with `decoder`, then z of every decoder self-attention.

    Decoder rows teacher-force the model's own paraphrase of `text`, decoded with its generation_config
    (`num_beams`, `max_new_tokens` override it): z of decoder position t belongs to the paraphrase token fed at t.
    Needs a fast tokenizer (`word_ids()`); an over-long `text` is truncated to what the model takes, with a warning.
    """
    _check_model(model)
    if not tokenizer.is_fast:
        raise TypeError("word_granularities needs a fast tokenizer: words come from its word_ids()")
    text = text.strip()
    if not text:
        raise ValueError("the sentence is empty: there are no words to show")
    limit, reason = input_limit(model, tokenizer)
    batch = encode(tokenizer, [text], limit, reason)
    groups = _group_by_word(batch.word_ids(0))
    if not groups:
        raise ValueError(f"the sentence {text!r} has no words once special tokens are left out")
    offsets = batch.encodings[0].offsets
    words = [_span_text(text, offsets, group) for group in groups]
    batch = batch.to(model.device)

    encoder_out = model.get_encoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_granularities=True
    )
    if encoder_out.granularities is None:
        raise GranularityUnavailableError("the model returned no encoder granularities (no granularity heads)")
    rows = _mean_rows(
        encoder_out.granularities, groups, words, "encoder", text, "encoder self-attention over the input"
    )
    if not decoder:
        return rows

    settings = generation_kwargs(
        model, content_tokens(tokenizer, batch), num_beams=num_beams, max_new_tokens=max_new_tokens
    )
    sequence = model.generate(**batch, **settings)[0].tolist()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    end = next((i for i, token in enumerate(sequence) if i > 0 and token in eos_ids), len(sequence) - 1)
    sequence = sequence[: end + 1]  # the start token, the paraphrase, its EOS; beam padding after EOS dropped
    paraphrase, dec_words, dec_groups = _decoder_words(tokenizer, sequence)
    if not dec_groups:
        logger.warning("the model's paraphrase of %r is empty: no decoder rows to show", text)
        return rows
    output = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=torch.tensor([sequence], device=model.device),
        output_granularities=True,
        use_cache=False,
    )
    description = f"decoder self-attention over the model's paraphrase ({decoding_name(model, settings['num_beams'])})"
    return rows + _mean_rows(output.decoder_granularities, dec_groups, dec_words, "decoder", paraphrase, description)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering
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


# Figure geometry, in inches. The figure's width and height are rounded up to 1/4 inch, so that inches × DPI is an
# exact pixel count. Text is measured with matplotlib's own renderer, so that labels never collide or leave the page.
DPI = 100
CELL_WIDTH = 0.75  # one word: fits "0.53" at 8 pt and a word of ~9 characters at 10 pt; longer ones are rotated 45°
ROW_HEIGHT = 0.4  # one layer
LABEL_POINTS, VALUE_POINTS, TITLE_POINTS, PANEL_TITLE_POINTS, NOTE_POINTS = 10, 8, 12, 10, 9
LABEL_MAX_CHARS = 20  # longer words are shortened with "…" in the figure (URLs, long numbers)
MARGIN = 0.2  # around the page
MIN_WIDTH = 6.5  # room for the colour bar and its label even for a two-word sentence
COLORBAR_WIDTH = 4.5  # at most; fixed rather than the heat map's, which grows with the words
TICK_PAD = 4 / 72  # matplotlib's tick label pad, 4 pt
PANEL_GAP = 0.3  # above each panel title
LINE_SPACING = 1.35  # height of a text line, in multiples of its font size
COLORBAR_GAP, COLORBAR_HEIGHT, COLORBAR_LABELS = 0.3, 0.18, 0.6  # the bar, then its tick labels and its label
COS45 = math.cos(math.radians(45))


def _label(word: str) -> str:
    return word if len(word) <= LABEL_MAX_CHARS else word[: LABEL_MAX_CHARS - 1] + "…"


def _mpl_text(text: str) -> str:
    """Text for matplotlib: "$" escaped, so that "$5 or $6" is not typeset as mathematics."""
    return text.replace("$", r"\$")


@functools.lru_cache(maxsize=4096)
def _text_width(text: str, points: float) -> float:
    """Width in inches of one line of DejaVu Sans (matplotlib's default font) at `points`, as Agg draws it."""
    from matplotlib.font_manager import FontProperties

    width, _, _ = _measuring_renderer().get_text_width_height_descent(text, FontProperties(size=points), ismath=False)
    return width / DPI


@functools.lru_cache(maxsize=1)
def _measuring_renderer() -> RendererAgg:
    from matplotlib.backends.backend_agg import RendererAgg

    return RendererAgg(1, 1, DPI)


def _line_height(points: float) -> float:
    return points * LINE_SPACING / 72


def _wrap(text: str, width_in: float, points: float) -> list[str]:
    """Greedy word wrap to `width_in` inches of measured text; a word wider than a line is broken across lines."""
    lines: list[str] = []
    for word in text.split():
        if lines and _text_width(f"{lines[-1]} {word}", points) <= width_in:
            lines[-1] = f"{lines[-1]} {word}"
            continue
        lines.append("")
        for char in word:  # a new line for the word, broken where it overflows (URLs, degenerate paraphrases)
            if lines[-1] and _text_width(lines[-1] + char, points) > width_in:
                lines.append("")
            lines[-1] += char
    return lines or [""]


@dataclass
class _Box:
    """One element's place in the figure, in inches from the figure's top-left corner."""

    left: float
    top: float
    width: float
    height: float


@dataclass
class _Layout:
    width: float
    height: float
    title: list[str]
    panel_titles: list[list[str]]
    panel_boxes: list[_Box]  # the heat maps
    rotated: list[bool]
    colorbar: _Box
    caption_top: float


def _rotated(words: Sequence[str]) -> bool:
    """A panel's word labels are rotated 45° when one of them is wider than its cell."""
    return max(_text_width(_label(w), LABEL_POINTS) for w in words) > CELL_WIDTH - 0.1


def _layout(rows: Sequence[LayerRow]) -> _Layout:
    """Top to bottom: title; per panel its title, the heat map (one row per layer, one fixed-width cell per word, so
    cells are equally wide in every panel) and its word labels; the colour bar with its label; the caption.

    The left margin fits the layer names and the overhang of the first rotated labels; the width fits the widest
    panel, the colour bar's label and the caption; the height follows from the stack.
    """
    panels = _panels(rows)
    rotated = [_rotated(p.words) for p in panels]
    left = MARGIN + max(_text_width(r.name, LABEL_POINTS) for r in rows) + TICK_PAD + 0.05
    for panel, rotate in zip(panels, rotated):
        for j, word in enumerate(panel.words if rotate else ()):  # a rotated label reaches left of its cell
            left = max(left, MARGIN + _text_width(_label(word), LABEL_POINTS) * COS45 - (j + 0.5) * CELL_WIDTH)
    left = math.ceil(left * 20) / 20
    note = max(_text_width(SCALE_LABEL, LABEL_POINTS), _text_width(AGGREGATION_NOTE, NOTE_POINTS))
    content = max(CELL_WIDTH * max(len(p.words) for p in panels), note)
    width = math.ceil(max(MIN_WIDTH, left + content + MARGIN + 0.1) * 4) / 4
    panel_text_width = width - left - MARGIN

    title = _wrap(_title(rows), width - 2 * MARGIN, TITLE_POINTS)
    y = MARGIN + _line_height(TITLE_POINTS) * len(title)
    panel_titles, boxes = [], []
    for panel, rotate in zip(panels, rotated):
        lines = _wrap(_panel_title(panel), panel_text_width, PANEL_TITLE_POINTS)
        y += PANEL_GAP + _line_height(PANEL_TITLE_POINTS) * len(lines)
        box = _Box(left, y, CELL_WIDTH * len(panel.words), ROW_HEIGHT * len(panel.rows))
        label_height = _line_height(LABEL_POINTS)
        if rotate:  # the rotated text box: its width and height, each projected on the vertical
            label_height = (max(_text_width(_label(w), LABEL_POINTS) for w in panel.words) + label_height) * COS45
        y += box.height + TICK_PAD + label_height
        panel_titles.append(lines)
        boxes.append(box)
    colorbar = _Box(left, y + COLORBAR_GAP, min(COLORBAR_WIDTH, width - left - MARGIN), COLORBAR_HEIGHT)
    y = colorbar.top + COLORBAR_HEIGHT + COLORBAR_LABELS
    height = math.ceil((y + _line_height(NOTE_POINTS) + MARGIN) * 4) / 4
    return _Layout(width, height, title, panel_titles, boxes, rotated, colorbar, y)


def figure_size(rows: Sequence[LayerRow]) -> tuple[float, float]:
    """Width and height in inches of the heat map of `rows`: a fixed cell per word (the panel with the most words
    decides) and per layer, plus room for the titles, the word labels (taller when rotated), the colour bar and the
    caption; at least MIN_WIDTH wide. The PNG is (width × DPI, height × DPI) pixels."""
    layout = _layout(rows)
    return layout.width, layout.height


def png_size(rows: Sequence[LayerRow]) -> tuple[int, int]:
    """Pixel width and height of the PNG `render_png` writes for `rows`."""
    width, height = figure_size(rows)
    return round(width * DPI), round(height * DPI)


def granularity_figure(rows: Sequence[LayerRow]) -> Figure:
    """The heat map as a matplotlib Figure (no pyplot, no global backend change): one row per layer, one column per
    word, cells coloured and labelled by z, and a colour bar that explains the scale."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize
    from matplotlib.figure import Figure

    layout = _layout(rows)
    width, height = layout.width, layout.height
    cmap = LinearSegmentedColormap.from_list(
        "cdnpg_granularity", [(z, tuple(c / 255 for c in rgb)) for z, rgb in COLOR_STOPS]
    )
    figure = Figure(figsize=(width, height), dpi=DPI)

    def axes_at(box: _Box):
        return figure.add_axes(
            (box.left / width, 1 - (box.top + box.height) / height, box.width / width, box.height / height)
        )

    title = _mpl_text("\n".join(layout.title))
    figure.text(0.5, 1 - MARGIN / height, title, ha="center", va="top", fontsize=TITLE_POINTS)
    for panel, title, box, rotate in zip(_panels(rows), layout.panel_titles, layout.panel_boxes, layout.rotated):
        axes = axes_at(box)
        axes.imshow([row.z for row in panel.rows], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        for i, row in enumerate(panel.rows):
            for j, z in enumerate(row.z):
                color = _hex(_text_rgb(z_to_rgb(z)))
                axes.text(j, i, f"{z:.2f}", ha="center", va="center", fontsize=VALUE_POINTS, color=color)
        axes.set_xticks(range(len(panel.words)))
        axes.set_xticklabels(
            [_mpl_text(_label(w)) for w in panel.words],
            fontsize=LABEL_POINTS,
            rotation=45 if rotate else 0,
            ha="right" if rotate else "center",
            rotation_mode="anchor",
        )
        axes.set_yticks(range(len(panel.rows)))
        axes.set_yticklabels([row.name for row in panel.rows], fontsize=LABEL_POINTS)
        axes.tick_params(length=0, pad=TICK_PAD * 72)
        axes.set_title(_mpl_text("\n".join(title)), fontsize=PANEL_TITLE_POINTS, loc="left", pad=4)
        for spine in axes.spines.values():
            spine.set_visible(False)
    colorbar = figure.colorbar(
        ScalarMappable(Normalize(0.0, 1.0), cmap), cax=axes_at(layout.colorbar), orientation="horizontal"
    )
    colorbar.set_ticks([0, 0.25, 0.5, 0.75, 1])
    colorbar.ax.tick_params(labelsize=9)
    colorbar.set_label(SCALE_LABEL, fontsize=LABEL_POINTS)
    figure.text(
        layout.colorbar.left / width,
        1 - layout.caption_top / height,
        AGGREGATION_NOTE,
        fontsize=NOTE_POINTS,
        color="#444444",
        va="top",
    )
    return figure


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
.w { display: block; padding: 0.25em 0.5em; border-radius: 4px; text-align: center; white-space: nowrap;
     font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; cursor: default; }
.legend { margin-top: 2em; display: flex; align-items: center; gap: 0.8em; font-size: 0.9em; }
.bar { width: 18em; height: 1em; border-radius: 3px; }
.note { color: #555; font-size: 0.9em; }
"""


def render_html(rows: Sequence[LayerRow], path: str | os.PathLike[str] | None = None) -> str:
    """A self-contained HTML page (inline CSS, no external assets): per layer a row of words coloured by z, z in
    each word's tooltip, and a legend. Written to `path` when given; returned either way."""
    esc = html.escape
    gradient = ", ".join(f"{_hex(rgb)} {round(z * 100)}%" for z, rgb in COLOR_STOPS)
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
            cells = []
            for word, z in zip(row.words, row.z):
                background = z_to_rgb(z)
                style = f"background:{_hex(background)};color:{_hex(_text_rgb(background))}"
                tooltip = f"{word}: z = {z:.2f} ({row.name})"
                cells.append(f'<td><span class="w" style="{style}" title="{esc(tooltip)}">{esc(word)}</span></td>')
            parts.append(f"<tr><th>{esc(row.name)}</th>{''.join(cells)}</tr>")
        parts.append("</table>")
    parts += [
        '<div class="legend"><span>0 = sentence-level template</span>',
        f'<span class="bar" style="background: linear-gradient(to right, {gradient})"></span>',
        "<span>1 = phrase-level detail</span></div>",
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
        labels = [_label(w) for w in panel.words]
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


FIGURE_SUFFIXES = (".png", ".svg", ".pdf", ".html", ".htm")  # what `render` writes


def _ansi(code: int, rgb: tuple[int, int, int]) -> str:
    """24-bit ANSI colour: code 48 background, 38 foreground."""
    return f"\x1b[{code};2;{rgb[0]};{rgb[1]};{rgb[2]}m"


def render(rows: Sequence[LayerRow], path: str | os.PathLike[str]) -> Path:
    """Write `rows` to `path` as HTML (.html, .htm) or a matplotlib figure (.png, .svg, .pdf)."""
    path = Path(path)
    if path.suffix.lower() in (".html", ".htm"):
        render_html(rows, path)
        return path
    return render_png(rows, path)
