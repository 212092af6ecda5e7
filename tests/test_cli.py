"""The `cdnpg` command line and the granularity figure (cdnpg.cli, cdnpg.commands, cdnpg.inference, cdnpg.granularity,
cdnpg.figures).

End-to-end tests run a command as a user types it (`run_cli`: arguments, working folder, piped input, exit code,
stdout and stderr) on a tiny random model saved once per module, through `cdnpg.cli.main`, the code both entry points
run. A few run the entry points themselves in a fresh process (`python -m cdnpg.cli`, the installed `cdnpg` script,
input piped while it arrives), which costs seconds of imports each.
"""

import contextlib
import importlib.util
import io
import itertools
import json
import logging
import os
import queue
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from huggingface_hub import constants
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from cdnpg.cli import main
from cdnpg.data import model_token_ids, train_wordpiece_tokenizer
from cdnpg.figures import (
    CELL_WIDTH,
    DPI,
    ROW_HEIGHT,
    SCALE_LABEL,
    figure_size,
    granularity_figure,
    png_size,
    render_html,
    render_text,
    z_to_rgb,
)
from cdnpg.granularity import GranularityUnavailableError, LayerRow, word_granularities
from cdnpg.inference import generation_kwargs, input_limit
from modeling_cdnpg import CDNPGText2TextPipeline, paraphrase
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
CORPUS = [
    "how do i learn python quickly ?",
    "what is the best way to lose weight ?",
    "how can i improve my english speaking skills ?",
    "why is the sky blue ?",
    "what are the best books to read this year ?",
    "how do i start a small business ?",
]
SENTENCE = "how do i learn python quickly ?"
SPLIT_SENTENCE = "how do pythonic weights work ?"  # "pythonic", "weights" are several pieces in the tiny vocabulary
MAX_POSITIONS = 64  # tiny_config's max_position_embeddings


def train_tokenizer() -> PreTrainedTokenizerFast:
    """A lowercase BERT-style WordPiece tokenizer, small enough that unseen words split into pieces."""
    return train_wordpiece_tokenizer(CORPUS * 3, vocab_size=120, min_frequency=1)


def save_tiny(directory: Path, tokenizer: PreTrainedTokenizerFast, **overrides) -> Path:
    model = tiny_model(
        **model_token_ids(tokenizer),
        **overrides,
    )
    with torch.no_grad():  # special tokens score 0: the random model's paraphrases are words, never only [UNK]/[SEP]
        model.get_input_embeddings().weight[tokenizer.all_special_ids] = 0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("cli") / "tiny", train_tokenizer())


@pytest.fixture(scope="module")
def none_model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("cli") / "baseline", train_tokenizer(), granularity_mask="none")


@pytest.fixture(scope="module")
def loaded(model_dir):
    return AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def run_cli(
    *args: str, stdin: str | None = None, cwd: Path | None = None, executable: str | None = None, fresh: bool = False
) -> subprocess.CompletedProcess:
    """`cdnpg ARGS` as a user runs it, offline and without colour, from `cwd` (the checkout by default), with `stdin`
    piped in (else nothing): its exit code, stdout and stderr. In this process, `cdnpg.cli.main(ARGS)`, the code the
    entry points run, less their seconds of imports; in a fresh process (`python -m cdnpg.cli`, or the console script
    `executable`) with `fresh` or `executable`."""
    env = {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    if fresh or executable:
        command = [executable] if executable else [sys.executable, "-m", "cdnpg.cli"]
        return subprocess.run(
            [*command, *args],
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=cwd or ROOT,
            timeout=300,
            # one thread: a tiny model gains nothing from more, and loses a lot to contention on a busy CI machine
            env={**os.environ, **env},
        )
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env),
        mock.patch.object(constants, "HF_HUB_OFFLINE", True),  # read at import: the fresh process's value
        mock.patch.object(sys, "stdin", io.StringIO(stdin or "")),
        contextlib.chdir(cwd or ROOT),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        code = main(list(args))
    return subprocess.CompletedProcess(["cdnpg", *args], code, stdout.getvalue(), stderr.getvalue())


def output_lines(stdout: str) -> list[str]:
    """Lines of stdout, keeping empty ones (an empty input gives an empty line)."""
    assert stdout.endswith("\n")
    return stdout[:-1].split("\n")


