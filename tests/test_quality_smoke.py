"""`benchmarks/quality.py --quick` trains every model end to end on the embedded template corpus and writes
results.json, keeping the flags given with --quick. No quality is asserted (a tiny model trained for a few steps says
nothing), except for the copy-source baseline, whose self-BLEU-4 must show that it copies; the full benchmark and its
reading are in docs/benchmarks.md."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METRIC_KEYS = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4")


@pytest.mark.slow
def test_quality_quick_scores_every_model(tmp_path):
    out = tmp_path / "quality"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "quality.py"),
            "--quick",
            "--max_steps",
            "6",
            "--output_dir",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,  # about 2 minutes on an idle 2-core CPU; several times that when the cores are shared
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| copy the source |" in completed.stdout  # the table was printed

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["max_steps"] == 6 and results["config"]["d_model"] == 32  # the flag given, then --quick's
    assert list(results["models"]) == ["none", "resonance", "scope", "bart", "copy-source"]
    for name, entry in results["models"].items():
        assert [run["seed"] for run in entry["runs"]] == [0], name
        metrics = entry["runs"][0]["metrics"]
        for key in METRIC_KEYS:
            assert math.isfinite(metrics[key]), (name, key, metrics[key])
            assert entry["summary"][key]["n"] == 1
        assert (out / name / "predictions.jsonl").is_file() or (out / f"{name}-seed0" / "predictions.jsonl").is_file()
    for name in ("none", "resonance", "scope", "bart"):
        run = results["models"][name]["runs"][0]
        assert run["steps"] == results["config"]["max_steps"], (name, run["steps"])
        assert math.isfinite(run["best_validation_loss"]), name

    copy = results["models"]["copy-source"]["runs"][0]["metrics"]
    assert copy["self_bleu4"] > 95  # BLEU-4 of the source against itself (method7 smoothing lets it exceed 100)
    predictions = [json.loads(line) for line in (out / "copy-source" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == results["config"]["max_test_samples"]
    assert all(row["prediction"] == row["source"] for row in predictions)


@pytest.mark.slow
def test_quality_quick_warm_starts_and_scores_an_extra_test_set(tmp_path):
    from tests.test_convert import save_with_tokenizer, tiny_bert

    bert = save_with_tokenizer(tiny_bert(), tmp_path / "bert")
    extra = tmp_path / "extra.jsonl"
    extra.write_text(
        "".join(json.dumps({"source": f"how is the cat {i} ?", "target": "is the cat ?"}) + "\n" for i in range(5))
    )
    out = tmp_path / "quality"
    command = [sys.executable, str(ROOT / "benchmarks" / "quality.py"), "--quick", "--max_steps", "4"]
    command += ["--variants", "none", "--no_bart", "--init_from", str(bert), "--warm_variants", "resonance"]
    command += ["--extra_test", f"tiny={extra}", "--output_dir", str(out)]
    completed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| warm start, resonance |" in completed.stdout and "tiny:" in completed.stdout
    assert "| bert2bert (transformers EncoderDecoderModel) |" in completed.stdout

    results = json.loads((out / "results.json").read_text())
    assert list(results["models"]) == ["bert2bert", "warm-resonance", "none", "copy-source"]  # the baseline first
    warm = results["models"]["warm-resonance"]["runs"][0]
    assert warm["steps"] == 4 and warm["train_s_per_step"] > 0
    config = json.loads((out / "warm-resonance-seed0" / "config.json").read_text())
    assert config["granularity_mask"] == "resonance" and config["d_model"] == 32 and config["layernorm_embedding"]
    for name, entry in results["models"].items():
        scores = entry["runs"][0]["extra"]["tiny"]
        assert math.isfinite(scores["ibleu"]) and 0 <= scores["copy_rate"] <= 100, name
    assert results["models"]["copy-source"]["runs"][0]["extra"]["tiny"]["copy_rate"] == 100.0
    assert len((out / "warm-resonance-seed0" / "predictions-tiny.jsonl").read_text().splitlines()) == 5
    copy = results["models"]["copy-source"]["runs"][0]["metrics"]
    assert copy["rare_kept"] == 100.0  # the source keeps every rare word it has
    assert 0 <= results["human_retention"]["rare"] <= 100
    for name in ("bert2bert", "warm-resonance", "none"):
        metrics = results["models"][name]["runs"][0]["metrics"]
        assert 0 <= metrics["rare_kept"] <= 100, (name, metrics)
    assert [len(layers) for layers in warm["z_spread"].values()] == [2, 2, 2]  # the tiny BERT's 2 layers
    assert results["models"]["bert2bert"]["runs"][0]["z_spread"] is None
    assert results["models"]["none"]["runs"][0]["z_spread"] is None


def test_report_only_merges_the_seeds_of_another_output_folder(tmp_path):
    """Seeds run in parallel into two folders combine into one table; another setup is refused by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("quality_under_test", ROOT / "benchmarks" / "quality.py")
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)

    def results(seed: int, bleu4: float, steps: int = 10) -> dict:
        run = {"seed": seed, "metrics": dict.fromkeys(quality.METRIC_KEYS, bleu4), "extra": {}}
        model = {"runs": [run], "summary": quality.summarize([run])}
        config = {"max_steps": steps, "seeds": [seed], "output_dir": f"out{seed}", "files": {"test": f"t{seed}"}}
        return {"config": config, "models": {"resonance": model}}

    merged = results(0, 20.0)
    quality.merge_runs(merged, results(1, 30.0), "out1")
    assert [run["seed"] for run in merged["models"]["resonance"]["runs"]] == [0, 1]
    assert merged["models"]["resonance"]["summary"]["bleu4"]["mean"] == pytest.approx(25.0)
    assert merged["config"]["seeds"] == [0, 1]
    with pytest.raises(SystemExit, match="max_steps differ"):
        quality.merge_runs(merged, results(2, 30.0, steps=20), "out2")


