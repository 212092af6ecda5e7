"""FSDP without a GPU: the shipped `fsdp.yaml` through `accelerate launch training/run.py` on 2 CPU processes, and
FSDP2 on the model itself.

accelerate 1.15 sets FSDP up only for GPU devices; `tests/fsdp_cpu/sitecustomize.py`, put on the launch's
PYTHONPATH, lifts that one check, so that the same plugin, `fully_shard`, gathers and FSDP checkpoints run on gloo.
This simulates the GPU launch; it does not cover NCCL, device placement or mixed precision on GPUs
(docs/distributed.md). Without the shim the same config trains as DDP, and run.py says so (tests/test_distributed.py).

Four launches serve every assertion: one run of every stage under the shipped config (`fsdp_run`), a run resumed
from its checkpoint, and a SHARDED_STATE_DICT run killed after a checkpoint and resumed.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file

from tests.conftest import relaunched_on_gloo_teardown_abort
from tests.run_probe import weights_digest
from tests.test_training import ROOT, TINY, run

FSDP_CONFIG = ROOT / "training" / "configs" / "accelerate" / "fsdp.yaml"
CPU_FSDP_SHIM = ROOT / "tests" / "fsdp_cpu"
# 20 test pairs in batches of 3 per process; 4 steps with a checkpoint every 2, so that a run can stop at step 2
STAGES = ["--do_train", "--do_eval", "--do_predict", "--template_sizes", "256", "12", "20",
          "--per_device_eval_batch_size", "3", "--generation_num_beams", "2"]  # fmt: skip
TRAINING = ["--max_steps", "4", "--save_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu", "True"]
TIED_EMBEDDING = ("lm_head.weight", "model.shared.weight", "model.encoder.embed_tokens.weight",
                  "model.decoder.embed_tokens.weight")  # fmt: skip


def launch(config: Path, argv: list[str], shim: bool = True, check: bool = True):
    """`accelerate launch --config_file CONFIG tests/run_probe.py ARGV` (run.py with the probe's callbacks); with
    `shim`, on CPU processes that set up FSDP as GPU processes would."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                "--main_process_port", "0"]  # fmt: skip
    paths = [str(CPU_FSDP_SHIM)] * shim + [str(ROOT), os.environ.get("PYTHONPATH", "")]
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    try:
        output = None if "--resume_from_checkpoint" in argv else Path(argv[argv.index("--output_dir") + 1])
        result = relaunched_on_gloo_teardown_abort(lambda: run(argv, launcher=launcher, check=False), output)
    finally:
        os.environ.pop("PYTHONPATH") if previous is None else os.environ.__setitem__("PYTHONPATH", previous)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def config_with(tmp_path: Path, **fsdp) -> Path:
    """The shipped fsdp.yaml with some of its fsdp_config changed."""
    config = yaml.safe_load(FSDP_CONFIG.read_text())
    config["fsdp_config"].update(fsdp)
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def digest(folder: Path) -> str:
    """The weights' digest that tests/run_probe.py wrote at the end of training; every rank's is the same."""
    digests = {json.loads((folder / f"weights-rank{rank}.json").read_text())["sha256"] for rank in (0, 1)}
    assert len(digests) == 1, digests
    return digests.pop()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, tokenizer_dir) -> Path:
    """Every stage of run.py under the shipped fsdp.yaml, on 2 CPU processes set up as FSDP2."""
    output = tmp_path_factory.mktemp("fsdp") / "run"
    argv = ["--output_dir", str(output), *TINY, *STAGES, *TRAINING, "--tokenizer_name", tokenizer_dir,
            "--log_level", "info"]  # fmt: skip
    result = launch(FSDP_CONFIG, argv)
    (output / "launch.log").write_text(result.stderr)
    return output


@pytest.mark.slow
@pytest.mark.serial
def test_the_shipped_fsdp_config_trains_every_stage_as_fsdp2_and_saves_an_ordinary_checkpoint(fsdp_run):
    log = (fsdp_run / "launch.log").read_text()
    assert "Distributed strategy: FSDP2 (2 processes)" in log and "asks for" not in log
    assert "x 2 devices (FSDP2)" in (fsdp_run / "README.md").read_text()
    assert json.loads((fsdp_run / "trainer_state.json").read_text())["global_step"] == 4
    assert len(rows(fsdp_run / "predictions.jsonl")) == 20
    for folder in (fsdp_run, fsdp_run / "checkpoint-4"):
        # the model's own code, as a single process saves it: not torch's FSDP class and its private files
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert auto_map["AutoModelForSeq2SeqLM"] == "modeling_cdnpg.CDNPGForConditionalGeneration"
        assert not list(folder.glob("_fsdp*.py"))
        # the tied embedding stored once, under the name a single process stores it
        stored = load_file(folder / "model.safetensors")
        assert [name for name in TIED_EMBEDDING if name in stored] == ["model.shared.weight"]


