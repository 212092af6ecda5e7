"""Several processes through `accelerate launch`, as users start them: 2 CPU processes (gloo) run every stage (train,
evaluate, predict) and give what one process gives, eager and compiled alike; processes that accelerate did not
connect are refused instead of each training alone into the same folder.

Two launches serve every assertion: `ddp_runs` trains eagerly and compiled, each on 2 processes, beside one run on a
single process with the same examples per step; two machine ranks over loopback train what the eager launch trains."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cdnpg.training import main
from tests.conftest import relaunched_on_gloo_teardown_abort, two_machine_ranks
from tests.test_training import ROOT, TINY, run

DDP_WRAPPER_BREAK = re.compile(
    r"DistributedDataParallel\._inside_ddp_forward|`set_runtime_stats_and_log` of class `Logger`"
)
ARCHITECTURE = {"--d_model", "--layers", "--attention_heads", "--ffn_dim", "--vocab_size", "--dropout"}

DDP_CONFIG = ROOT / "training" / "configs" / "accelerate" / "ddp.yaml"
FSDP_CONFIG = ROOT / "training" / "configs" / "accelerate" / "fsdp.yaml"
# 20 test pairs in batches of 3 per process: 7 batches, so the processes get 4 and 3 of them, the last one short
STAGES = ["--do_train", "--do_eval", "--do_predict", "--template_sizes", "256", "12", "20",
          "--per_device_eval_batch_size", "3", "--generation_num_beams", "2"]  # fmt: skip


def launch(config: Path, argv: list[str], check: bool = True):
    """`accelerate launch --config_file CONFIG tests/run_probe.py ARGV` (run.py with the probe's callbacks)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                "--main_process_port", "0"]  # fmt: skip
    output = Path(argv[argv.index("--output_dir") + 1])
    result = relaunched_on_gloo_teardown_abort(lambda: run(argv, launcher=launcher, check=False), output)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in metrics.items() if not key.endswith(("runtime", "per_second", "_time"))}


def results(folder: Path, split: str) -> dict[str, float]:
    return json.loads((folder / f"{split}_results.json").read_text())


def logged_losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """Every stage, 4 steps of 16 examples: on one process (`single`), and on 2 processes of 8 each, eagerly
    (`eager`: the shipped fsdp.yaml, which accelerate trains as DDP on CPUs) and compiled (`compiled`: ddp.yaml)."""
    folder = tmp_path_factory.mktemp("ddp")
    common = [*TINY, *STAGES, "--tokenizer_name", tokenizer_dir, "--use_cpu", "True", "--max_steps", "4",
              "--granularity_mask", "product"]  # fmt: skip
    main(["--output_dir", str(folder / "single"), *common, "--per_device_train_batch_size", "16"])
    two = [*common, "--per_device_train_batch_size", "8"]
    eager = launch(FSDP_CONFIG, ["--output_dir", str(folder / "eager"), *two])
    (folder / "eager" / "launch.log").write_text(eager.stderr)
    compiled = ["--torch_compile", "true", "--torch_compile_backend", "aot_eager"]
    launch(DDP_CONFIG, ["--output_dir", str(folder / "compiled"), *two, *compiled])
    return {name: folder / name for name in ("single", "eager", "compiled")} | {"tokenizer": Path(tokenizer_dir)}


