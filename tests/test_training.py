"""Training: the Trainer API contract, training/run.py end to end, resume after a kill, and 2-process DDP on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from cdnpg.data import save_tokenizer, template_corpus, train_wordpiece_tokenizer
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
# A tiny model and corpus: every run below takes seconds of training on a CPU.
TINY = [
    "--d_model", "32", "--layers", "1", "--attention_heads", "2", "--ffn_dim", "64", "--vocab_size", "400",
    "--template_sizes", "256", "16", "16", "--per_device_eval_batch_size", "16", "--dropout", "0.0",
    "--learning_rate", "0.001", "--warmup_steps", "2", "--logging_steps", "1", "--eval_strategy", "no",
    "--save_strategy", "steps", "--save_steps", "5", "--load_best_model_at_end", "False", "--seed", "3",
    "--dataloader_pin_memory", "False", "--disable_tqdm", "True",
]  # fmt: skip


def run(args: list[str], launcher: list[str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = [*(launcher or [sys.executable]), str(ROOT / "tests" / "run_probe.py"), *args]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "warning", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """One tokenizer for runs that are compared: `tokenizers` breaks frequency ties differently in each process."""
    corpus = template_corpus(num_train=256, num_valid=16, num_test=16, seed=0)["train"]
    tokenizer = train_wordpiece_tokenizer([*corpus["source"], *corpus["target"]], vocab_size=400)
    return str(save_tokenizer(tokenizer, tmp_path_factory.mktemp("tokenizer")))


def logged_losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def test_plain_seq2seq_trainer_trains_and_evaluates_with_generate(tmp_path):
    corpus = template_corpus(num_train=128, num_valid=8, num_test=8, seed=0)
    tokenizer = train_wordpiece_tokenizer([*corpus["train"]["source"], *corpus["train"]["target"]], vocab_size=300)
    model = tiny_model(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
        dropout=0.0,
    )

    def encode(batch):
        targets = tokenizer(batch["target"])["input_ids"]
        return {**tokenizer(batch["source"]), "labels": [ids[1:] for ids in targets]}

    features = corpus.map(encode, batched=True, remove_columns=["source", "target"])
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        max_steps=40,
        logging_steps=5,
        predict_with_generate=True,
        generation_num_beams=2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
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


def test_run_py_writes_a_hub_ready_checkpoint_predictions_and_metrics(tmp_path):
    output = tmp_path / "out"
    run(["--output_dir", str(output), *TINY, "--max_steps", "6", "--do_train", "--do_predict"])
    assert {"config.json", "model.safetensors", "modeling_cdnpg.py", "tokenizer.json", "README.md"} <= {
        path.name for path in output.iterdir()
    }
    assert (output / "trainer_state.json").is_file()
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and set(rows[0]) == {"source", "reference", "prediction"}
    metrics = json.loads((output / "metrics.json").read_text())
    for key in ("test_bleu4", "test_ibleu", "test_ibleu_paper", "test_rougeL", "test_meteor", "train_loss"):
        assert key in metrics and metrics[key] == metrics[key], key  # present and not NaN
    config = json.loads((output / "config.json").read_text())
    assert config["granularity_mask"] == "resonance" and "custom_pipelines" in config and config["use_cache"]
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["num_beams"] == 8 and generation["max_new_tokens"] == 20 and "max_length" not in generation
    tokenizer_config = json.loads((output / "checkpoint-5" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert type(AutoModelForSeq2SeqLM.from_pretrained(output)).__name__ == "CDNPGForConditionalGeneration"


def test_run_py_reads_a_yaml_file_and_lets_flags_override_it(tmp_path):
    config = tmp_path / "args.yaml"
    config.write_text("granularity_mask: scope\nmax_steps: 50\ndo_train: true\n")
    output = tmp_path / "out"
    run([str(config), "--output_dir", str(output), *TINY, "--max_steps", "2"])
    assert json.loads((output / "config.json").read_text())["granularity_mask"] == "scope"
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 2


def test_bad_arguments_name_the_problem(tmp_path):
    result = run(["--output_dir", str(tmp_path), "--dataset", "files"], check=False)
    assert result.returncode != 0 and "--dataset files needs --train_file" in result.stderr
    result = run(["--output_dir", str(tmp_path), "--granularity_mask", "both", *TINY, "--do_train"], check=False)
    assert result.returncode != 0 and "granularity_mask must be one of" in result.stderr


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, tokenizer_dir):
    common = [*TINY, "--max_steps", "10", "--do_train", "--dropout", "0.1", "--tokenizer_name", tokenizer_dir]
    run(["--output_dir", str(tmp_path / "straight"), *common])
    killed = run(["--kill_after_step", "5", "--output_dir", str(tmp_path / "resumed"), *common], check=False)
    assert killed.returncode == 17 and (tmp_path / "resumed" / "checkpoint-5").is_dir()
    assert not (tmp_path / "resumed" / "model.safetensors").exists()
    checkpoint = str(tmp_path / "resumed" / "checkpoint-5")
    run(["--output_dir", str(tmp_path / "resumed"), *common, "--resume_from_checkpoint", checkpoint])
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:  # same data order, dropout masks and optimizer state: equal up to float rounding
        torch.testing.assert_close(resumed[name], straight[name], atol=1e-6, rtol=0, msg=name)


def test_two_cpu_processes_report_the_loss_of_one_and_end_with_identical_weights(tmp_path, tokenizer_dir):
    common = [*TINY, "--max_steps", "6", "--do_train", "--use_cpu", "True", "--tokenizer_name", tokenizer_dir]
    run(["--output_dir", str(tmp_path / "one"), *common, "--per_device_train_batch_size", "16"])
    launcher = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
    ]  # fmt: skip
    run(["--output_dir", str(tmp_path / "two"), *common, "--per_device_train_batch_size", "8"], launcher=launcher)
    digests = [json.loads((tmp_path / "two" / f"weights-rank{r}.json").read_text()) for r in (0, 1)]
    assert digests[0] == digests[1], "DDP ranks diverged"
    one, two = logged_losses(tmp_path / "one"), logged_losses(tmp_path / "two")
    assert len(one) == len(two) == 6
    # each step sees the same 16 examples: 16 on one process, 8 + 8 on two
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), atol=1e-4, rtol=1e-4)
    straight, split = (load_file(tmp_path / name / "model.safetensors") for name in ("one", "two"))
    for name in straight:
        torch.testing.assert_close(split[name], straight[name], atol=1e-4, rtol=1e-3, msg=name)
