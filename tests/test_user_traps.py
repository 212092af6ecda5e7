"""What a new user hit on a fresh clone (issue 41): a setting taken for another or ignored, a traceback or lost work
where one line was due, a model card that left settings out. Each test fails on the code before the fix.

Most checks call `parse_args` / `check_arguments` or run.py's `cli()` in-process: they stop before any data work,
which is what they show; the runs that train use a tiny model for a few steps."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cdnpg.data import write_template_corpus
from cdnpg.training import UsageError, main, parse_args
from cdnpg.training.arguments import check_arguments
from cdnpg.training.entry import cli
from tests.test_training import TINY

ROOT = Path(__file__).resolve().parents[1]
AT = TINY.index("--template_sizes")
TINY_FILES = TINY[:AT] + TINY[AT + 4 :]  # the tiny model and schedule, for runs on pair files


def error_line(argv: list[str]) -> str:
    """The one line run.py's command line stops with (its message, as the shell prints it after 'run.py: error:')."""
    with pytest.raises(SystemExit) as stop:
        cli(argv)
    message = str(stop.value.code)
    assert "\n" not in message and ": error: " in message, message
    return message.split(": error: ", 1)[1]


def parse_and_check(argv: list[str]):
    arguments = parse_args(argv)
    check_arguments(*arguments)
    return arguments


# 1. argparse's prefix matching took a typo for another setting -----------------------------------------------------


@pytest.mark.parametrize("key, nearest", [("max_step", "max_steps"), ("learning_rat", "learning_rate")])
def test_a_yaml_key_that_is_a_prefix_of_a_real_one_is_refused_naming_both(tmp_path, key, nearest):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{key}: 10\ndo_train: true\n")
    with pytest.raises(UsageError) as error:
        parse_args([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert str(error.value) == f"unknown key {key!r} in {recipe}; did you mean {nearest!r}?"


@pytest.mark.parametrize("flag", ["--max_step", "--max_step=10"])
def test_a_command_line_flag_that_is_a_prefix_of_a_real_one_is_refused_naming_both(flag):
    argv = [flag, "10"] if "=" not in flag else [flag]
    with pytest.raises(UsageError) as error:
        parse_args([*argv, "--do_train"])
    assert str(error.value) == "unknown flag --max_step; did you mean --max_steps?"


def test_real_flags_still_parse_in_full_and_as_the_yaml_gives_them(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 7\ndo_train: true\ntemplate_sizes: [10, 2, 2]\n")
    _, data_args, training_args = parse_args([str(recipe), "--learning_rate", "0.01"])
    assert training_args.max_steps == 7 and training_args.learning_rate == 0.01
    assert data_args.template_sizes == [10, 2, 2]


def test_a_stray_value_and_a_bad_value_are_one_line_each():
    assert error_line(["--do_train", "--max_steps", "3", "4"]) == "unexpected value '4': give it to a flag"
    assert "argument --max_steps" in error_line(["--do_train", "--max_steps", "ten"])


# 2. --do_eval false ------------------------------------------------------------------------------------------------


def test_do_eval_false_means_no_evaluation_during_or_after_training(tmp_path):
    _, _, args = parse_args(["--do_train", "--do_eval", "false", "--eval_strategy", "steps", "--eval_steps", "1"])
    assert not args.do_eval and args.eval_strategy == "no" and not args.load_best_model_at_end
    _, _, default = parse_args(["--do_train"])  # left out: the recipe's evaluation every epoch, as before
    assert default.do_eval and default.eval_strategy == "epoch" and default.load_best_model_at_end

    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train", "--do_eval", "false",
          "--eval_strategy", "steps", "--eval_steps", "1"])  # fmt: skip
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    assert not any("eval_loss" in entry for entry in history)
    assert not (output / "eval_results.json").exists()


def test_early_stopping_without_evaluation_is_refused():
    assert "--early_stopping_patience" in error_line(
        ["--do_train", "--do_eval", "false", "--early_stopping_patience", "2"]
    )


# 4. --train_file without --validation_file -------------------------------------------------------------------------


def test_pair_files_without_a_validation_file_are_one_line_unless_evaluation_is_off(tmp_path):
    files = write_template_corpus(tmp_path / "data", num_train=64, num_valid=8, num_test=8, seed=5)
    argv = ["--train_file", str(files["train"]), "--output_dir", str(tmp_path / "out"), "--do_train"]
    line = error_line(argv)
    assert line.startswith("no --validation_file: this run evaluates") and "--do_eval false" in line
    assert error_line([*argv, "--do_eval", "false", "--do_predict"]).startswith("--do_predict needs --test_file")

    main([*argv, *TINY_FILES, "--max_steps", "2", "--do_eval", "false"])  # trains, without evaluation
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_missing_data_file_is_named_before_any_data_work(tmp_path):
    missing = tmp_path / "trian.jsonl"
    assert error_line(["--train_file", str(missing), "--do_train"]) == f"--train_file {missing}: no such file"


# 5 and 6. An empty file; a failed run leaves the output folder as it found it -------------------------------------


def test_an_empty_training_file_is_one_line_naming_it_and_leaves_no_folder_behind(tmp_path):
    files = write_template_corpus(tmp_path / "data", num_train=64, num_valid=8, num_test=8, seed=5)
    files["train"].write_text("")
    output = tmp_path / "out"
    argv = ["--train_file", str(files["train"]), "--validation_file", str(files["valid"]), "--output_dir",
            str(output), *TINY_FILES, "--max_steps", "2", "--do_train"]  # fmt: skip
    with pytest.raises(UsageError) as error:
        main(argv)
    assert str(error.value).startswith(f"--train_file {files['train']}: no usable pair in the train split")
    assert not output.exists()  # no tokenizer left: the rerun with the data fixed is not refused
    write_template_corpus(tmp_path / "data", num_train=64, num_valid=8, num_test=8, seed=5)
    main(argv)
    assert (output / "model.safetensors").is_file()


def test_a_failed_overwrite_keeps_the_earlier_run_as_it_was(tmp_path):
    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train", "--save_strategy", "no"])
    before = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UsageError, match="no usable pair"):
        main(["--output_dir", str(output), "--overwrite_output_dir", "true", "--train_file", str(empty),
              "--do_eval", "false", *TINY_FILES, "--max_steps", "2", "--do_train"])  # fmt: skip
    after = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    assert after == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.jsonl", "out"]  # nothing left beside it