def png_dimensions(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def rows_for(words_encoder: list[str], words_decoder: list[str] | None = None) -> list[LayerRow]:
    """Synthetic rows: 3 encoder layers (and 3 decoder layers) with z spread over [0, 1]."""
    rows = []
    for layer in range(1, 4):
        z = [(layer * 0.3 + j * 0.17) % 1 for j in range(len(words_encoder))]
        rows.append(LayerRow(f"encoder {layer}", "encoder", words_encoder, z, " ".join(words_encoder), "encoder"))
    for layer in range(1, 4) if words_decoder else ():
        z = [(layer * 0.2 + j * 0.31) % 1 for j in range(len(words_decoder))]
        sentence = " ".join(words_decoder)
        rows.append(LayerRow(f"decoder {layer}", "decoder", words_decoder, z, sentence, "decoder (greedy decoding)"))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# paraphrase, end to end
# ---------------------------------------------------------------------------------------------------------------------


def test_paraphrase_arguments_one_line_each_with_num_return_sequences(model_dir):
    result = run_cli("paraphrase", "--model", str(model_dir), SENTENCE, "why is the sky blue ?", "-n", "3")
    assert result.returncode == 0, result.stderr
    lines = output_lines(result.stdout)
    assert len(lines) == 2
    assert all(len(line.split("\t")) == 3 for line in lines)


def test_paraphrase_stdin_passes_empty_lines_through_with_a_warning(model_dir):
    result = run_cli("paraphrase", "--model", str(model_dir), "--num-beams", "2", stdin=f"{SENTENCE}\n\nwhy ?\n")
    assert result.returncode == 0, result.stderr
    lines = output_lines(result.stdout)
    assert len(lines) == 3
    assert lines[1] == ""
    assert "warning: input 2 is empty" in result.stderr


def test_paraphrase_file_to_jsonl_truncates_long_input_with_a_warning(model_dir, loaded, tmp_path):
    long_line = " ".join(["how"] * 100)  # more than the 64 positions of the tiny model
    tokens = len(loaded[1](long_line)["input_ids"])
    source = tmp_path / "in.txt"
    source.write_text(f"{SENTENCE}\n{long_line}\nwhy is the sky blue ?\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    result = run_cli(
        "paraphrase", "--model", str(model_dir), "--input", str(source), "--output", str(output), "-n", "2",
        "--batch-size", "2", "--max-new-tokens", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["source"] for r in records] == [SENTENCE, long_line, "why is the sky blue ?"]
    assert all(set(r) == {"source", "paraphrases"} and len(r["paraphrases"]) == 2 for r in records)
    assert all(isinstance(p, str) for r in records for p in r["paraphrases"])
    assert (
        f"input 2 has {tokens} tokens, more than the model takes: truncated to its first {MAX_POSITIONS}"
        in result.stderr
    )
    assert f"max_position_embeddings={MAX_POSITIONS}" in result.stderr
    assert "input 1 " not in result.stderr and "input 3 " not in result.stderr
    assert result.stdout == ""


def test_more_sequences_than_beams_raise_the_beams_alike_in_paraphrase_the_pipeline_and_the_cli(
    model_dir, loaded, capsys
):
    """Beam search returns at most one sequence per beam: asked for 10 sequences, more than the checkpoint's 8 beams,
    paraphrase(), the pipeline and `cdnpg paraphrase` all search with 10 beams and say so in the same line
    (`generation_cdnpg.enough_beams`); a num_beams given in the call that holds fewer is an error naming both."""
    model, tokenizer = loaded
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device="cpu")
    line = (
        "using 10 beams to return 10 sequences (the generation config's num_beams is 8; beam search returns at most "
        "one sequence per beam)"
    )
    with pytest.warns(UserWarning) as caught:
        raised = paraphraser(SENTENCE, num_return_sequences=10, max_new_tokens=4)
        out = paraphrase(model, tokenizer, tokenizer([SENTENCE], return_tensors="pt"), num_return_sequences=10,
                         max_new_tokens=4)  # fmt: skip
    assert [str(warning.message) for warning in caught if "beams" in str(warning.message)] == [line, line]
    assert raised == paraphraser(SENTENCE, num_return_sequences=10, num_beams=10, max_new_tokens=4)
    assert [c["generated_text"] for c in raised] == tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    with pytest.raises(ValueError, match=r"^num_return_sequences=10 cannot exceed num_beams=4: beam search returns"):
        paraphraser(SENTENCE, num_return_sequences=10, num_beams=4, max_new_tokens=4)
    assert main(["paraphrase", "--model", str(model_dir), "-n", "10", "--max-new-tokens", "4", SENTENCE]) == 0
    printed = capsys.readouterr()
    assert printed.out == "\t".join(" ".join(c["generated_text"].split()) for c in raised) + "\n"
    assert f"cdnpg: warning: {line}" in printed.err.splitlines()


