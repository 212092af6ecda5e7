"""What a new user hit on a fresh clone: a setting taken for another or ignored, a traceback or lost work where one
line was due, a folder a stopped run left that blocked the rerun, a busy CPU, a model card that left settings out.

Most checks call `parse_args` / `check_arguments` or run.py's `main()` under its command line's `one_line_errors`,
in-process: they stop before any data work, which is what they show; the runs that train use a tiny model for a few
steps."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from cdnpg.data import write_template_corpus
from cdnpg.training import TrainingInterrupted, UsageError, main, one_line_errors, parse_args
from cdnpg.training.arguments import check_arguments
from tests.test_training import TINY, error_line

ROOT = Path(__file__).resolve().parents[1]
AT = TINY.index("--template_sizes")
TINY_FILES = TINY[:AT] + TINY[AT + 4 :]  # the tiny model and schedule, for runs on pair files


def no_data_work(monkeypatch) -> None:
    """Make any data work fail the test: what is checked must stop the run before it."""

    def prepare_data(*args, **kwargs):
        raise AssertionError("data work before the arguments were checked")

    monkeypatch.setattr("cdnpg.training.run.prepare_data", prepare_data)


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


def test_do_eval_false_means_no_evaluation_during_or_after_training():
    """As parsed; a run with --do_eval false that evaluates nowhere: the pair-files run below."""
    _, _, args = parse_args(["--do_train", "--do_eval", "false", "--eval_strategy", "steps", "--eval_steps", "1"])
    assert not args.do_eval and args.eval_strategy == "no" and not args.load_best_model_at_end
    _, _, default = parse_args(["--do_train"])  # left out: the recipe's evaluation every epoch, as before
    assert default.do_eval and default.eval_strategy == "epoch" and default.load_best_model_at_end


def test_early_stopping_without_evaluation_is_refused():
    assert "--early_stopping_patience" in error_line(
        ["--do_train", "--do_eval", "false", "--early_stopping_patience", "2"]
    )


# 4. --train_file without --validation_file -------------------------------------------------------------------------


def test_pair_files_without_a_validation_file_are_one_line_unless_evaluation_is_off(tmp_path):
    files = write_template_corpus(tmp_path / "data", num_train=64, num_valid=8, num_test=8, seed=5)
    output = tmp_path / "out"
    argv = ["--train_file", str(files["train"]), "--output_dir", str(output), "--do_train"]
    line = error_line(argv)
    assert line.startswith("no --validation_file: this run evaluates") and "--do_eval false" in line
    assert error_line([*argv, "--do_eval", "false", "--do_predict"]).startswith("--do_predict needs --test_file")

    # trains, and evaluates nowhere, however often eval_strategy asked for it
    main([*argv, *TINY_FILES, "--max_steps", "2", "--do_eval", "false", "--eval_strategy", "steps", "--eval_steps",
          "1"])  # fmt: skip
    assert (output / "model.safetensors").is_file()
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    assert not any("eval_loss" in entry for entry in history)
    assert not (output / "eval_results.json").exists()


def test_a_missing_data_file_is_named_before_any_data_work(tmp_path):
    missing = tmp_path / "trian.jsonl"
    assert error_line(["--train_file", str(missing), "--do_train"]) == f"--train_file {missing}: no such file"


def test_a_folder_given_for_a_data_file_is_named_a_folder_with_the_file_in_it_before_any_data_work(
    tmp_path, monkeypatch
):
    no_data_work(monkeypatch)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    argv = ["--quora_file", str(downloads), "--do_train", "--output_dir", str(tmp_path / "out")]
    assert error_line(argv) == f"--quora_file {downloads}: is a folder, not a file: give the data file in it"
    (downloads / "quora_duplicate_questions.tsv").write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
    assert error_line(argv) == (
        f"--quora_file {downloads}: is a folder, not a file: give the data file in it, e.g. --quora_file "
        f"{downloads / 'quora_duplicate_questions.tsv'}"
    )
    assert error_line(["--train_file", str(downloads), "--do_train"]).startswith(
        f"--train_file {downloads}: is a folder"
    )
    assert not (tmp_path / "out").exists()


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
    main([*argv, "--max_steps", "1"])
    assert (output / "model.safetensors").is_file()


def test_a_failed_overwrite_keeps_the_earlier_run_as_it_was(tmp_path):
    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "1", "--do_train", "--save_strategy", "no"])
    before = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UsageError, match="no usable pair"):
        main(["--output_dir", str(output), "--overwrite_output_dir", "true", "--train_file", str(empty),
              "--do_eval", "false", *TINY_FILES, "--max_steps", "2", "--do_train"])  # fmt: skip
    after = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    assert after == before
    assert sorted(path.name for path in tmp_path.iterdir()) == [".out.lock", "empty.jsonl", "out"]  # the lock stays


def test_a_model_that_fails_to_build_leaves_an_existing_folder_as_it_was(tmp_path, monkeypatch):
    """A failure after the tokenizer was trained and saved, in a folder that held a file of the user's."""
    output = tmp_path / "out"
    output.mkdir()

    def fail(*args, **kwargs):
        raise UsageError("simulated failure before training")

    monkeypatch.setattr("cdnpg.training.run.build_model", fail)
    with pytest.raises(UsageError, match="simulated"):
        main(["--output_dir", str(output), *TINY, "--max_steps", "2", "--do_train"])
    assert list(output.iterdir()) == []