@pytest.mark.slow
@pytest.mark.serial
def test_two_cpu_processes_report_the_loss_of_one_and_end_with_identical_weights(ddp_runs):
    eager, single = ddp_runs["eager"], ddp_runs["single"]
    log = (eager / "launch.log").read_text()
    assert "find_unused_parameters" not in log  # torch's warning at every step, of the Trainer's setting
    digests = [json.loads((eager / f"weights-rank{r}.json").read_text()) for r in (0, 1)]
    assert digests[0] == digests[1], "DDP ranks diverged"
    one, two = logged_losses(single), logged_losses(eager)
    assert len(one) == len(two) == 4
    # each step sees the same 16 examples: 16 on one process, 8 + 8 on two
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), atol=1e-4, rtol=1e-4)
    straight, split = (load_file(path / "model.safetensors") for path in (single, eager))
    for name in straight:
        torch.testing.assert_close(split[name], straight[name], atol=1e-4, rtol=1e-3, msg=name)
    assert json.loads((eager / "trainer_state.json").read_text())["global_step"] == 4
    assert "x 2 devices (DDP)" in (eager / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.serial
def test_an_fsdp_config_on_cpu_trains_as_ddp_and_says_so(ddp_runs):
    """What accelerate 1.15 does with the shipped fsdp.yaml and --use_cpu true: 2 connected processes, plain DDP
    (tests/test_fsdp.py lifts accelerate's GPU check to run it as FSDP2)."""
    log = (ddp_runs["eager"] / "launch.log").read_text()
    assert "The accelerate config asks for FSDP, but these 2 processes train as DDP" in log


@pytest.mark.slow
@pytest.mark.serial
def test_two_ddp_processes_run_every_stage_and_predict_what_one_process_predicts(ddp_runs, tmp_path):
    trained = ddp_runs["eager"]
    # the saved model, evaluated and decoded by one process
    single = tmp_path / "single"
    given = [flag for flag in TINY if flag.startswith("--")]
    kept = [  # TINY less the architecture flags, which the checkpoint brings
        item for flag in given if flag not in ARCHITECTURE for item in TINY[TINY.index(flag) : TINY.index(flag) + 2]
    ]
    main(["--output_dir", str(single), *kept, *STAGES, "--model_name_or_path", str(trained), "--do_train", "False"])

    ddp_rows = (trained / "predictions.jsonl").read_text().splitlines()
    assert len(ddp_rows) == 20 and ddp_rows == (single / "predictions.jsonl").read_text().splitlines()
    ddp, one = without_timings(results(trained, "test")), without_timings(results(single, "test"))
    assert ddp.keys() == one.keys() and "test_bleu4" in ddp
    for key in ddp:  # the Trainer's loss is a mean of batch means: the short last batch, which accelerate fills up
        # with repeated pairs on the second process, weighs a little differently there; every score is exact
        assert ddp[key] == pytest.approx(one[key], rel=1e-3 if key == "test_loss" else 1e-9), key
    # the same mean of batch means, over batches cut differently on two processes
    assert results(trained, "eval")["eval_loss"] == pytest.approx(results(single, "eval")["eval_loss"], rel=1e-3)


@pytest.mark.slow
@pytest.mark.serial
def test_two_ddp_processes_train_compiled_as_they_train_eager(ddp_runs):
    """run.py --torch_compile true under `accelerate launch`: both ranks train the model as one compiled graph
    (dynamo breaks only in torch's DDP wrapper around it), and end with the weights, evaluation and predictions of
    the same run in eager mode."""
    compiled, eager = ddp_runs["compiled"], ddp_runs["eager"]
    for rank in (0, 1):
        record = json.loads((compiled / f"weights-rank{rank}.json").read_text())
        # the model is one graph; torch's DDP wrapper around it breaks (its logger, `_inside_ddp_forward`), no more
        assert record["graphs"] == 1, record
        outside = [reason for reason in record["graph_breaks"] if not DDP_WRAPPER_BREAK.search(reason)]
        assert outside == [], outside
        assert json.loads((eager / f"weights-rank{rank}.json").read_text())["graphs"] == 0
    weights = load_file(compiled / "model.safetensors")
    assert not any("_orig_mod" in name for name in weights)  # the model's weights, not its compiled wrapper's
    for name, weight in load_file(eager / "model.safetensors").items():
        torch.testing.assert_close(weights[name], weight, atol=1e-6, rtol=0, msg=name)
    rows = [(path / "predictions.jsonl").read_text().splitlines() for path in (compiled, eager)]
    assert len(rows[0]) == 20 and rows[0] == rows[1]
    losses = [results(path, "eval")["eval_loss"] for path in (compiled, eager)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
@pytest.mark.serial
def test_processes_that_accelerate_did_not_connect_are_refused(tmp_path):
    """`accelerate launch` with the FSDP config and no --use_cpu on a machine without GPUs starts 2 processes that
    are not connected (accelerate does FSDP on GPUs only): each would train everything and write the same files as
    the other."""
    output = tmp_path / "out"
    result = launch(FSDP_CONFIG, ["--output_dir", str(output), *TINY, "--do_train"], check=False)
    assert result.returncode != 0
    assert "2 processes were launched but run as 2 separate single-process runs" in result.stderr
    assert "accelerate/ddp.yaml" in result.stderr and not output.exists()


def test_the_shipped_accelerate_configs_name_what_to_change_for_gpus():
    import yaml

    for path, kind in ((DDP_CONFIG, "MULTI_GPU"), (FSDP_CONFIG, "FSDP")):
        config = yaml.safe_load(path.read_text())
        assert config["distributed_type"] == kind and config["num_processes"] == 2 and config["use_cpu"] is True
        assert "bf16" in path.read_text() and "use_cpu" in path.read_text().split("compute_environment")[0]
    fsdp = yaml.safe_load(FSDP_CONFIG.read_text())["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    from modeling_cdnpg import modeling_cdnpg

    for name in fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","):
        assert isinstance(getattr(modeling_cdnpg, name), type), name  # the wrapped classes exist under these names


def test_fsdp_runs_embed_with_the_shared_module_and_compute_what_they_computed():
    """FSDP2 as accelerate wraps a model groups the input embedding with the LM head, and refuses a tied weight that
    another module also holds; under FSDP, CDNPGTrainer makes the tied stacks embed with `shared` itself."""
    from cdnpg.training.workarounds import share_tied_embedding_modules
    from tests.conftest import tiny_model

    model = tiny_model()
    assert model.model.encoder.embed_tokens is not model.model.shared  # transformers 5 ties the weight only
    ids = torch.tensor([[5, 6, 7, 2]])
    before = model(input_ids=ids, decoder_input_ids=ids).logits
    share_tied_embedding_modules(model)
    assert model.model.encoder.embed_tokens is model.model.shared is model.model.decoder.embed_tokens
    torch.testing.assert_close(model(input_ids=ids, decoder_input_ids=ids).logits, before, rtol=0, atol=0)
    assert not any(name.endswith(".embed_tokens.weight") for name in model.state_dict())  # named once: `shared`
    untied = tiny_model(tie_word_embeddings=False)
    share_tied_embedding_modules(untied)
    assert untied.model.encoder.embed_tokens is not untied.model.shared  # separate weights stay separate


@pytest.mark.slow
@pytest.mark.serial
def test_two_machine_ranks_over_loopback_run_every_stage_and_predict_what_one_process_predicts(ddp_runs, tmp_path):
    """docs/distributed.md's several-machine launch, both machines on this one: two `accelerate launch` commands, one
    per --machine_rank with one process each, meet at 127.0.0.1 and share the output folder. They train what one
    machine's 2 processes train, write one model and one predictions file, and the saved model decoded by one
    process predicts the same."""
    output = tmp_path / "two-machines"
    argv = [str(ROOT / "tests" / "run_probe.py"), "--output_dir", str(output), *TINY, *STAGES,
            "--tokenizer_name", str(ddp_runs["tokenizer"]), "--use_cpu", "True", "--max_steps", "4",
            "--granularity_mask", "product", "--per_device_train_batch_size", "8"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    machines = two_machine_ranks(argv, env, output)
    assert [machine.returncode for machine in machines] == [0, 0], [machine.stderr[-3000:] for machine in machines]
    assert "x 2 devices (DDP)" in (output / "README.md").read_text()
    # the same training as one machine's 2 processes: the same weights, predictions and scores
    for name, weight in load_file(ddp_runs["eager"] / "model.safetensors").items():
        torch.testing.assert_close(load_file(output / "model.safetensors")[name], weight, atol=1e-6, rtol=0, msg=name)
    rows = (output / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == 20 and rows == (ddp_runs["eager"] / "predictions.jsonl").read_text().splitlines()
    single = tmp_path / "single"
    kept = [item for flag in TINY if flag.startswith("--") and flag not in ARCHITECTURE
            for item in TINY[TINY.index(flag) : TINY.index(flag) + 2]]  # fmt: skip
    main(["--output_dir", str(single), *kept, *STAGES, "--model_name_or_path", str(output), "--do_train", "False"])
    assert rows == (single / "predictions.jsonl").read_text().splitlines()


@pytest.mark.slow
@pytest.mark.serial
def test_a_launch_into_a_folder_another_run_holds_stops_in_every_process_with_one_line(tmp_path):
    """The launch's main process finds the lock held and tells the others: every process stops before any data work,
    none waits for the main one in vain."""
    from cdnpg.training.output_dir import output_dir_lock

    output = tmp_path / "out"
    with output_dir_lock(output, ["training/run.py", "first"]):
        result = launch(
            DDP_CONFIG, ["--output_dir", str(output), *TINY, "--do_train", "--use_cpu", "True"], check=False
        )
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if "is in use by another run (process " in line]
    assert len(refusals) == 1, result.stderr[-3000:]  # said once, by the first process
    assert refusals[0].startswith(f"run_probe.py: error: --output_dir {output} is in use by another run (process ")
    assert not output.exists()
