"""`cdnpg augment` and `cdnpg.augment`: a dataset's rows paraphrased through the model's pipeline, into a folder that
`datasets.load_dataset` reads back in input order; the same from 2 processes and from 2 machine ranks over
127.0.0.1; resumed after `kill -9` without touching what was written; refused, in one line and with nothing written,
for another run's folder, a folder in use and each kind of bad input.

One tiny random model (tests/test_cli.py's) and 30 rows serve every test; the subprocess tests share one
uninterrupted run as the reference."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import Dataset, load_dataset
from huggingface_hub import constants
from transformers import AutoTokenizer, pipeline

from cdnpg.augment import MANIFEST, augment, shard_path
from cdnpg.cli import main
from cdnpg.errors import InputError
from cdnpg.inference import new_tokens
from cdnpg.training.output_dir import lock_files
from tests.conftest import relaunched_on_gloo_teardown_abort, two_machine_ranks
from tests.test_cli import CORPUS, save_tiny, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
LONG = " ".join(CORPUS[:4])  # over the paper's 20 tokens: its paraphrase may be longer, so it is batched apart
ROWS = 30
CHUNK = 2  # 15 shards: more than 10, so that their order is more than one digit's
SETTINGS = ["--novelty", "0.5", "-n", "2", "--batch-size", "4"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}


def text_of(index: int) -> str | None:
    """Sentences of several lengths, one long; an empty, a blank and a null one."""
    if index in (5, 6, 7):
        return {5: "", 6: "   ", 7: None}[index]
    return LONG if index == 11 else CORPUS[index % len(CORPUS)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("augment") / "tiny", train_tokenizer())


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [{"id": index, "text": text_of(index), "label": index % 3} for index in range(ROWS)]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, rows) -> Path:
    path = tmp_path_factory.mktemp("data") / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def command(model_dir: Path, data: Path, output: Path, *extra: str) -> list[str]:
    return ["augment", "--model", str(model_dir), "--data", str(data), "--column", "text", "--output-dir",
            str(output), "--chunk-size", str(CHUNK), *SETTINGS, *extra]  # fmt: skip


def run_module(args: list[str], launcher: list[str] | None = None, **options) -> subprocess.CompletedProcess:
    """`python -m cdnpg.cli ARGS` in a fresh process, or under `launcher` (accelerate launch ... -m cdnpg.cli ARGS)."""
    start = launcher or [sys.executable]
    return subprocess.run([*start, "-m", "cdnpg.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=ENV, **options)  # fmt: skip


def read_back(output: Path) -> Dataset:
    return load_dataset(str(output), split="train")


def shard_states(output: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each shard's inode, modification time and bytes."""
    return {path.name: (path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted((output / "data").glob("*.parquet"))}  # fmt: skip


# The relative tolerance of a score computed in another process, or in a batch padded otherwise (another batch size,
# the pipeline's one row at a time): float32 rounding in another summation order moves its seventh digit.
ANOTHER_COMPUTATION = 1e-5


def assert_same_rows(found: list[dict], expected: list[dict]) -> None:
    """The same rows, paraphrases and all, in the same order, with the same scores to `ANOTHER_COMPUTATION`."""

    def apart(rows: list[dict]) -> tuple[list[dict], list[float]]:
        kept = [{key: value for key, value in row.items() if key != "scores"} for row in rows]
        return kept, [score for row in rows for score in row["scores"] or []]

    (rows, scores), (expected_rows, expected_scores) = apart(found), apart(expected)
    assert rows == expected_rows
    assert scores == pytest.approx(expected_scores, rel=ANOTHER_COMPUTATION)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, model_dir, data_file) -> dict:
    """The command on one process, uninterrupted: the reference of the launches and the resumed run."""
    output = tmp_path_factory.mktemp("single") / "out"
    result = run_module(command(model_dir, data_file, output))
    assert result.returncode == 0, result.stderr[-3000:]
    return {"output": output, "stderr": result.stderr, "dataset": read_back(output)}