def test_the_pipeline_says_a_long_input_is_truncated_in_the_clis_words_and_nothing_misleading(
    model_dir, capsys, caplog
):
    """An input longer than the model takes is truncated to what it takes: the pipeline says so as the command does
    (`pipeline_cdnpg.truncated`), and transformers' "Token indices sequence length is longer than the specified
    maximum sequence length ... will result in indexing errors", untrue of a truncated input, is not said."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # a fresh one: transformers says that line once per tokenizer
    paraphraser = CDNPGText2TextPipeline(model=AutoModelForSeq2SeqLM.from_pretrained(model_dir), tokenizer=tokenizer,
                                         device="cpu")  # fmt: skip
    long_line = " ".join(["how"] * 150)  # more than the tokenizer's model_max_length (128) and the model's positions
    tokens = len(tokenizer(long_line, verbose=False)["input_ids"])
    said = (
        f"input 2 has {tokens} tokens, more than the model takes: truncated to its first {MAX_POSITIONS} tokens "
        f"(the model's max_position_embeddings={MAX_POSITIONS})"
    )
    library = logging.getLogger("transformers")  # it does not propagate: listened to directly
    library.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = paraphraser([SENTENCE, long_line], num_beams=2, max_new_tokens=4)
    finally:
        library.removeHandler(caplog.handler)
    assert [len(candidates) for candidates in found] == [1, 1]
    assert [str(warning.message) for warning in caught] == [said] and caplog.records == []  # a warning, not a log
    assert main(["paraphrase", "--model", str(model_dir), "--num-beams", "2", "--max-new-tokens", "4", SENTENCE,
                 long_line]) == 0  # fmt: skip
    assert f"cdnpg: warning: {said}" in capsys.readouterr().err.splitlines()


def test_the_pipeline_and_the_cli_say_how_much_of_the_input_the_model_cannot_read(model_dir, loaded, capsys):
    """Characters the tokenizer reads as [UNK] (here CJK: "我怎样才能快速学习Python编程？" is read as "python") are
    counted and shown in the pipeline's warning, which `cdnpg paraphrase` prints as is; an input it reads whole gets
    none."""
    model, tokenizer = loaded
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device="cpu")
    text = "我怎样才能快速学习Python编程？"
    said = (
        "input 1: the model cannot read 12 of its 18 characters: '我怎样才能快速学习编程？' (unknown to its tokenizer)"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paraphraser([text, SENTENCE], num_beams=2, max_new_tokens=4)
    assert [str(warning.message) for warning in caught if "cannot read" in str(warning.message)] == [said]
    assert main(["paraphrase", "--model", str(model_dir), "--num-beams", "2", "--max-new-tokens", "4", text]) == 0
    assert f"cdnpg: warning: {said}" in capsys.readouterr().err.splitlines()


def test_installed_console_script(model_dir):
    venv_bin = str(Path(sys.executable).parent)
    executable = shutil.which("cdnpg", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if executable is None:
        pytest.skip("the cdnpg console script is not installed (pip install -e .)")
    result = run_cli("paraphrase", "--model", str(model_dir), "--num-beams", "1", SENTENCE, executable=executable)
    assert result.returncode == 0, result.stderr
    assert len(output_lines(result.stdout)) == 1


# ---------------------------------------------------------------------------------------------------------------------
# granularity, end to end
# ---------------------------------------------------------------------------------------------------------------------


def test_granularity_png_html_and_terminal_table(model_dir, loaded, tmp_path):
    figure, page_path = tmp_path / "figure.png", tmp_path / "figure.html"
    outputs = ["--out", str(figure), "--out", str(page_path), "--show"]
    options = ["--decoder", "--num-beams", "2", "--max-new-tokens", "6"]
    result = run_cli("granularity", "--model", str(model_dir), SENTENCE, *outputs, *options)
    assert result.returncode == 0, result.stderr
    # the same rows in this process (beam search is deterministic) give the size the renderer computes
    rows = word_granularities(*loaded, SENTENCE, decoder=True, num_beams=2, max_new_tokens=6)
    assert png_dimensions(figure) == png_size(rows)
    width, height = figure_size(rows)
    assert png_size(rows) == (width * DPI, height * DPI)
    for word in SENTENCE.split():
        assert word in result.stdout
    for name in ("encoder 1", "encoder 2", "decoder 1", "decoder 2"):
        assert name in result.stdout
    assert "beam search, 2 beams" in result.stdout
    assert SCALE_LABEL in result.stdout
    assert "\x1b[" not in result.stdout  # no colour codes into a pipe

    page = page_path.read_text(encoding="utf-8")
    for word in [*SENTENCE.split(), *rows[-1].words]:
        assert f">{word}</span>" in page
    assert "encoder 2" in page and "decoder 2" in page
    assert (
        "<link" not in page and "<script" not in page and "src=" not in page and "url(" not in page
    )  # self-contained


# ---------------------------------------------------------------------------------------------------------------------
# errors, end to end: one line on stderr, no traceback, the exit code
# ---------------------------------------------------------------------------------------------------------------------


def test_the_commands_that_load_a_model_import_its_libraries_as_long_lived_imports(model_dir, tmp_path):
    """Every command with --model imports torch, transformers and the pipeline under `long_lived_imports` before it
    runs, as training/run.py imports them; a command without a model, and a model refused before loading, do not."""
    import cdnpg.cli

    entered = []

    @contextlib.contextmanager
    def recorded():
        entered.append(True)
        yield

    with mock.patch.object(cdnpg.cli, "long_lived_imports", recorded):
        assert run_cli("paraphrase", "--model", str(model_dir), "--num-beams", "2", SENTENCE).returncode == 0
        assert entered == [True]
        assert run_cli("paraphrase", "--model", str(tmp_path / "missing"), SENTENCE).returncode == 1
        assert run_cli("refresh-code", str(tmp_path)).returncode == 1
    assert entered == [True]
    assert {command for command, parser in cdnpg.cli.build_parser()._subparsers._group_actions[0].choices.items()
            if parser.get_default("loads_model")} == {"paraphrase", "granularity", "demo", "augment"}  # fmt: skip


def test_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    result = run_cli("paraphrase", "--model", str(missing), SENTENCE, fresh=True)
    assert result.returncode == 1
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_model_that_looks_like_a_hub_id_fails_at_once_with_the_documented_message(
    tmp_path, monkeypatch, capsys
):
    """docs/cli.md's typo "runs/tempalte" (next to runs/) and an "owner/name" id while offline must not
    wait for Hub retries (26 s offline) before saying "no such model directory"."""
    (tmp_path / "runs").mkdir()
    typo = run_cli("paraphrase", "--model", "runs/tempalte", SENTENCE, cwd=tmp_path)
    assert (typo.returncode, typo.stderr) == (1, "cdnpg: error: --model runs/tempalte: no such model directory\n")
    offline = run_cli("paraphrase", "--model", "someone/qoura", SENTENCE, cwd=tmp_path)  # run_cli: HF_HUB_OFFLINE=1
    assert offline.returncode == 1
    assert "cdnpg: error: --model someone/qoura: no such model directory" in offline.stderr
    # the check itself, timed in this process (a fresh one adds seconds of imports before it)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for name in ("runs/tempalte", "someone/qoura"):
        start = time.perf_counter()
        assert main(["paraphrase", "--model", name, SENTENCE]) == 1
        assert time.perf_counter() - start < 10  # Hub retries would take 26 s
        assert f"--model {name}: no such model directory" in capsys.readouterr().err


def test_piped_input_is_paraphrased_line_by_line_as_it_arrives(model_dir):
    """A slow producer (`slow_producer | cdnpg paraphrase`): each line's paraphrase is printed before the next line
    is written, not after 32 lines or the end of input."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cdnpg.cli", "paraphrase", "--model", str(model_dir), "--num-beams", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        printed = []
        for sentence in (SENTENCE, "why is the sky blue ?", "what is the best way to lose weight ?"):
            process.stdin.write(sentence + "\n")
            process.stdin.flush()  # and the producer waits: without streaming, nothing comes back until the end
            printed.append(lines.get(timeout=60))
        process.stdin.close()
        assert process.wait(timeout=60) == 0 and lines.empty()
    finally:
        process.kill()
    assert all(line.endswith("\n") and line.strip() for line in printed)
    batch = run_cli("paraphrase", "--model", str(model_dir), "--num-beams", "2", SENTENCE, "why is the sky blue ?")
    assert [line[:-1] for line in printed[:2]] == output_lines(batch.stdout)  # the same paraphrases, in order