@pytest.mark.slow
@pytest.mark.serial
def test_the_fsdp_model_loads_in_one_process_and_predicts_what_the_two_processes_predicted(fsdp_run):
    from transformers import AutoModelForSeq2SeqLM, pipeline

    from cdnpg.training.scoring import load_metric, score

    model = AutoModelForSeq2SeqLM.from_pretrained(fsdp_run, trust_remote_code=True)
    assert type(model).__name__ == "CDNPGForConditionalGeneration"
    assert model.lm_head.weight is model.model.shared.weight  # tied again on load
    assert weights_digest(model) == digest(fsdp_run)  # bit for bit the weights the 2 processes trained
    paraphraser = pipeline("text2text-generation", model=str(fsdp_run), trust_remote_code=True)
    fsdp_rows = rows(fsdp_run / "predictions.jsonl")
    sources = [row["source"] for row in fsdp_rows]
    predicted = [out[0]["generated_text"] for out in paraphraser(sources, batch_size=3)]  # the run's batches
    assert predicted == [row["prediction"] for row in fsdp_rows]
    pairs = {"source": sources, "target": [row["reference"] for row in fsdp_rows]}
    fsdp_scores = json.loads((fsdp_run / "test_results.json").read_text())
    for key, value in score(load_metric(), predicted, pairs).items():
        assert value == pytest.approx(fsdp_scores[key], rel=1e-9, abs=1e-12), key


@pytest.mark.slow
@pytest.mark.serial
def test_an_fsdp_run_resumed_from_a_full_state_dict_checkpoint_ends_with_the_weights_of_the_straight_run(
    tmp_path, tokenizer_dir, fsdp_run
):
    """The straight run's checkpoint of step 2 (FSDP's own files for the model and optimizer, as the shipped config
    saves them) resumed in another folder: steps 3 and 4 again, to the same weights and predictions."""
    output = tmp_path / "run"
    argv = ["--output_dir", str(output), *TINY, *STAGES, *TRAINING, "--tokenizer_name", tokenizer_dir]
    launch(FSDP_CONFIG, [*argv, "--resume_from_checkpoint", str(fsdp_run / "checkpoint-2")])
    assert digest(output) == digest(fsdp_run)
    assert rows(output / "predictions.jsonl") == rows(fsdp_run / "predictions.jsonl")