# 7. A truncated checkpoint ---------------------------------------------------------------------------------------


def test_a_truncated_checkpoint_is_one_line_before_any_data_work(tmp_path, monkeypatch):
    checkpoint = tmp_path / "ckpt"
    main(["--output_dir", str(checkpoint), *TINY, "--max_steps", "1", "--do_train", "--save_strategy", "no"])
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    no_data_work(monkeypatch)
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


# 9. Arguments are checked before any data work -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--copy_mechanism", "bogus", "--do_train"], "copy_mechanism must be one of"),
        (["--max_step", "10", "--do_train"], "unknown flag --max_step; did you mean --max_steps?"),
    ],
)
def test_a_wrong_argument_stops_run_py_in_one_line_before_any_data_work(tmp_path, monkeypatch, argv, error):
    no_data_work(monkeypatch)
    assert error in error_line([*argv, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


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


def test_the_card_of_a_template_corpus_model_says_in_its_first_lines_that_it_is_a_demo_not_for_use():
    from cdnpg.hub import render_model_card
    from tests.conftest import tiny_model

    demo = render_model_card(tiny_model(), "runs/template", demo_corpus=True)
    body = demo.split("\n---\n", 1)[1].strip().splitlines()  # after the Hub's YAML header
    assert body[0] == "# template" and body[2].startswith("> **A demo model, not a paraphraser.**")
    assert "synthetic template corpus" in body[2] + body[3] and "do not use them" in " ".join(body[2:6])
    assert "Checking a cdnpg installation" in demo and "Paraphrasing short English sentences" not in demo
    real = render_model_card(tiny_model(), "someone/model", training_summary="Trained on the local file pairs.jsonl")
    assert "demo model" not in real and "Paraphrasing short English sentences" in real


# 11. Ctrl-C after the progress bar ---------------------------------------------------------------------------------


def test_the_ctrl_c_line_starts_a_line_of_its_own_after_the_progress_bar(tmp_path, monkeypatch, capsys):
    """tqdm leaves the cursor at the end of its bar (no newline): the interrupt line starts a line of its own."""

    def interrupted_mid_bar(*args, **kwargs):
        sys.stderr.write("\r  5%|5         | 5/100 [00:01<00:19,  4.90it/s]")
        raise KeyboardInterrupt

    monkeypatch.setattr("cdnpg.training.run.prepare_data", interrupted_mid_bar)
    with pytest.raises(SystemExit) as stop, one_line_errors():
        main(["--do_train", "--output_dir", str(tmp_path / "out")])  # tqdm on, as by default
    assert stop.value.code == 130
    stderr = capsys.readouterr().err
    bar_end = stderr.index("4.90it/s]") + len("4.90it/s]")
    assert stderr[bar_end] == "\n" and stderr[bar_end + 1 :].split(": ", 1)[1].startswith("interrupted before the")


# 12. Flags checked late, or accepted when wrong --------------------------------------------------------------------


def test_an_output_dir_that_is_a_file_is_one_line_before_any_data_work(tmp_path, monkeypatch):
    no_data_work(monkeypatch)
    regular_file = tmp_path / "regular_file"
    regular_file.write_text("mine")
    line = error_line(["--output_dir", str(regular_file), *TINY, "--do_train"])
    assert line == f"--output_dir {regular_file} is a file, not a folder: choose another --output_dir"
    inside = regular_file / "run"
    line = error_line(["--output_dir", str(inside), *TINY, "--do_train"])
    assert line == f"--output_dir {inside} is inside {regular_file}, a file, not a folder: choose another --output_dir"
    assert regular_file.read_text() == "mine"


@pytest.mark.parametrize("steps", ["-5", "0"])
def test_max_steps_below_one_is_refused_except_transformers_minus_one_for_epochs(steps):
    """transformers reads any max_steps <= 0 as "train num_train_epochs": -5 would train by epochs without a word."""
    line = error_line(["--do_train", "--max_steps", steps, "--output_dir", "unused"])
    assert line == (
        f"--max_steps must be a number of steps above 0, or -1 (the default) to train --num_train_epochs epochs; "
        f"got {steps}"
    )
    _, _, by_epochs = parse_args(["--do_train", "--max_steps", "-1", "--output_dir", "unused"])
    assert by_epochs.max_steps == -1 and by_epochs.num_train_epochs == 30


# 13. The paper's recipe is the default ----------------------------------------------------------------------------


def test_a_flags_only_run_trains_the_papers_recipe_once_it_names_its_stages(tmp_path, monkeypatch):
    """Every setting of training/configs/paper.yaml's recipe is a default, 30 epochs included; as in transformers'
    example scripts, the stages are flags, which paper.yaml sets and a run without them is told to add."""
    no_data_work(monkeypatch)
    line = error_line(["--output_dir", str(tmp_path / "out")])
    assert line.startswith("no --do_train: this run would evaluate and save an untrained model")
    assert "add --do_train (and --do_eval --do_predict" in line and "training/configs/paper.yaml" in line
    recipe = Path(__file__).resolve().parents[1] / "training" / "configs" / "paper.yaml"
    from_file = parse_args([str(recipe), "--output_dir", "unused"])
    from_flags = parse_args(["--do_train", "--do_eval", "--do_predict", "--output_dir", "unused"])
    assert from_file[:2] == from_flags[:2] and from_file[2].to_dict() == from_flags[2].to_dict()
    assert from_flags[2].num_train_epochs == 30 and from_flags[2].max_steps == -1


def test_a_run_without_stage_flags_stops_naming_them_instead_of_saving_an_untrained_model(tmp_path):
    files = write_template_corpus(tmp_path / "data", num_train=64, num_valid=8, num_test=8, seed=5)
    output = tmp_path / "out"
    with pytest.raises(UsageError, match="add --do_train"):
        main(["--max_steps", "2000", "--train_file", str(files["train"]), "--output_dir", str(output)])
    assert not output.exists()


# 14. A run stopped before its first checkpoint leaves the folder as it found it ----------------------------------


class StopAtStep(TrainerCallback):
    """Raise `error` at the end of training step `step`."""

    def __init__(self, step: int, error: BaseException):
        self.step, self.error = step, error

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise self.error


def test_a_run_that_fails_during_training_before_its_first_checkpoint_leaves_no_folder(tmp_path):
    output = tmp_path / "out"
    argv = ["--output_dir", str(output), *TINY, "--max_steps", "4", "--save_steps", "3", "--do_train"]
    with pytest.raises(RuntimeError, match="simulated"):
        main(argv, callbacks=[StopAtStep(2, RuntimeError("simulated failure at step 2"))])
    assert not output.exists()  # the tokenizer it trained is gone: the same command runs again


def test_a_replacing_run_stopped_before_its_first_checkpoint_puts_the_earlier_run_back(tmp_path):
    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "1", "--do_train", "--save_strategy", "no"])
    before = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    argv = ["--output_dir", str(output), *TINY, "--max_steps", "4", "--save_steps", "3", "--do_train",
            "--overwrite_output_dir", "true", "--template_sizes", "200", "8", "8"]  # fmt: skip
    with pytest.raises(TrainingInterrupted, match="interrupted before the first checkpoint"):
        main(argv, callbacks=[StopAtStep(2, KeyboardInterrupt())])
    after = {path.relative_to(output): path.read_bytes() for path in output.rglob("*") if path.is_file()}
    assert after == before
    assert sorted(path.name for path in tmp_path.iterdir()) == [".out.lock", "out"]  # the empty lock file stays