def test_install_wordnet_is_a_subcommand_of_the_installed_package(tmp_path):
    if not Path("/usr/share/wordnet/index.noun").is_file():
        pytest.skip("Debian's wordnet-base is not installed (scripts/setup.sh installs it)")
    result = run_cli("install-wordnet", "--target", str(tmp_path / "nltk_data"), fresh=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "nltk_data" / "corpora" / "wordnet" / "lexnames").is_file()
    assert "Verified WordNet 3.0" in result.stderr


# In process from here on: `main(argv)` is the same code without the seconds of imports of a fresh process.


def test_a_heat_map_without_matplotlib_is_one_line_naming_the_package(model_dir, tmp_path, capsys, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    assert main(["granularity", "--model", str(model_dir), SENTENCE, "--out", str(tmp_path / "z.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cdnpg: error: --out") and "pip install matplotlib" in err and len(err.splitlines()) == 1
    assert main(["granularity", "--model", str(model_dir), SENTENCE, "--out", str(tmp_path / "z.html")]) == 0


def test_any_missing_optional_module_is_one_line_naming_it(model_dir, capsys, monkeypatch):
    def missing(args):
        raise ModuleNotFoundError("No module named 'datasets'", name="datasets")

    monkeypatch.setattr("cdnpg.inference.load_model", lambda *a: missing(a))
    assert main(["paraphrase", "--model", str(model_dir), SENTENCE]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cdnpg: error: datasets is not installed; pip install datasets") and "Traceback" not in err


def test_granularity_of_a_model_without_granularity_heads_is_a_clear_error(none_model_dir, tmp_path, capsys):
    figure = tmp_path / "f.png"
    assert main(["granularity", "--model", str(none_model_dir), SENTENCE, "--out", str(figure)]) == 1
    err = capsys.readouterr().err
    assert "granularity_mask='none'" in err and "no granularity heads" in err
    assert "Traceback" not in err
    assert not figure.exists()


def test_unknown_out_suffix_is_a_usage_error_naming_the_allowed_ones(model_dir, tmp_path, capsys):
    assert main(["granularity", "--model", str(model_dir), SENTENCE, "--out", str(tmp_path / "figure.jpg")]) == 2
    err = capsys.readouterr().err
    assert "'.jpg'" in err and ".png" in err and ".html" in err


def test_main_leaves_logging_as_it_found_it(model_dir, capsys):
    package = logging.getLogger("cdnpg")
    before = (package.handlers[:], package.level, package.propagate)
    assert main(["paraphrase", "--model", str(model_dir), "--num-beams", "1", "--max-new-tokens", "2", ""]) == 0
    assert "input 1 is empty" in capsys.readouterr().err
    assert (package.handlers, package.level, package.propagate) == before


# ---------------------------------------------------------------------------------------------------------------------
# Usage errors, z per word, generation settings, rendering
# ---------------------------------------------------------------------------------------------------------------------


AUGMENT = ["augment", "--model", "m", "--data", "d.jsonl", "--column", "text", "--output-dir", "out"]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "required"),
        (["granularity", "--model", "m", "text"], "nothing to do"),
        (["granularity", "--model", "m", "  ", "--show"], "empty"),
        (["paraphrase", "--model", "m", "text", "--input", "f.txt"], "not both"),
        (["paraphrase", "--model", "m", "text", "--num-beams", "2", "-n", "3"], "cannot exceed --num-beams 2"),
        (["paraphrase", "--model", "m", "text", "--batch-size", "0"], "--batch-size"),
        (["paraphrase", "--model", "m", "text", "--device", "gpu"], "--device"),
        (["paraphrase", "text"], "--model"),
        ([*AUGMENT, "-n", "0"], "--num-paraphrases must be at least 1, got 0"),
        ([*AUGMENT, "-n", "3", "--num-beams", "2"], "--num-paraphrases 3 cannot exceed --num-beams 2"),
        ([*AUGMENT, "--novelty", "1.5"], "--novelty must be between 0 and 1, got 1.5"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_help_says_what_each_command_does(capsys):
    """granularity's help gives the rule the code, the figure and docs/cli.md follow (a word's z is its pieces'
    largest), and each command's generation options are titled for that command: paraphrase has no --decoder."""
    assert main(["granularity", "--help"]) == 0
    granularity = " ".join(capsys.readouterr().out.split())
    assert "per word (the largest z of its word pieces" in granularity and "mean" not in granularity
    assert "generation of the paraphrase that --decoder shows:" in granularity
    assert main(["paraphrase", "--help"]) == 0
    paraphrase = " ".join(capsys.readouterr().out.split())
    assert "--decoder" not in paraphrase and "generation: --num-beams N" in paraphrase


# Runs `cdnpg.cli.main` on each case of argv[1] (JSON: argv, offline) in one fresh process, and says after each whether
# torch or transformers has been imported.
BEFORE_TORCH = """
import json, sys
from huggingface_hub import constants
from cdnpg.cli import main
for case in json.loads(sys.argv[1]):
    constants.HF_HUB_OFFLINE = case["offline"]
    code = main(case["argv"])
    print(json.dumps({"code": code, "imported": sorted({"torch", "transformers"} & set(sys.modules))}), flush=True)
"""


def test_a_missing_file_or_model_is_refused_before_torch_is_imported(model_dir, tmp_path):
    """What the command line names is checked before the seconds of importing torch and transformers: a missing
    --input, an --output or --out folder that is not there, a --model path that is not there (for every command
    that loads one), a Hub id while offline, and one where the Hub (here a closed port) cannot be reached."""
    from tests.hub_server import closed_endpoint

    (tmp_path / "runs").mkdir()
    endpoint = closed_endpoint()
    model = str(model_dir)
    cases = [
        (["paraphrase", "--model", model, "--input", "missing.txt"], "--input missing.txt: no such file"),
        (["paraphrase", "--model", model, "-o", "no/out.jsonl", "hi"], "--output no/out.jsonl: its directory does not exist"),
        (["granularity", "--model", model, "hi", "--out", "no/z.png"], "--out no/z.png: its directory does not exist"),
        (["paraphrase", "--model", "./qoura", "hi"], "--model ./qoura: no such model directory"),
        (["granularity", "--model", "runs/qoura", "hi", "--show"], "--model runs/qoura: no such model directory"),
        (["demo", "--model", "runs/qoura"], "--model runs/qoura: no such model directory"),
        (["paraphrase", "--model", "someone/qoura", "hi"], "--model someone/qoura: no such model directory, and "
         "not in the local Hub cache (HF_HUB_OFFLINE)"),
        (["paraphrase", "--model", "someone/qoura", "hi"], f"--model someone/qoura: no such model directory, and "
         f"the Hub ({endpoint}) cannot be reached: "),
    ]  # fmt: skip
    runs = [{"argv": argv, "offline": "HF_HUB_OFFLINE" in message} for argv, message in cases]
    result = subprocess.run(
        [sys.executable, "-c", BEFORE_TORCH, json.dumps(runs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    errors = result.stderr.splitlines()
    assert len(errors) == len(cases), result.stderr
    for (argv, message), error, line in zip(cases, errors, result.stdout.splitlines()):
        assert error.startswith(f"cdnpg: error: {message}"), argv
        assert json.loads(line) == {"code": 1, "imported": []}, argv


def test_word_z_is_the_largest_z_of_its_pieces_as_decoding_weighs_words(loaded):
    model, tokenizer = loaded
    encoding = tokenizer(SPLIT_SENTENCE, return_tensors="pt")
    pieces = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0])
    assert any(p.startswith("##") for p in pieces), "the test needs a word split into pieces"
    rows = word_granularities(model, tokenizer, SPLIT_SENTENCE)
    assert [row.name for row in rows] == ["encoder 1", "encoder 2"]
    assert all(row.words == SPLIT_SENTENCE.split() for row in rows)  # words, not pieces; no [CLS]/[SEP]

    with torch.no_grad():
        z = model.get_encoder()(**encoding, output_granularities=True).granularities
    word_ids = encoding.word_ids(0)
    for layer, row in enumerate(rows):
        for word, value in enumerate(row.z):
            positions = [p for p, w in enumerate(word_ids) if w == word]
            assert value == pytest.approx(z[layer][0, positions].max().item(), abs=1e-6)


def test_decoder_rows_follow_the_models_own_paraphrase(loaded):
    model, tokenizer = loaded
    rows = word_granularities(model, tokenizer, SENTENCE, decoder=True, num_beams=1, max_new_tokens=5)
    decoder_rows = [row for row in rows if row.stack == "decoder"]
    assert [row.name for row in decoder_rows] == ["decoder 1", "decoder 2"]
    generated = model.generate(**tokenizer(SENTENCE, return_tensors="pt"), num_beams=1, max_new_tokens=5)
    paraphrase = tokenizer.decode(generated[0], skip_special_tokens=True)
    assert decoder_rows[0].sentence == paraphrase
    assert "greedy decoding" in decoder_rows[0].description
    assert all(0 < z < 1 for row in decoder_rows for z in row.z)
    assert all(len(row.z) == len(row.words) for row in rows)


def test_granularity_needs_granularity_heads(none_model_dir):
    model = AutoModelForSeq2SeqLM.from_pretrained(none_model_dir)
    with pytest.raises(GranularityUnavailableError, match="granularity_mask='none'"):
        word_granularities(model, AutoTokenizer.from_pretrained(none_model_dir), SENTENCE)


def test_empty_sentence_is_refused(loaded):
    with pytest.raises(ValueError, match="empty"):
        word_granularities(*loaded, "   ")


def test_input_limit_is_the_models_positions_not_the_papers_20_tokens(loaded):
    model, tokenizer = loaded
    assert input_limit(model, tokenizer) == (MAX_POSITIONS, f"the model's max_position_embeddings={MAX_POSITIONS}")
    smaller = SimpleNamespace(model_max_length=16)  # a tokenizer that declares a lower limit lowers it
    assert input_limit(model, smaller) == (16, "the tokenizer's model_max_length=16")


def test_generation_settings(loaded, caplog):
    model, _ = loaded
    # the checkpoint's generation_config: the paper's beam 8 and 20 new tokens
    assert generation_kwargs(model, 10) == {"num_beams": 8, "max_new_tokens": 20, "max_length": None}
    assert generation_kwargs(model, 40)["max_new_tokens"] == 40  # a long input is not cut at 20
    assert generation_kwargs(model, 100)["max_new_tokens"] == MAX_POSITIONS - 1  # the decoder's positions
    assert generation_kwargs(model, 10, num_beams=3)["num_beams"] == 3
    with caplog.at_level("WARNING", logger="cdnpg"):
        assert generation_kwargs(model, 10, max_new_tokens=500)["max_new_tokens"] == MAX_POSITIONS - 1
    assert "max_new_tokens=500" in caplog.text


def test_render_text_table_and_colours():
    rows = rows_for(["how", "do", "i", "learn", "python", "?"], ["how", "can", "i", "study", "python", "?"])
    text = render_text(rows)
    for name in [row.name for row in rows]:
        assert name in text
    assert "study" in text and "learn" in text
    assert f"{rows[0].z[3]:.2f}" in text
    assert "\x1b[" not in text
    colored = render_text(rows, color=True)
    r, g, b = z_to_rgb(rows[0].z[0])
    assert f"\x1b[48;2;{r};{g};{b}m" in colored


def test_render_html_escapes_words_and_has_tooltips_and_legend():
    rows = rows_for(["<b>", "&", "python"])
    page = render_html(rows)
    assert "<b></span>" not in page and "&lt;b&gt;" in page and "&amp;" in page
    assert f'title="python: z = {rows[0].z[2]:.2f} (encoder 1)"' in page
    assert "sentence-level template" in page and "phrase-level detail" in page
    assert "largest z of its word pieces" in page
    assert page.count("<tr>") == 3


def test_the_figure_leaves_out_what_its_font_cannot_draw_and_warns_of_no_missing_glyph(tmp_path, caplog):
    """CJK characters (no glyph in matplotlib's default font) are left out of the title and the labels, a word of
    nothing else is "?": the figure is drawn without matplotlib's "Glyph ... missing" warnings."""
    from cdnpg.figures import _mpl_text, render_png

    rows = rows_for(["我怎样才能", "python", "编程？", "?"])
    assert _mpl_text(rows[0].sentence) == "? python ? ?"
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        render_png(rows, tmp_path / "cjk.png")
    said = [str(warning.message) for warning in caught] + [record.getMessage() for record in caplog.records]
    assert not [line for line in said if "missing" in line.lower()], said
    assert png_dimensions(tmp_path / "cjk.png") == png_size(rows)


def test_colour_scale_ends_and_middle():
    assert z_to_rgb(0.0) == (59, 76, 192)  # template: blue
    assert z_to_rgb(0.5) == (221, 221, 221)  # neutral grey
    assert z_to_rgb(1.0) == (180, 4, 38)  # detail: red
    assert z_to_rgb(-1.0) == z_to_rgb(0.0) and z_to_rgb(2.0) == z_to_rgb(1.0)


def test_figure_grows_with_words_and_layers():
    short = rows_for(["why", "?"])
    long = rows_for([f"w{i}" for i in range(30)])
    with_decoder = rows_for(["why", "?"], ["why", "so", "?"])
    assert figure_size(long)[0] > figure_size(short)[0]
    assert figure_size(with_decoder)[1] > figure_size(short)[1]
    for rows in (short, long, with_decoder):
        width, height = figure_size(rows)
        assert (width * 4).is_integer() and (height * 4).is_integer()  # exact pixel counts


@pytest.mark.parametrize(
    "words, paraphrase",
    [
        (["why", "is", "the", "sky", "blue", "?"], ["why", "so", "?"]),
        (
            ["how", "can", "i", "stop", "procrastinating", "and", "finish", "my", "thesis", "unbelievably", "$5", "?"],
            ["a", "paraphrase", "of", "it"],
        ),
        (["https://example.com/a/very/long/address/indeed", "x"], ["y"]),
        (["x"], ["making" * 30]),  # an untrained model's paraphrase: one endless word, in the panel title too
        (["internationalization", "counterrevolutionaries", "electroencephalography", "x"], ["a"] * 12),  # wraps
    ],
)
def test_figure_text_stays_on_the_page_and_clear_of_other_elements(words, paraphrase):
    """Every label, title and note lies inside the figure, and no word label runs into another panel, the colour
    bar or a title; unrotated labels do not overlap each other; every cell keeps its size."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied": the layout engine gave up
        figure = granularity_figure(rows_for(words, paraphrase))
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
    renderer = canvas.get_renderer()
    page = figure.bbox
    heatmaps, colorbar_axes = figure.axes[:-1], figure.axes[-1]
    for axes in heatmaps:  # a cell per word of the longer sentence, in every panel, so that cells line up
        box = axes.get_window_extent(renderer)
        cell_width, row_height = box.width / max(len(words), len(paraphrase)), box.height / 3
        assert cell_width >= CELL_WIDTH * DPI - 1 and row_height >= ROW_HEIGHT * DPI - 1
    boxes = {}
    for axes in figure.axes:
        for label in [*axes.get_xticklabels(), *axes.get_yticklabels(), axes.title, axes.xaxis.label]:
            if label.get_text():
                boxes[label] = label.get_window_extent(renderer)
    for text in figure.texts:
        boxes[text] = text.get_window_extent(renderer)
    for artist, box in boxes.items():
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, f"{artist.get_text()!r} leaves the page sideways"
        assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, f"{artist.get_text()!r} leaves the page vertically"
    titles = [axes.title for axes in heatmaps] + list(figure.texts) + [colorbar_axes.xaxis.label]
    for axes in heatmaps:
        labels = [label for label in axes.get_xticklabels() if label.get_text()]
        others = [a.get_window_extent(renderer) for a in figure.axes if a is not axes]
        others += [boxes[t] for t in titles if t in boxes and t is not axes.title]
        for label in labels:
            assert not any(boxes[label].overlaps(other) for other in others), f"{label.get_text()!r} collides"
        if labels and labels[0].get_rotation() == 0:
            for left, right in itertools.pairwise(labels):
                assert boxes[left].x1 <= boxes[right].x0 + 1, f"{left.get_text()!r} runs into {right.get_text()!r}"