@pytest.mark.parametrize(("max_steps", "evaluations", "every"), [(300, 1, "300"), (1200, 4, "300"), (10, 3, "4")])
def test_validation_runs_evaluations_times_not_every_step(tmp_path, max_steps, evaluations, every):
    """eval_steps "1.0" would be read by the Trainer as every step: the recipe passes whole steps."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("quality_under_test", ROOT / "benchmarks" / "quality.py")
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    args = argparse.Namespace(
        **{**dict.fromkeys(quality.RUN_FLAGS), "max_steps": max_steps, "evaluations": evaluations, "bf16": False}
    )
    files = {split: tmp_path / f"{split}.jsonl" for split in ("train", "valid", "test")}
    argv = quality.recipe_argv(args, files, tmp_path / "tokenizer", 0, tmp_path / "out")
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--eval_steps"] == flags["--save_steps"] == every


def load_benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variants_given_alone_trains_no_model_from_scratch():
    quality = load_benchmark("quality")
    assert quality.parse_args(["--variants"]).variants == []
    assert quality.parse_args([]).variants == ["none", "resonance", "scope"]


def test_bf16_reaches_every_models_trainer_and_a_cpu_is_named_for_it(tmp_path):
    quality = load_benchmark("quality")
    args = quality.parse_args(["--bf16", "--max_steps", "10"])
    files = {split: tmp_path / f"{split}.jsonl" for split in ("train", "valid", "test")}
    flags = dict(zip(*[iter(quality.recipe_argv(args, files, tmp_path / "tokenizer", 0, tmp_path / "out"))] * 2))
    assert flags["--bf16"] == "true" and flags["--use_cpu"] == "true"  # this machine has no GPU
    assert "--bf16" not in quality.recipe_argv(quality.parse_args([]), files, tmp_path, 0, tmp_path)


def test_detail_retention_counts_the_numbers_and_rare_words_an_output_keeps():
    """Pooled over pairs: 1 of 2 numbers and 1 of 3 rare words reappear; common words and punctuation never count."""
    from common import common_words, detail_words, retention

    common = common_words(["why did you introduce the notes ?", "why did the notes come ?"], size=6)
    assert common == {"why", "did", "the", "notes", "?", "you"}  # the 6 most frequent: 2, 2, 2, 2, 2 and 1 (first)
    details = [
        detail_words("why did rbi introduce 2000 rupee notes ?", common),
        detail_words("is 7 a prime ?", common),
    ]
    assert details == [{"numbers": {"2000"}, "rare": {"rbi", "introduce", "rupee"}},
                       {"numbers": {"7"}, "rare": {"is", "a", "prime"}}]  # fmt: skip
    outputs = ["why did the rs rs rspee notes introduced ?", "is 7 a number that is prime ?"]
    assert retention(details, outputs) == {"numbers": 50.0, "rare": pytest.approx(100 * 3 / 6)}


def test_granularity_spread_is_zero_at_a_warm_start_and_shows_a_trained_head_in_its_own_layer(tmp_path):
    """A converted checkpoint starts at z = 0.5 for every token (W_G ~ 1e-6): no spread anywhere. Spreading one
    encoder layer's W_G shows in that layer's number only; the other heads, still at ~0, stay at ~0."""
    import datasets
    import torch

    from cdnpg.convert import convert
    from tests.test_convert import save_with_tokenizer, tiny_bert

    quality = load_benchmark("quality")
    model, tokenizer = convert(save_with_tokenizer(tiny_bert(), tmp_path / "bert"), granularity_mask="resonance")
    sentences = ["how is the cat ?", "is the cat on the mat ?", "the cat is"]
    pairs = datasets.Dataset.from_dict({"source": sentences, "target": sentences[::-1]})
    run = tmp_path / "run"

    def spread() -> dict[str, list[float]]:
        model.save_pretrained(run)
        tokenizer.save_pretrained(run)
        return quality.granularity_spread(run, pairs)

    start = spread()
    assert [len(layers) for layers in start.values()] == [2, 2, 2]  # encoder, decoder, cross: 2 layers each
    assert max(max(layers) for layers in start.values()) < 1e-4
    torch.manual_seed(0)
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.granularity_head.proj.weight.normal_(0, 0.5)
    trained = spread()
    assert trained["encoder"][1] > 0.01 and trained["encoder"][0] < 1e-4
    assert max(trained["decoder"] + trained["cross"]) < 1e-4

    model_dir = tmp_path / "none"
    none, _ = convert(tmp_path / "bert", granularity_mask="none")
    none.save_pretrained(model_dir)
    assert quality.granularity_spread(model_dir, pairs) is None  # no granularity heads, nothing to measure