def test_kill_stops_a_run_as_ctrl_c_does():
    """`kill` (SIGTERM) raises what Ctrl-C raises, so that the folder is put back and the line names the checkpoint;
    Python's default ends the process where it stands."""
    from cdnpg.training.output_dir import terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives first
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_folder_that_holds_only_a_killed_runs_tokenizer_is_named_with_the_command_to_run_again(tmp_path):
    """`kill -9` leaves the tokenizer a run saved before training, and no checkpoint: the refusal says so and gives the
    command."""
    output = tmp_path / "out"
    (output / "tokenizer").mkdir(parents=True)
    argv = ["training/configs/template_cpu.yaml", "--output_dir", str(output)]
    line = error_line(argv)
    assert line.startswith(
        f"--output_dir {output} holds only the tokenizer of a run stopped before its first checkpoint (nothing to "
        "resume). Run again, replacing it: "
    )
    python, *command = shlex.split(line.split("replacing it: ")[1])
    assert Path(python).resolve() == Path(sys.executable).resolve()  # this Python, relative to here if inside
    assert command == [sys.argv[0], *argv, "--overwrite_output_dir", "true"]


# 15. A busy CPU ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "default, cores, busy, threads",
    [(2, 2, 0, 2), (2, 2, 1, 1), (2, 2, 5, 1), (8, 16, 4, 8), (8, 16, 12, 4), (4, 4, None, 4)],
)
def test_training_on_a_cpu_takes_the_cores_other_processes_leave_free(default, cores, busy, threads):
    """torch's default threads on an idle machine; one thread fewer for each core other processes keep busy, at
    least one (OpenMP threads wait for a busy core at every operation: 6x slower beside one busy loop on 2 cores)."""
    from cdnpg.training import cpu_threads

    assert cpu_threads(default, cores, busy) == threads