def test_each_row_gets_what_the_pipeline_returns_for_its_text(model_dir, rows):
    """The library function on a Dataset, against `pipeline("text2text-generation", ...)` row by row with the same
    settings: novelty's ranked candidates with scores, and the model's own beam search (no scores)."""
    paraphraser = pipeline("text2text-generation", model=str(model_dir), trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(rows[:16])  # the long row and the blank ones among them
    for settings in ({"novelty": 0.5, "num_return_sequences": 2}, {"num_return_sequences": 2, "num_beams": 3}):
        result = augment(dataset, str(model_dir), "text", batch_size=4, keep_in_memory=True, **settings)
        assert result.column_names == ["id", "text", "label", "paraphrases", "scores"]
        assert result.select_columns(["id", "text", "label"]).to_list() == rows[:16]
        for row in result:
            if not (row["text"] or "").strip():
                assert row["paraphrases"] == [] and row["scores"] in ([], None)
                continue
            length = len(tokenizer(row["text"])["input_ids"]) - tokenizer.num_special_tokens_to_add()
            expected = paraphraser(row["text"], max_new_tokens=new_tokens(paraphraser.model, length), **settings)
            assert row["paraphrases"] == [" ".join(found["generated_text"].split()) for found in expected], row["id"]
            if "novelty" in settings:
                assert row["scores"] == pytest.approx([found["score"] for found in expected], rel=ANOTHER_COMPUTATION)
            else:
                assert row["scores"] is None
        assert any(len(row["paraphrases"]) == 2 for row in result)


def test_an_iterable_dataset_is_paraphrased_as_it_is_read_as_a_dataset_is(model_dir, rows):
    dataset = Dataset.from_list(rows[:12])
    settings = {"novelty": 0.5, "num_return_sequences": 2, "batch_size": 4}
    streamed = augment(dataset.to_iterable_dataset(), str(model_dir), "text", **settings)
    assert list(streamed) == augment(dataset, str(model_dir), "text", keep_in_memory=True, **settings).to_list()
    with pytest.raises(InputError, match="--column question: no such column; the data has id, text, label"):
        augment(dataset, str(model_dir), "question")


@pytest.mark.slow
@pytest.mark.xdist_group("serial")  # on the worker of the launches below, which runs `single_run` for them
def test_the_command_writes_a_dataset_that_load_dataset_reads_back_in_input_order(single_run, model_dir, rows):
    """15 shards read back as one dataset: every row and column in input order, the paraphrases the library adds, one
    warning counting the empty, blank and null rows, and a last line saying how to load and push it."""
    dataset = single_run["dataset"]
    assert dataset.select_columns(["id", "text", "label"]).to_list() == rows
    assert len(list((single_run["output"] / "data").glob("*.parquet"))) == 15
    library = augment(Dataset.from_list(rows), str(model_dir), "text", novelty=0.5, num_return_sequences=2,
                      batch_size=4, keep_in_memory=True)  # fmt: skip
    assert_same_rows(dataset.to_list(), library.to_list())
    lines = single_run["stderr"].strip().splitlines()
    assert "cdnpg: warning: 3 rows have an empty, blank or null text: they get no paraphrases" in lines
    assert "datasets.load_dataset(" in lines[-1] and "push_to_hub" in lines[-1]
    assert sum("10%" in line or "100%" in line for line in lines) >= 1  # stderr is no terminal: a line per tenth
    manifest = json.loads((single_run["output"] / MANIFEST).read_text())
    assert manifest["rows"] == ROWS and manifest["chunk_size"] == CHUNK and manifest["column"] == "text"


@pytest.mark.slow
@pytest.mark.serial
def test_two_processes_write_what_one_process_writes(single_run, model_dir, data_file, tmp_path):
    output = tmp_path / "two"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--main_process_port", "0"]  # fmt: skip
    result = relaunched_on_gloo_teardown_abort(
        lambda: run_module(command(model_dir, data_file, output), launcher), output
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_rows(read_back(output).to_list(), single_run["dataset"].to_list())
    assert result.stderr.count("datasets.load_dataset(") == 1  # the main process's last line only


@pytest.mark.slow
@pytest.mark.serial
def test_two_machine_ranks_over_loopback_write_what_one_process_writes(single_run, model_dir, data_file, tmp_path):
    """docs/augment.md's several-machine launch, both machines on this one, sharing the output folder."""
    output = tmp_path / "machines"
    machines = two_machine_ranks(["-m", "cdnpg.cli", *command(model_dir, data_file, output)], ENV, output)
    assert [machine.returncode for machine in machines] == [0, 0], [machine.stderr[-3000:] for machine in machines]
    assert_same_rows(read_back(output).to_list(), single_run["dataset"].to_list())


@pytest.mark.slow
@pytest.mark.serial
def test_a_run_killed_midway_and_run_again_ends_as_an_uninterrupted_run_with_its_shards_untouched(
    single_run, model_dir, data_file, tmp_path
):
    output = tmp_path / "killed"
    args = [sys.executable, "-m", "cdnpg.cli", *command(model_dir, data_file, output), "--batch-size", "1"]
    process = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list((output / "data").glob("*.parquet"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    before = shard_states(output)
    assert 3 <= len(before) < 15, "the run was killed after its third shard and before its last"
    result = run_module(command(model_dir, data_file, output, "--batch-size", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    after = shard_states(output)
    assert {name: after[name] for name in before} == before  # the same files: inode, time and bytes
    assert len(after) == 15 and not list((output / "data").glob(".*"))  # no temporary file left
    assert_same_rows(read_back(output).to_list(), single_run["dataset"].to_list())  # batch size 1 against 4


def error_of(capsys, argv: list[str]) -> str:
    """The one line `cdnpg ARGV` stops with (exit code 1), in this process."""
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("cdnpg: error: ")]
    assert len(errors) == 1, lines
    return errors[0].removeprefix("cdnpg: error: ")


def test_a_run_with_other_settings_is_refused_naming_the_difference_and_the_folder_is_left_alone(
    capsys, model_dir, data_file, tmp_path
):
    output = tmp_path / "out"
    assert main(command(model_dir, data_file, output, "--max-rows", "4")) == 0
    before, manifest = shard_states(output), (output / MANIFEST).read_text()
    capsys.readouterr()
    error = error_of(capsys, command(model_dir, data_file, output, "--max-rows", "4", "--novelty", "0.25"))
    assert "holds the shards of another run" in error and '"novelty": 0.5' in error and '"novelty": 0.25' in error
    error = error_of(capsys, command(model_dir, data_file, output, "--max-rows", "4", "--chunk-size", "3"))
    assert "chunk_size was 2, now 3" in error
    assert shard_states(output) == before and (output / MANIFEST).read_text() == manifest
    assert main(command(model_dir, data_file, output, "--max-rows", "4")) == 0  # the same command: nothing to do
    assert shard_states(output) == before


def test_a_second_run_into_a_folder_in_use_is_refused(capsys, model_dir, data_file, tmp_path):
    """A run holding the folder's lock (training's, in another process) refuses this one, which writes nothing."""
    output = tmp_path / "busy"
    lock = lock_files(output)[0]  # training's lock of the folder, held by a process of its own
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time\nfrom filelock import FileLock\nwith FileLock({str(lock)!r}):\n"
         "    print('held', flush=True)\n    time.sleep(300)"], env=ENV, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        error = error_of(capsys, command(model_dir, data_file, output))
    finally:
        holder.kill()
        holder.wait()
    assert error.startswith(f"--output-dir {output} is in use by another run (")
    assert not output.exists()


def test_bad_input_is_one_line_and_writes_nothing(capsys, monkeypatch, model_dir, data_file, tmp_path):
    output = tmp_path / "out"

    def refused(*extra: str, data: Path | str = data_file, column: str = "text", out: Path = output) -> str:
        argv = ["augment", "--model", str(model_dir), "--data", str(data), "--column", column, "--output-dir",
                str(out), *extra]  # fmt: skip
        error = error_of(capsys, argv)
        assert not output.exists()
        return error

    assert refused(column="question") == "--column question: no such column; the data has id, text, label"
    splits = tmp_path / "splits"
    splits.mkdir()
    for name in ("train", "test"):
        (splits / f"{name}.jsonl").write_text(data_file.read_text())
    assert refused(data=splits) == f"--data {splits} has several splits (train, test): choose one with --split"
    assert refused("--split", "valid", data=splits) == f"--split valid: --data {splits} has train, test"
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text\ncaf\xe9 au lait ?\n".encode("latin-1"))
    assert refused(data=latin).startswith(f"--data {latin}: not UTF-8 text (byte 8: ")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 sets it
    assert refused(data="someone/questions").startswith("--data someone/questions: no such file or folder, and the "
                                                        "Hub is switched off (HF_HUB_OFFLINE)")  # fmt: skip
    assert refused(data=tmp_path / "missing.jsonl") == f"--data {tmp_path / 'missing.jsonl'}: no such file or folder"
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert refused(out=a_file) == f"--output-dir {a_file} is a file, not a folder: choose another --output-dir"
    if os.access("/sys", os.W_OK) and not Path("/sys").is_mount():
        pytest.skip("/sys is writable here")
    assert refused(out=Path("/sys/augmented")).startswith("--output-dir /sys/augmented: cannot write in /sys")


def test_a_hub_dataset_id_with_the_hub_unreachable_is_one_line(model_dir, tmp_path):
    output = tmp_path / "out"
    env = {**ENV, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "1",
           "HF_HOME": str(tmp_path / "hf")}  # fmt: skip
    args = ["augment", "--model", str(model_dir), "--data", "someone/questions", "--column", "text", "--output-dir",
            str(output)]  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "cdnpg.cli", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=env)  # fmt: skip
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("cdnpg: error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith(
        "cdnpg: error: --data someone/questions: no such file or folder, and as a Hub dataset id: the Hub "
        "(http://127.0.0.1:9) cannot be reached"
    ), errors
    assert not output.exists()


def test_shards_are_named_in_input_order():
    names = [shard_path(Path("out"), chunk, 12).name for chunk in range(12)]
    assert names == sorted(names) and names[0] == "train-00000-of-00012.parquet"


def test_the_library_sits_below_the_command_line():
    """No import in cdnpg/augment.py, at its top or inside a function, names cdnpg.commands or cdnpg.cli."""
    tree = ast.parse((ROOT / "cdnpg" / "augment.py").read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "cdnpg.inference" in names and not {"cdnpg.commands", "cdnpg.cli", "cdnpg"} & names


def test_processes_launched_but_not_connected_count_as_a_launch_that_augment_refuses(monkeypatch):
    """A launcher's WORLD_SIZE of 2 with one process each (accelerate without --multi_gpu on CPUs) is what augment
    refuses, as training does: each process would paraphrase every row into the same folder."""
    from cdnpg.training.checks import unconnected_processes

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert unconnected_processes(1) == 0
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (unconnected_processes(1), unconnected_processes(2)) == (2, 0)
