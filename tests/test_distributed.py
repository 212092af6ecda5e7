"""Several processes through `accelerate launch`, as users start them: every stage (train, evaluate, predict) on 2 CPU
processes with the shipped DDP config gives what one process gives, and processes that accelerate did not connect
are refused instead of each training alone into the same folder."""

import json
import re
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

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


def without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in metrics.items() if not key.endswith(("runtime", "per_second", "_time"))}


@pytest.mark.slow
def test_two_ddp_processes_run_every_stage_and_predict_what_one_process_predicts(tmp_path, tokenizer_dir):
    trained = tmp_path / "ddp"
    common = [*TINY, *STAGES, "--tokenizer_name", tokenizer_dir, "--use_cpu", "True"]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CONFIG)]
    argv = ["--output_dir", str(trained), *common, "--max_steps", "4", "--per_device_train_batch_size", "8"]
    first = run(argv, launcher=launcher, check=False)
    if first.returncode != 0 and "terminate called without an active exception" in first.stderr:
        # known, rare: gloo aborts a rank that leaves while rank 0 still scores (seen once in 5 CI runs); once more
        shutil.rmtree(trained)
        run(argv, launcher=launcher)
    else:
        assert first.returncode == 0, first.stderr[-4000:]
    # the saved model, evaluated and decoded by one process
    single = tmp_path / "single"
    given = [flag for flag in TINY if flag.startswith("--")]
    kept = [  # TINY less the architecture flags, which the checkpoint brings
        item for flag in given if flag not in ARCHITECTURE for item in TINY[TINY.index(flag) : TINY.index(flag) + 2]
    ]
    run(["--output_dir", str(single), *kept, *STAGES, "--model_name_or_path", str(trained),
         "--do_train", "False"])  # fmt: skip

    ddp_rows = [json.loads(line) for line in (trained / "predictions.jsonl").read_text().splitlines()]
    single_rows = [json.loads(line) for line in (single / "predictions.jsonl").read_text().splitlines()]
    assert len(ddp_rows) == 20 and ddp_rows == single_rows  # one per pair, in the test split's order, same text
    single_eval = json.loads((single / "eval_results.json").read_text())
    ddp, one = (without_timings(json.loads((path / "test_results.json").read_text())) for path in (trained, single))
    assert ddp.keys() == one.keys() and "test_bleu4" in ddp
    for key in ddp:  # the Trainer's loss is a mean of batch means: the short last batch, which accelerate fills up
        # with repeated pairs on the second process, weighs a little differently there; every score is exact
        assert ddp[key] == pytest.approx(one[key], rel=1e-3 if key == "test_loss" else 1e-9), key
    ddp_eval = json.loads((trained / "eval_results.json").read_text())
    # the same mean of batch means, over batches cut differently on two processes (a CI run differed by 1.1e-4)
    assert ddp_eval["eval_loss"] == pytest.approx(single_eval["eval_loss"], rel=1e-3)
    assert json.loads((trained / "trainer_state.json").read_text())["global_step"] == 4
    assert "x 2 devices" in (trained / "README.md").read_text()


@pytest.mark.slow
def test_two_ddp_processes_train_compiled_as_they_train_eager(tmp_path, tokenizer_dir):
    """run.py --torch_compile true under `accelerate launch` (issue 39 item 3): both ranks train the model as one
    compiled graph (dynamo breaks only in torch's DDP wrapper around it), and end with the weights, evaluation and predictions of the same run in eager mode."""
    common = [*TINY, *STAGES, "--tokenizer_name", tokenizer_dir, "--use_cpu", "True", "--max_steps", "4",
              "--per_device_train_batch_size", "8", "--granularity_mask", "product"]  # fmt: skip
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CONFIG)]
    compiled, eager = tmp_path / "compiled", tmp_path / "eager"
    run(["--output_dir", str(compiled), *common, "--torch_compile", "true", "--torch_compile_backend", "aot_eager"],
        launcher=launcher)  # fmt: skip
    run(["--output_dir", str(eager), *common], launcher=launcher)
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
    losses = [json.loads((path / "eval_results.json").read_text())["eval_loss"] for path in (compiled, eager)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_processes_that_accelerate_did_not_connect_are_refused(tmp_path):
    """`accelerate launch` with the FSDP config on a machine without GPUs starts 2 processes that are not connected
    (accelerate does FSDP on GPUs only): each would train everything and write the same files as the other."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG)]
    output = tmp_path / "out"
    result = run(["--output_dir", str(output), *TINY, "--do_train"], launcher=launcher, check=False)
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
    import torch

    from cdnpg.training.trainer import share_tied_embedding_modules
    from tests.conftest import tiny_model

    model = tiny_model()
    assert model.model.encoder.embed_tokens is not model.model.shared  # transformers 5 ties the weight only
    ids = torch.tensor([[5, 6, 7, 2]])
    before = model(input_ids=ids, decoder_input_ids=ids).logits
    share_tied_embedding_modules(model)
    assert model.model.encoder.embed_tokens is model.model.shared is model.model.decoder.embed_tokens
    torch.testing.assert_close(model(input_ids=ids, decoder_input_ids=ids).logits, before, rtol=0, atol=0)
    untied = tiny_model(tie_word_embeddings=False)
    share_tied_embedding_modules(untied)
    assert untied.model.encoder.embed_tokens is not untied.model.shared  # separate weights stay separate