def test_the_busy_cores_are_the_running_threads_of_other_processes_at_this_priority_or_above(tmp_path):
    from cdnpg.training.checks import busy_cores

    def thread(pid: int, tid: int, state: str, nice: int) -> None:
        folder = tmp_path / str(pid) / "task" / str(tid)
        folder.mkdir(parents=True)
        fields = [state, *["0"] * 15, str(nice), "1", "0"]  # proc(5): state is field 3, niceness field 19
        (folder / "stat").write_text(f"{tid} (python -c while True) " + " ".join(fields) + "\n")

    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text("")
    own, nice = os.getpid(), os.nice(0)
    thread(own, own, "R", nice)  # this process and its OpenMP workers: never counted
    thread(own, own + 1, "R", nice)
    thread(1, 1, "R", nice)  # another process running at this priority, on two threads
    thread(1, 2, "R", nice - 1)
    thread(2, 2, "S", nice)  # sleeping
    thread(3, 3, "R", nice + 5)  # running at a lower priority: it yields its core
    assert busy_cores(samples=3, proc=tmp_path) == 2
    assert busy_cores(samples=1, proc=tmp_path / "absent") is None


def test_a_busy_cpu_is_said_in_one_line_and_trained_on_fewer_threads_unless_omp_num_threads_is_set(
    monkeypatch, caplog
):
    from cdnpg.training import checks

    args = parse_args(["--do_train", "--use_cpu", "true", "--output_dir", "unused"])[2]
    monkeypatch.setattr(checks, "busy_cores", lambda: len(os.sched_getaffinity(0)))  # every core busy
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: chosen.append(threads))
    chosen = []
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    checks.choose_cpu_threads(args)
    assert chosen == []  # the user's choice
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with caplog.at_level("WARNING", logger="cdnpg.training"):
        checks.choose_cpu_threads(args)
    assert chosen == [1]
    (line,) = [record.getMessage() for record in caplog.records]
    cores = len(os.sched_getaffinity(0))
    assert (
        line == f"other processes keep {cores} of {cores} cores busy: training on 1 thread (OMP_NUM_THREADS chooses)"
    )


# 16. Two runs into one folder -------------------------------------------------------------------------------------


def test_a_run_into_a_folder_another_run_holds_is_refused_naming_that_run_before_any_data_work(tmp_path, monkeypatch):
    from cdnpg.training.output_dir import output_dir_lock

    no_data_work(monkeypatch)
    output = tmp_path / "out"
    with output_dir_lock(output, ["training/run.py", "recipe.yaml"]):
        line = error_line(["--do_train", "--output_dir", str(output), *TINY])
    assert line.startswith(f"--output_dir {output} is in use by another run (process {os.getpid()} on ")
    assert f" on {socket.gethostname()}, since " in line and ": training/run.py recipe.yaml)" in line
    assert line.endswith("wait until it ends, or choose another --output_dir")
    assert not output.exists()


