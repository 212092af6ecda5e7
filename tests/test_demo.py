"""`cdnpg demo` (cdnpg/demo.py): the page shows what the pipeline returns and the z that `cdnpg granularity` computes;
bad input is a line on the page, not an error; the app answers through gradio_client as a lone request does, also
in a burst; `cdnpg demo` serves the page or says in one line why not; the Space installs cdnpg from its
requirements alone and serves; a real browser (Debian's chromium through playwright) paraphrases, sees the coloured
words and the figure."""

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from filelock import FileLock
from PIL import Image

from cdnpg.cli import main
from cdnpg.hub import save_checkpoint
from tests.conftest import ROOT, shared_folder, trained_paraphraser

gradio = pytest.importorskip("gradio", reason="the demo extra (gradio) is not installed: pip install -e '.[demo]'")

from cdnpg.demo import (  # noqa: E402  (after the skip: it builds pages with gradio)
    FIGURE_WORDS,
    MAX_PARAPHRASES,
    build_app,
    defaults,
    figure,
    free_port,
    granularity_of,
    launch,
    load_demo,
    paraphrase_text,
    served,
    words_html,
    z_table,
)

SENTENCE = "how can i get from paris to rome by train ?"
SETTINGS = [  # novelty, keep_details, paraphrases, rank_by
    (0.0, 0.0, 1, "score"),
    (0.5, 0.5, 3, "score"),
    (1.0, 0.0, 2, "score+rewording"),
]
SPACE = ROOT / "spaces" / "cdnpg-demo"
SPACE_FILES = ("app.py", "README.md", "requirements.txt")  # what the Space's repo holds, with the wheel
SCRIPT = ROOT / "scripts" / "demo_screenshot.py"


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer_dir) -> Path:
    """The tiny trained resonance paraphraser of conftest's `paraphrasers`, built (once per run, under the same
    lock and in the same folder, so that the full suite trains it once) without the other kinds."""
    from cdnpg.data import load_tokenizer

    folder = shared_folder(tmp_path_factory, "paraphrasers")
    path, done = folder / "resonance", folder / "resonance.done"
    with FileLock(folder / "resonance.lock"):
        if not done.exists():
            tokenizer = load_tokenizer(tokenizer_dir)
            save_checkpoint(trained_paraphraser(tokenizer, "resonance", copy_mechanism=None), tokenizer, path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def calibrated(checkpoint, tmp_path_factory) -> Path:
    """The checkpoint with decoding defaults and a calibrated z layer in its generation config, as run.py saves a
    trained model: the page must start at those defaults and colour that layer."""
    path = Path(shutil.copytree(checkpoint, tmp_path_factory.mktemp("calibrated") / "model"))
    config = json.loads((path / "generation_config.json").read_text())
    config |= {"novelty": 0.3, "keep_details": 0.6, "novelty_z_layer": 0, "novelty_z_inverted": True,
               "_from_model_config": False}  # fmt: skip
    (path / "generation_config.json").write_text(json.dumps(config, indent=2))
    return path


@pytest.fixture(scope="session")
def demo(calibrated):
    return load_demo(str(calibrated), device="cpu")


@pytest.fixture(scope="session")
def hub_pipeline(calibrated):
    """The checkpoint as a user of transformers loads it: `pipeline("text2text-generation", ...)`, its own code."""
    from transformers import pipeline

    return pipeline("text2text-generation", model=str(calibrated), trust_remote_code=True)


# ---------------------------------------------------------------------------------------------------------------------
# The functions the page calls
# ---------------------------------------------------------------------------------------------------------------------


def test_the_page_shows_what_the_pipeline_returns(demo, hub_pipeline):
    for novelty, keep, count, rank_by in SETTINGS:
        shown = paraphrase_text(demo, SENTENCE, novelty, keep, count, rank_by)
        expected = hub_pipeline(
            SENTENCE, novelty=novelty, keep_details=keep, num_return_sequences=count, rank_by=rank_by
        )
        assert shown.error is None and shown.candidates == expected, (novelty, keep, count, rank_by)
        assert all("score" in candidate for candidate in shown.candidates)  # each with its score, best first
        scores = [candidate["score"] for candidate in shown.candidates]
        assert scores == sorted(scores, reverse=True) and len(scores) >= 1
    if demo.similarity_model is not None:  # a ranking by meaning: the page's embedder is the pipeline's similarity=
        from cdnpg.ranking import SentenceSimilarity

        shown = paraphrase_text(demo, SENTENCE, 0.5, 0.0, 2, "score+similarity")
        similarity = SentenceSimilarity.from_pretrained(demo.similarity_model)
        expected = hub_pipeline(SENTENCE, novelty=0.5, keep_details=0.0, num_return_sequences=2,
                                rank_by="score+similarity", similarity=similarity)  # fmt: skip
        assert shown.candidates == expected and all("similarity" in candidate for candidate in expected)


def test_the_controls_start_at_the_checkpoints_own_defaults(demo, checkpoint):
    from cdnpg.inference import load_model

    assert demo.defaults["novelty"] == 0.3 and demo.defaults["keep_details"] == 0.6  # the generation config's
    plain, _ = load_model(str(checkpoint), "cpu")
    start, offered = defaults(plain)
    assert (start["novelty"], start["keep_details"], start["rank_by"]) == (0.0, 0.0, "score")
    assert "score" in offered and start["rank_by"] in offered
    plain.generation_config.rank_by = {"score": 1.0, "rewording": 2.0}
    start, offered = defaults(plain)
    assert start["rank_by"] == "score=1,rewording=2" == offered[0]  # the checkpoint's own ranking is offered
    app = build_app(demo)
    values = {block.elem_id: getattr(block, "value", None) for block in app.blocks.values()}
    assert values["novelty"] == 0.3 and values["keep"] == 0.6 and values["rank_by"] == demo.defaults["rank_by"]


def test_the_page_of_a_demo_model_says_it_is_no_paraphraser_as_its_card_does(demo, calibrated, tmp_path):
    """A model of the synthetic template corpus: its card's first words (`render_model_card(demo_corpus=True)`)
    stand under the page's title; a card without such a note adds nothing."""
    from cdnpg.hub import render_model_card

    folder = Path(shutil.copytree(calibrated, tmp_path / "template-model"))
    (folder / "README.md").write_text(render_model_card(demo.model, "template-model", demo_corpus=True))
    shown = load_demo(str(folder), device="cpu")
    assert shown.card_note.startswith("**A demo model, not a paraphraser.**") and "do not use them" in shown.card_note
    notes = [block.value for block in build_app(shown).blocks.values() if block.elem_id == "card_note"]
    assert notes == [f"> {shown.card_note}"]
    assert demo.card_note is None and not [b for b in build_app(demo).blocks.values() if b.elem_id == "card_note"]


def test_the_words_are_coloured_by_the_detail_the_rules_read_and_the_figure_shows_raw_z(demo, calibrated, capsys):
    """The calibrated checkpoint reads 1 - z of encoder layer 1: the coloured words carry each word's detail as
    decoding weighs it (the largest 1 - z of its word pieces, 1 = detail), the table and Figure 2 raw z of every
    layer as `cdnpg granularity` computes it; `--show` prints both, the detail first."""
    import torch

    from cdnpg.figures import png_size
    from cdnpg.granularity import word_granularities, word_positions

    shown = granularity_of(demo, SENTENCE)
    expected = word_granularities(demo.model, demo.tokenizer, SENTENCE)
    assert shown.error is None and shown.rows == expected  # every encoder layer, as the command computes them
    assert shown.layer == 0 and "1 − z of encoder layer 1 (the calibrated reading)" in shown.caption
    batch = demo.tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        z = demo.model.get_encoder()(**batch, output_granularities=True).granularities[0][0]
    [groups] = word_positions(demo.tokenizer, batch["input_ids"], batch["attention_mask"])
    details = [max(1 - z[p].item() for p in group) for group in groups]  # decoding's rule, inverted
    page = words_html(shown)
    coloured = re.findall(r'data-z="([0-9.]+)"[^>]*>([^<]*)</span>', page)
    assert [word for _, word in coloured] == expected[0].words and "1 = detail" in page and "1 − z" in page
    assert [float(value) for value, _ in coloured] == pytest.approx([round(d, 4) for d in details], abs=1e-4)
    assert [float(value) for value, _ in coloured] != [round(z, 4) for z in expected[0].z]  # not raw z
    assert z_table(shown) == [[word, *(round(row.z[i], 4) for row in expected)] for i, word in enumerate(expected[0].words)]  # fmt: skip
    assert figure(shown).size == png_size(expected)  # the figure code's own heat map of every layer
    # `cdnpg granularity --show` prints the detail the rules read, then raw z of every layer
    assert main(["granularity", "--model", str(calibrated), "--device", "cpu", SENTENCE, "--show"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("Detail as novelty and keep details read it") < printed.index("Encoder self-attention")
    for word, detail, z in zip(expected[0].words, details, expected[0].z):
        assert re.search(rf"{re.escape(word)}\s+{detail:.2f}\n", printed), word
        assert re.search(rf"{re.escape(word)}\s+{z:.2f}\s", printed), word
    # a checkpoint without calibration: the top layer's z as it is
    uncalibrated = demo.model.generation_config
    layer = uncalibrated.novelty_z_layer
    try:
        del uncalibrated.novelty_z_layer
        top = granularity_of(demo, SENTENCE)
    finally:
        uncalibrated.novelty_z_layer = layer
    assert top.layer == demo.model.config.encoder_layers - 1 and "not calibrated" in top.caption
    assert top.details.z == pytest.approx(top.rows[-1].z, abs=1e-6)  # the top layer's z, not inverted


def test_bad_input_is_one_line_on_the_page_not_an_error(demo):
    limit = demo.model.config.max_position_embeddings
    for text, said in [
        ("", "empty"),
        ("   \n ", "empty"),
        ("日本 ☃ ∰", "unknown to the tokenizer"),
    ]:
        found = paraphrase_text(demo, text, 0.5, 0.5, 2, "score")
        assert found.candidates == [] and said in found.error and "\n" not in found.error, text
        assert said in granularity_of(demo, text).error
        assert (
            "cdnpg-word" not in words_html(granularity_of(demo, text)) and figure(granularity_of(demo, text)) is None
        )
    refused = "The pipeline refused these settings: "  # what the sliders and dropdown let through, checked once
    for values, said in [
        ((1.5, 0.0, 1, "score"), "novelty must be a number in [0, 1]"),
        ((-0.1, 0.0, 1, "score"), "novelty must be"),
        ((math.nan, 0.0, 1, "score"), "novelty must be"),
        ((0.0, 2, 1, "score"), "keep_details must be"),
        ((0.0, 0.0, 0, "score"), "num_return_sequences must be a positive integer"),
        ((0.0, 0.0, 1.5, "score"), "num_return_sequences must be a positive integer"),
        ((0.0, 0.0, 1, "bogus"), "rank_by: unknown part 'bogus'"),
    ]:
        found = paraphrase_text(demo, SENTENCE, *values)
        assert found.candidates == [] and found.error.startswith(refused + said), (values, found.error)
        assert "\n" not in found.error
    refused = demo.model.generation_config
    refused.num_candidates = 0  # a checkpoint whose defaults the pipeline refuses: its message, as a line
    try:
        found = paraphrase_text(demo, SENTENCE, 0.5, 0.5, 2, "score")
    finally:
        del refused.num_candidates
    assert found.candidates == [] and found.error.startswith("The pipeline refused these settings: ")
    assert "generation_config.num_candidates" in found.error and "\n" not in found.error
    long = " ".join([SENTENCE] * 200)  # 2,000 words
    with pytest.warns(UserWarning) as said:  # the pipeline's own line, as `cdnpg paraphrase` prints it
        demo.paraphraser(long, novelty=0.5, keep_details=0.5, num_return_sequences=2)
    found = paraphrase_text(demo, long, 0.5, 0.5, 2, "score")
    assert found.error is None and found.candidates, "a long input is truncated and paraphrased"
    truncated = [str(warning.message) for warning in said if "more than the model takes" in str(warning.message)]
    assert truncated and truncated[0] in found.notes and f"its first {limit} tokens" in truncated[0]
    shown = granularity_of(demo, long)
    assert shown.error is None and len(shown.rows[0].words) < limit
    found = paraphrase_text(demo, "我怎样才能快速学习Python编程？", 0.5, 0.5, 2, "score")  # read as "python"
    assert found.candidates and "input 1: the model cannot read 12 of its 18 characters" in " ".join(found.notes)


# ---------------------------------------------------------------------------------------------------------------------
# The app, served
# ---------------------------------------------------------------------------------------------------------------------


def test_the_app_answers_through_gradio_client_as_the_pipeline_does_also_in_a_burst(demo, hub_pipeline):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    app = build_app(demo)
    url = launch(app, port=free_port())
    try:
        client = Client(url, verbose=False)
        status, table, output = client.predict(SENTENCE, 0.5, 0.5, 3, "score", api_name="/paraphrase")
        expected = hub_pipeline(SENTENCE, novelty=0.5, keep_details=0.5, num_return_sequences=3, rank_by="score")
        assert output == expected and status == ""
        assert [row[1] for row in table["data"]] == [candidate["generated_text"] for candidate in expected]
        html, values, image = client.predict(SENTENCE, api_name="/granularity")
        rows = granularity_of(demo, SENTENCE).rows
        assert values["data"] == [
            [word, *(round(row.z[i], 4) for row in rows)] for i, word in enumerate(rows[0].words)
        ]
        assert html.count('class="cdnpg-word"') == len(rows[0].words) and Path(image).stat().st_size > 0

        jobs = [client.submit(SENTENCE, 0.5, 0.5, 3, "score", api_name="/paraphrase") for _ in range(20)]
        answers = [job.result(timeout=120) for job in jobs]
        assert len(answers) == 20 and all(answer[2] == expected for answer in answers)

        status, table, output = client.predict("  ", 0.5, 0.5, 3, "score", api_name="/paraphrase")
        assert "empty" in status and output == [] and table["data"] == []
        status, _, output = client.predict("日本 ☃", 0.5, 0.5, 3, "score", api_name="/paraphrase")
        assert "unknown to the tokenizer" in status and output == []
        status, _, output = client.predict(" ".join([SENTENCE] * 200), 0.5, 0.5, 1, "score", api_name="/paraphrase")
        assert re.search(r"input 1 has \d+ tokens, more than the model takes: truncated to its first 64", status)
        assert output
        html, _, image = client.predict("", api_name="/granularity")
        assert "empty" in html and image is None
        for values, said in [((1.5, 0.5, 3, "score"), "greater than maximum"), ((0.5, -1, 3, "score"), "less than"),
                             ((0.5, 0.5, MAX_PARAPHRASES + 1, "score"), "greater than maximum")]:  # fmt: skip
            with pytest.raises(AppError, match=said):  # the slider's own check: a message, no traceback
                client.predict(SENTENCE, *values, api_name="/paraphrase")
        assert client.predict(SENTENCE, 0.5, 0.5, 3, "score", api_name="/paraphrase")[2] == expected  # still serving
    finally:
        app.close()


def test_a_long_input_is_answered_in_seconds_and_holds_up_no_one(demo):
    """A 5,000-character input, then a short question sent right after it (the queue serves one request at a
    time): both are answered, paraphrases and z, within seconds. Figure 2 draws the first FIGURE_WORDS words the model
    read, its title says so; the coloured words and the table show all of them."""
    from gradio_client import Client

    long = " ".join(["how can i improve my english speaking skills in a short time"] * 80)[:5000]
    app = build_app(demo)
    url = launch(app, port=free_port())
    try:
        client = Client(url, verbose=False)
        began = time.perf_counter()
        jobs = [client.submit(text, *rest, api_name=name) for text in (long, SENTENCE)
                for name, rest in (("/paraphrase", (0.5, 0.5, 3, "score")), ("/granularity", ()))]  # fmt: skip
        answers = [job.result(timeout=120) for job in jobs]
        seconds = time.perf_counter() - began
    finally:
        app.close()
    assert answers[0][2] and answers[2][2] and "truncated to its first" in answers[0][0]
    words = granularity_of(demo, long).rows[0].words
    assert answers[1][0].count('class="cdnpg-word"') == len(words) > FIGURE_WORDS  # every word read is coloured
    with Image.open(answers[1][2]) as drawn:
        width = figure(granularity_of(demo, " ".join(words[:FIGURE_WORDS]))).size[0]
        assert drawn.size[0] == width  # as wide as a sentence of FIGURE_WORDS words
    assert seconds < 60, f"a long input and a short one took {seconds:.0f} s"


def test_cdnpg_demo_says_in_one_line_why_it_cannot_serve(tmp_path, checkpoint, capsys, monkeypatch):
    import socket

    import cdnpg.demo

    with socket.socket() as taken:  # a port another program serves on: cdnpg's advice, not Gradio's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--model", str(checkpoint), "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1]
        == f"cdnpg: error: --port {port}: it is taken, or cannot be bound on 127.0.0.1: choose another with --port N"
    )
    assert not any("GRADIO_SERVER_PORT" in line or "launch()" in line for line in err), err
    monkeypatch.setattr(cdnpg.demo, "launch", lambda *args, **kwargs: pytest.fail("a page was started"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    for model in (str(broken), str(tmp_path / "missing")):
        assert main(["demo", "--model", model]) == 1
        err = capsys.readouterr().err.strip()
        errors = [line for line in err.splitlines() if line.startswith("cdnpg: error:")]
        assert len(errors) == 1 and errors[0].startswith("cdnpg: error: --model") and "Traceback" not in err, err
    monkeypatch.setitem(sys.modules, "gradio", None)  # as where it is not installed
    assert main(["--help"]) == 0  # the command line itself needs no gradio
    capsys.readouterr()
    assert main(["demo", "--model", str(checkpoint)]) == 1
    assert capsys.readouterr().err.strip() == (
        "cdnpg: error: the demo needs gradio, which is not installed: pip install 'cdnpg[demo]' (pip install -e "
        "'.[demo]' in a checkout)"
    )
    assert main(["demo", "--model", str(checkpoint), "--port", "70000"]) == 2


def load_script(path: Path = SCRIPT, name: str = "demo_screenshot"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cdnpg_demo_serves_the_page_in_a_browser(calibrated, hub_pipeline, tmp_path):
    """`cdnpg demo` as a user starts it; Debian's chromium types, clicks and sees the paraphrases, the coloured words
    and the figure (the screenshot is saved to tmp_path; docs/demo.png is made by scripts/demo_screenshot.py)."""
    script = load_script()
    with script.serve(str(calibrated), port=free_port()) as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and "C-DNPG" in page.read().decode()
        if script.chromium() is None:
            pytest.skip("no chromium: scripts/test.sh installs it with apt-get (Debian, as root)")
        pytest.importorskip("playwright", reason="playwright is not installed: pip install -e '.[test]'")
        shown = script.use_page(url, SENTENCE, tmp_path / "demo.png")
    expected = hub_pipeline(SENTENCE, novelty=0.3, keep_details=0.6, num_return_sequences=3, rank_by="score")
    for candidate in expected:  # the page starts at the checkpoint's defaults
        assert candidate["generated_text"] in shown["paraphrases"]
    demo = load_demo(str(calibrated), device="cpu")
    row = granularity_of(demo, SENTENCE).details  # what the rules read
    assert shown["words"] == [(word, round(z, 4)) for word, z in zip(row.words, row.z)]
    assert shown["figure"] and (tmp_path / "demo.png").stat().st_size > 10_000


def space_requirement() -> str:
    """The wheel requirements.txt names (its one requirement line)."""
    lines = (SPACE / "requirements.txt").read_text().splitlines()
    [wheel] = [line for line in lines if line.strip() and not line.startswith("#")]
    return wheel


@pytest.mark.slow
def test_the_space_installs_cdnpg_from_its_requirements_alone(calibrated, tmp_path):
    """The Space as Spaces build it: its files and the wheel docs/demo.md builds into it, a clean virtualenv with the
    gradio of its sdk_version and then its requirements.txt alone, app.py run by that Python outside the checkout.
    A package that cdnpg's page needs and requirements.txt does not bring fails here. torch==2.13.0 is installed
    first, as the CPU build that scripts/setup.sh installs: from the index, torch>=2.4 alone resolves to a multi-GB
    CUDA build (Spaces bring theirs). A relative CDNPG_MODEL is a folder beside app.py, wherever it runs from.
    scripts/test.sh builds that virtualenv the same way while it installs the rest (CDNPG_SPACE_PYTHON); here the
    wheel just built is installed into it, so that app.py runs this checkout's code."""
    space = tmp_path / "space"
    space.mkdir()
    for name in SPACE_FILES:
        shutil.copy(SPACE / name, space / name)
    header = (space / "README.md").read_text().split("---")[1]
    assert re.search(r"^sdk: gradio$", header, re.M) and re.search(r"^app_file: app.py$", header, re.M)
    assert re.search(rf"^sdk_version: {re.escape(gradio.__version__)}$", header, re.M)  # the tested gradio
    # docs/demo.md's build command: pip wheel --no-deps -w spaces/cdnpg-demo .
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(space), "."], cwd=ROOT,
                           capture_output=True, text=True)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = space_requirement().split("[")[0]
    assert [path.name for path in space.glob("*.whl")] == [Path(wheel).name], "requirements.txt names the built wheel"

    environment = {key: value for key, value in os.environ.items() if key not in ("CDNPG_MODEL", "PYTHONPATH")}
    if python := os.environ.get("CDNPG_SPACE_PYTHON"):
        steps = [["--no-deps", "--force-reinstall", wheel]]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
        python = str(tmp_path / "venv" / "bin" / "python")
        steps = [["torch==2.13.0", f"gradio=={gradio.__version__}"], ["-r", "requirements.txt"]]
    for step in steps:
        done = subprocess.run([python, "-m", "pip", "install", "-q", *step], cwd=space, env=environment,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, (step, done.stderr[-3000:])
    # where each package would be imported from (app.py below imports them all and answers)
    found = subprocess.run([python, "-c", "from importlib import metadata, util\n"
                            "print(metadata.version('gradio'), *(util.find_spec(name).origin for name in "
                            "('cdnpg', 'modeling_cdnpg')))"],
                           cwd=space, env=environment, capture_output=True, text=True, check=True)  # fmt: skip
    version, *where = found.stdout.split()
    assert version == gradio.__version__  # sdk_version's gradio, the one tested here
    assert len(where) == 2 and all("site-packages" in path for path in where), where  # installed, not the checkout's

    missing = subprocess.run([python, "app.py"], cwd=space, env=environment, capture_output=True, text=True)
    assert missing.returncode == 1 and "CDNPG_MODEL" in missing.stderr.strip().splitlines()[-1]
    shutil.copytree(calibrated, space / "model")
    port = free_port()
    environment |= {"CDNPG_MODEL": "model", "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
                    "GRADIO_ANALYTICS_ENABLED": "False"}  # fmt: skip
    with served([python, str(space / "app.py")], port, cwd=tmp_path, env=environment) as (url, _):
        from gradio_client import Client

        answer = Client(url, verbose=False).predict(SENTENCE, 0.5, 0.5, 2, "score", api_name="/paraphrase")
        assert answer[2] and all(candidate["generated_text"] for candidate in answer[2])


def test_the_benchmark_times_the_app_and_the_pipeline_on_the_same_answers(calibrated, tmp_path):
    """benchmarks/demo.py --quick: one start of `cdnpg demo`, two rounds; it stops if a way answers other paraphrases
    than the pipeline. No timing is asserted (docs/demo.md gives the full run's)."""
    benchmark = load_script(ROOT / "benchmarks" / "demo.py", "demo_benchmark")
    import torch

    threads, torch_threads = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()  # main() sets both
    try:
        results = benchmark.main([str(calibrated), "--quick", "--out", str(tmp_path / "demo.json")])
    finally:
        torch.set_num_threads(torch_threads)
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    assert json.loads((tmp_path / "demo.json").read_text()) == json.loads(json.dumps(results))
    assert set(results["ratio_to_pipeline"]) == {"app (gradio_client)", "app (HTTP API)"}
    assert all(value > 0 for value in results["seconds_per_request"].values()) and results["first_page_seconds"] > 0