def test_a_model_that_fails_to_build_leaves_an_existing_folder_as_it_was(tmp_path, monkeypatch):
    """A failure after the tokenizer was trained and saved, in a folder that held a file of the user's."""
    output = tmp_path / "out"
    output.mkdir()

    def fail(*args, **kwargs):
        raise UsageError("simulated failure before training")

    monkeypatch.setattr("cdnpg.training.pipeline.build_model", fail)
    with pytest.raises(UsageError, match="simulated"):
        main(["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train"])
    assert list(output.iterdir()) == []


# 7. A truncated checkpoint ---------------------------------------------------------------------------------------


def test_a_truncated_checkpoint_is_one_line_before_any_data_work(tmp_path, monkeypatch):
    checkpoint = tmp_path / "ckpt"
    main(["--output_dir", str(checkpoint), *TINY, "--max_steps", "1", "--do_train", "--save_strategy", "no"])
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    def no_data_work(*args, **kwargs):
        raise AssertionError("data work before the checkpoint was checked")

    monkeypatch.setattr("cdnpg.training.pipeline.prepare_data", no_data_work)
    output = tmp_path / "out"
    line = error_line(["--model_name_or_path", str(checkpoint), "--do_predict", "--output_dir", str(output)])
    assert line.startswith(f"--model_name_or_path {checkpoint}: cannot load it:")
    assert not output.exists()


# 8. --bf16 without a GPU -----------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="implied only where there is no GPU")
def test_bf16_without_a_gpu_trains_on_the_cpu_instead_of_stopping():
    _, _, args = parse_args(["--do_train", "--bf16", "true", "--output_dir", "unused"])
    assert args.bf16 and args.use_cpu and args.device.type == "cpu"
    _, _, plain = parse_args(["--do_train", "--output_dir", "unused"])
    assert not plain.use_cpu  # only --bf16 implies it


# 9. Arguments are checked before the pipeline's imports and data work ------------------------------------------------


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--copy_mechanism", "bogus", "--do_train"], "copy_mechanism must be one of"),
        (["--max_step", "10", "--do_train"], "unknown flag --max_step; did you mean --max_steps?"),
    ],
)
def test_a_wrong_argument_stops_run_py_before_datasets_and_evaluate_are_imported(tmp_path, argv, error):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "training" / "run.py"), *argv, "--output_dir",
         str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert line.startswith("run.py: error: ") and error in line
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert "datasets" not in imported and "evaluate" not in imported  # the pipeline's imports, before any data


# 10. The model card ----------------------------------------------------------------------------------------------


def test_the_card_of_a_copy_run_in_both_directions_says_so(tmp_path):
    import transformers

    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train", "--save_strategy", "no",
          "--copy_mechanism", "learned", "--copy_common_tokens", "5", "--both_directions", "true"])  # fmt: skip
    card = (output / "README.md").read_text()
    assert "| copy_mechanism | learned |" in card
    assert "| copy_excluded_token_ids (--copy_common_tokens) | 5 token ids never copied |" in card
    doubled = re.search(r"([\d,]+) train \(each pair also reversed: --both_directions\)", card)
    assert doubled and 256 < int(doubled[1].replace(",", "")) <= 512  # a reverse already among the pairs is not added
    assert f"(this checkpoint was saved with {transformers.__version__})" in card.replace("\n", " ")
    assert "x 1 device (one process)" in card


def test_the_card_of_a_model_without_copy_says_it_does_not_copy(tmp_path):
    from cdnpg.hub import render_model_card
    from tests.conftest import tiny_model

    card = render_model_card(tiny_model(), "someone/model")
    assert "| copy_mechanism | none (no copying) |" in card and "copy_excluded_token_ids" not in card


# 11. Ctrl-C after the progress bar ---------------------------------------------------------------------------------


def test_the_ctrl_c_line_starts_a_line_of_its_own_after_the_progress_bar(tmp_path, monkeypatch, capsys):
    """tqdm leaves the cursor at the end of its bar (no newline): the interrupt line was glued to it."""

    def interrupted_mid_bar(*args, **kwargs):
        sys.stderr.write("\r  5%|5         | 5/100 [00:01<00:19,  4.90it/s]")
        raise KeyboardInterrupt

    monkeypatch.setattr("cdnpg.training.pipeline.run", interrupted_mid_bar)
    with pytest.raises(SystemExit) as stop:
        cli(["--do_train", "--output_dir", str(tmp_path / "out")])  # tqdm on, as by default
    assert stop.value.code == 130
    stderr = capsys.readouterr().err
    bar_end = stderr.index("4.90it/s]") + len("4.90it/s]")
    assert stderr[bar_end] == "\n" and stderr[bar_end + 1 :].split(": ", 1)[1].startswith("interrupted before the")