def test_two_runs_started_together_into_one_folder_leave_one_run_and_refuse_the_other(tmp_path):
    output = tmp_path / "out"
    command = [sys.executable, str(ROOT / "training" / "run.py"), "--do_train", "--output_dir", str(output), *TINY]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = [
        subprocess.Popen(
            [*command, "--max_steps", str(steps), "--seed", str(seed)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for steps, seed in ((6, 0), (4, 1))
    ]
    ended = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    assert sorted(code for code, _ in ended) == [0, 1], [log[-2000:] for _, log in ended]
    (refused,) = [log for code, log in ended if code == 1]
    # refused while the other run holds the folder (named, or "a process that is starting" in the moment between
    # taking the lock and writing its note), or, on a slow machine, after it finished there
    assert re.search(r"is in use by another run \((process |a process that is starting\))|is not empty \(",
                     refused.splitlines()[-1])  # fmt: skip
    (finished,) = [runs[i] for i, (code, _) in enumerate(ended) if code == 0]
    steps = 6 if finished is runs[0] else 4  # the folder holds the finished run's model and nothing of the other's
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == steps
    checkpoints = [int(path.name.removeprefix("checkpoint-")) for path in output.glob("checkpoint-*")]
    assert max(checkpoints) == steps and all(
        json.loads((output / f"checkpoint-{step}" / "trainer_state.json").read_text())["max_steps"] == steps
        for step in checkpoints
    )


def test_an_output_dir_whose_lock_cannot_be_written_is_one_line_naming_the_lock():
    from cdnpg.training.output_dir import output_dir_lock

    with pytest.raises(UsageError) as error, output_dir_lock("/proc/cdnpg/out"):  # /proc takes no new folder
        pass
    assert str(error.value).startswith("--output_dir /proc/cdnpg/out: cannot write its lock /proc/cdnpg/.out.lock: ")


def test_a_lock_held_by_a_process_killed_with_kill_9_does_not_block_the_next_run(tmp_path):
    from cdnpg.training.output_dir import output_dir_lock

    output = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cdnpg.training.output_dir import output_dir_lock\n"
         f"with output_dir_lock({str(output)!r}):\n    print('held', flush=True); time.sleep(120)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=f"process {holder.pid} on "), output_dir_lock(output):
            pass
    finally:
        holder.kill()  # SIGKILL: no clean-up runs in the holder
        holder.communicate()
    with output_dir_lock(output):  # the kernel released the dead process's lock
        pass


# 17. Noise on every CPU run ---------------------------------------------------------------------------------------


def test_a_run_on_a_machine_without_a_gpu_pins_no_memory_unless_asked(monkeypatch):
    monkeypatch.setattr("cdnpg.training.arguments.no_accelerator", lambda: True)
    recipe = str(ROOT / "training" / "configs" / "paper.yaml")
    assert not parse_args([recipe])[2].dataloader_pin_memory
    assert parse_args([recipe, "--dataloader_pin_memory", "true"])[2].dataloader_pin_memory
    monkeypatch.setattr("cdnpg.training.arguments.no_accelerator", lambda: False)
    assert parse_args([recipe])[2].dataloader_pin_memory  # a GPU's copies gain from it


def test_a_small_file_is_read_without_a_progress_bar(tmp_path, capfd):
    from cdnpg.data import load_pair_files, prepare_quora
    from tests.test_training import quora_file

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("source\ttarget\nhow do i learn python ?\thow can i learn python ?\n")
    load_pair_files({"train": str(pairs)})
    prepare_quora(quora_file(tmp_path / "quora.tsv", duplicates=20), train_size=None, valid_size=2, test_size=2)
    assert "reading" not in capfd.readouterr().err


def test_a_run_ends_with_a_line_naming_the_demo_command_for_its_model(tmp_path, capsys):
    output = tmp_path / "out"
    main(["--output_dir", str(output), *TINY, "--max_steps", "1", "--do_train", "--save_strategy", "no"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"Try the model on a page: cdnpg demo --model {output} (pip install -e '.[demo]' first)"