@pytest.mark.slow
@pytest.mark.serial
def test_an_fsdp_run_killed_after_a_sharded_checkpoint_resumes_to_the_weights_of_an_uninterrupted_one(
    tmp_path, tokenizer_dir, fsdp_run
):
    """SHARDED_STATE_DICT: the checkpoints hold FSDP's shards; the run, killed abruptly after the checkpoint of step
    2 and resumed from it, trains what the straight FULL_STATE_DICT run trained, and its folder holds the whole
    model, which loads in one process."""
    config = config_with(tmp_path, fsdp_state_dict_type="SHARDED_STATE_DICT")
    output = tmp_path / "run"
    argv = ["--output_dir", str(output), *TINY, *STAGES, *TRAINING, "--tokenizer_name", tokenizer_dir]
    killed = launch(config, ["--kill_after_step", "2", *argv], check=False)
    assert killed.returncode != 0 and (output / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (output / "model.safetensors").exists()
    launch(config, [*argv, "--resume_from_checkpoint", str(output / "checkpoint-2")])
    assert digest(output) == digest(fsdp_run)
    assert rows(output / "predictions.jsonl") == rows(fsdp_run / "predictions.jsonl")
    from transformers import AutoModelForSeq2SeqLM

    assert weights_digest(AutoModelForSeq2SeqLM.from_pretrained(output, trust_remote_code=True)) == digest(output)


# ---------------------------------------------------------------------------------------------------------------------
# FSDP2 on the model, without accelerate: one step on 2 processes is one step on the whole batch
# ---------------------------------------------------------------------------------------------------------------------

PARITY_CASES = [(mask, tied) for mask in ("none", "resonance", "scope") for tied in (True, False)]


def fully_sharded(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """FSDP2 as the config asks: each encoder and decoder layer a unit, the rest (embeddings, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def one_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A training step with plain SGD (its update is the gradient itself, so the weights compare the gradients)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    difference = (actual - expected).abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=f"{what} differs by {difference:.3g}")


def check_parity(rank: int, mesh, mask: str, tied: bool, batch: dict[str, torch.Tensor]) -> None:
    """The FSDP2 step on this rank's half of the batch against one process's step on all of it, then `generate()`
    under FSDP2 against one process's."""
    import copy

    from cdnpg.training.workarounds import fsdp_root_unsharded
    from tests.conftest import tiny_model

    case = f"{mask}, tied={tied}"
    model = tiny_model(granularity_mask=mask, tie_word_embeddings=tied, dropout=0.0, attention_dropout=0.0).train()
    single = copy.deepcopy(model)
    expected_loss = one_step(single, batch)
    sharded = fully_sharded(model, mesh)
    loss = one_step(sharded, {key: value[2 * rank : 2 * rank + 2] for key, value in batch.items()})
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    assert_same(loss, expected_loss, f"{case}: the loss")
    expected = dict(single.named_parameters())
    for name, parameter in sharded.named_parameters():
        assert_same(parameter.full_tensor(), expected[name], f"{case}: {name} after the step")
    sharded.eval()
    single.eval()
    with torch.no_grad(), fsdp_root_unsharded(sharded):
        generated = sharded.generate(batch["input_ids"], num_beams=2, max_new_tokens=6)
    assert torch.equal(generated, single.generate(batch["input_ids"], num_beams=2, max_new_tokens=6)), case


def upstream_fsdp2_limitations(rank: int, mesh, folder: Path) -> None:
    """What the FSDP2 workarounds of cdnpg/training/workarounds.py are for, reproduced with the plain libraries: an
    assertion that fails here means upstream has fixed it, and the workaround it names can be deleted."""
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers.dynamic_module_utils import custom_object_save

    from cdnpg.training import workarounds
    from tests.conftest import tiny_model

    ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 12, 2]])
    # share_tied_embedding_modules: accelerate 1.15 wraps the tied embedding with the LM head, torch refuses the
    # encoder's and decoder's own embedding modules that hold the same weight in the root unit
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT",
        transformer_cls_names_to_wrap=["CDNPGEncoderLayer", "CDNPGDecoderLayer"],
    )  # fmt: skip
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None, parallelism_config=None,
        mixed_precision="no", is_main_process=rank == 0, device=torch.device("cpu"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="shared with a parameter already managed by another FSDP group"):
        fsdp2_prepare_model(accelerator, tiny_model())(input_ids=ids, labels=ids)
    shared = tiny_model()
    workarounds.share_tied_embedding_modules(shared)
    fsdp2_prepare_model(accelerator, shared)(input_ids=ids, labels=ids).loss.backward()

    model = fully_sharded(tiny_model().eval(), mesh)
    # fsdp_root_unsharded: generate() calls the encoder past the root unit's hooks, which gather its parameters
    with pytest.raises(RuntimeError, match=r"mixed torch\.Tensor and DTensor"), torch.no_grad():
        model.generate(ids, num_beams=2, max_new_tokens=4)
    # own_class: save_pretrained copies the code of the model's class, torch's own after fully_shard
    if rank == 0:
        config = {}
        folder.mkdir()
        custom_object_save(model, folder, config=config)
        assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("_fsdp"), config
        assert workarounds.own_class(model).__name__ == "CDNPGForConditionalGeneration"
    # tied_names_aliased: the gathered state dict holds each name of the tied embedding as a tensor of its own
    state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        assert state_dict["lm_head.weight"].data_ptr() != state_dict["model.shared.weight"].data_ptr()
        aliased = workarounds.tied_names_aliased(state_dict, model)
        assert aliased["lm_head.weight"] is aliased["model.shared.weight"]


def parity_process(rank: int, store: str) -> None:
    """One of the 2 gloo processes: the upstream limitations, then every case, on the same batches as the other
    process."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    upstream_fsdp2_limitations(rank, mesh, Path(store).parent / "saved")
    generator = torch.Generator().manual_seed(0)
    for mask, tied in PARITY_CASES:
        batch = {  # 4 pairs of equal lengths: each half holds as many target tokens, so the mean losses agree
            "input_ids": torch.randint(3, 60, (4, 7), generator=generator),
            "labels": torch.randint(3, 60, (4, 6), generator=generator),
        }
        check_parity(rank, mesh, mask, tied, batch)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.serial
def test_one_fsdp2_step_on_two_processes_is_one_step_on_the_whole_batch_and_generates_alike(tmp_path):
    """Also the FSDP2 limitations that cdnpg/training/workarounds.py works around (`upstream_fsdp2_limitations`)."""
    torch.multiprocessing.spawn(parity_process, args=(str(tmp_path / "store"),), nprocs=2)
