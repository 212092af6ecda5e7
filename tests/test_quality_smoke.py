"""`benchmarks/quality.py --quick` trains every model end to end on the embedded template corpus and appends one JSON
line per run to runs.jsonl, keeping the flags given with --quick; `benchmarks/report.py` groups the runs of several
files. No quality is asserted (a tiny model trained for a few steps says nothing), except for the copy-source
baseline, whose self-BLEU-4 must show that it copies; the full benchmark and its reading are in docs/benchmarks.md."""

import json
import math
import sys
from pathlib import Path

import pytest
from common import group_runs, read_runs

ROOT = Path(__file__).resolve().parents[1]
METRIC_KEYS = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4")


@pytest.mark.slow
def test_quality_quick_trains_scores_and_reports_every_kind_of_model(tmp_path, monkeypatch, capsys):
    """One quick run of each kind of model, each a run.py process of its own: C-DNPG warm-started (from scratch too:
    run.py's flags of both are checked below), BART from scratch and bert2bert (run.py --architecture), and the
    anchors; the command line it was given is recorded with every run."""
    from tests.test_convert import save_with_tokenizer, tiny_bert

    bert, out = save_with_tokenizer(tiny_bert(), tmp_path / "bert"), tmp_path / "quality"
    argv = ["--quick", "--max_steps", "4", "--variants", "--init_from", str(bert), "--warm_variants", "resonance",
            "--output_dir", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["quality.py", *argv])
    load_benchmark("quality").main()
    printed = capsys.readouterr().out
    assert "| copy the source |" in printed and "| warm start, resonance |" in printed  # the table was printed
    assert "| bert2bert (transformers EncoderDecoderModel) |" in printed

    runs = read_runs([out / "runs.jsonl"])
    assert {run["command"] for run in runs} == {" ".join(["quality.py", *argv])}
    groups = group_runs(runs)
    trained = ["bert2bert", "warm-resonance", "bart"]  # the warm starts' baseline first
    assert list(groups) == ["human references", "copy-source", *trained]
    for name in trained:
        (run,) = groups[name]
        assert run["seed"] == 0 and run["steps"] == 4 and run["s_per_step"] > 0, name  # the flag given wins
        assert run["settings"]["max_steps"] == 4 and run["settings"]["d_model"] == 32
        assert math.isfinite(run["best_validation_loss"]) and run["train_loss"], name
        assert (out / f"{name}-seed0" / "predictions.jsonl").is_file()
        state = json.loads((out / f"{name}-seed0" / "trainer_state.json").read_text())
        assert sum("eval_loss" in row for row in state["log_history"]) == 2  # --quick's 2 evaluations, not 4
    for name in [*trained, "copy-source"]:
        metrics = groups[name][0]["metrics"]
        for key in METRIC_KEYS:
            assert math.isfinite(metrics[key]), (name, key, metrics[key])
        assert 0 <= metrics["rare_kept"] <= 100, name
    assert 0 <= groups["human references"][0]["metrics"]["rare_kept"] <= 100
    card = (out / "bert2bert-seed0" / "README.md").read_text()  # transformers' card, naming the local checkpoint
    assert f"This model is bert2bert built from the local checkpoint `{tmp_path.name}/bert`, trained on" in card
    config = json.loads((out / "warm-resonance-seed0" / "config.json").read_text())
    assert config["granularity_mask"] == "resonance" and config["d_model"] == 32 and config["layernorm_embedding"]

    # run.py's rare_kept: the rare words (outside the training text's common words) of its test sources it kept
    from cdnpg.training.paraphrase_metrics import common_words, detail_words, retention

    train = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    common = common_words([*(row["source"] for row in train), *(row["target"] for row in train)])
    rows = [json.loads(line) for line in (out / "warm-resonance-seed0" / "predictions.jsonl").read_text().splitlines()]
    kept = retention([detail_words(row["source"], common) for row in rows], [row["prediction"] for row in rows])
    assert groups["warm-resonance"][0]["metrics"]["rare_kept"] == pytest.approx(kept["rare"])

    copy = groups["copy-source"][0]["metrics"]
    assert copy["self_bleu4"] > 95  # BLEU-4 of the source against itself (method7 smoothing lets it exceed 100)
    assert copy["rare_kept"] == 100.0  # the source keeps every rare word it has
    predictions = [json.loads(line) for line in (out / "copy-source" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 12  # --quick's max_test_samples
    assert all(row["prediction"] == row["source"] for row in predictions)


def test_report_averages_the_seeds_of_several_runs_files_and_refuses_another_setup(tmp_path, capsys):
    """Seeds run in parallel into two folders combine into one table (mean ± sample std); a seed run again replaces
    the earlier run; runs of the same model trained another way are refused, naming what differs."""
    import report
    from common import append_run

    def run(seed: int, bleu4: float, steps: int = 10) -> dict:
        return {"benchmark": "quality", "model": "resonance", "seed": seed, "metrics": {"bleu4": bleu4},
                "settings": {"max_steps": steps, "data": "d", "test": "t", "d_model": 8, "layers": 1,
                             "attention_heads": 1, "ffn_dim": 8, "learning_rate": 1, "warmup_steps": 0,
                             "batch_size": 2, "num_beams": 8, "max_new_tokens": 20}}  # fmt: skip

    first, second = tmp_path / "seed0.jsonl", tmp_path / "seed1.jsonl"
    append_run(first, run(0, 10.0))
    append_run(first, run(0, 20.0))  # seed 0 again: replaces the first
    append_run(second, run(1, 30.0))
    report.main([str(first), str(second)])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| C-DNPG resonance"))
    assert "| 25.00 ± 7.07 |" in row and row.endswith("| 0,1 | 26.94 | 34.05 |")
    append_run(second, run(2, 30.0, steps=20))
    with pytest.raises(SystemExit, match="resonance: runs of another setup \\(max_steps differ\\)"):
        report.main([str(first), str(second)])


@pytest.mark.parametrize(("max_steps", "evaluations", "every"), [(300, 1, "300"), (1200, 4, "300"), (10, 3, "4")])
def test_validation_runs_evaluations_times_not_every_step(tmp_path, max_steps, evaluations, every):
    """eval_steps "1.0" would be read by the Trainer as every step: the recipe passes whole steps."""
    quality = load_benchmark("quality")
    args = quality.parse_args(["--max_steps", str(max_steps), "--evaluations", str(evaluations)])
    files = {split: tmp_path / f"{split}.jsonl" for split in ("train", "valid", "test")}
    argv = quality.run_argv("none", args, files, tmp_path / "tokenizer", 0, tmp_path / "out")
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--eval_steps"] == flags["--save_steps"] == every


def load_benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variants_given_alone_with_no_bart_trains_nothing_and_scores_the_anchors(tmp_path):
    """`--variants` with no mask trains no model from scratch: with --no_bart and no --init_from, only the anchors
    (copying the source, the human references) are scored, and no run folder is made. Runs of another setup are not
    added to the same runs.jsonl."""
    quality = load_benchmark("quality")
    runs = quality.main(["--quick", "--variants", "--no_bart", "--output_dir", str(tmp_path)])
    assert [run["model"] for run in runs] == ["human references", "copy-source"]
    assert not list(tmp_path.glob("*-seed*"))
    with pytest.raises(SystemExit, match=r"runs\.jsonl holds runs of another setup \(test differ\)"):
        quality.main(["--quick", "--variants", "--no_bart", "--max_test_samples", "5", "--output_dir", str(tmp_path)])


def test_bf16_reaches_every_models_trainer_and_a_cpu_is_named_for_it(tmp_path):
    """The training arguments run.py builds for every model (from scratch, BART, bert2bert, warm-started) have bf16,
    and use_cpu on a machine without a GPU (the Trainer asks for it before it autocasts a CPU); without --bf16, none."""
    import torch

    from cdnpg import training
    from tests.test_convert import save_with_tokenizer, tiny_bert

    quality = load_benchmark("quality")
    bert = save_with_tokenizer(tiny_bert(), tmp_path / "bert")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "how is the cat ?", "target": "is the cat ?"}) + "\n")
    files = dict.fromkeys(("train", "valid", "test"), pairs)
    for flags, bf16 in ((["--bf16"], True), ([], False)):
        args = quality.parse_args([*flags, "--init_from", str(bert), "--tokenizer", str(bert)])
        for name in ("none", "bart", "bert2bert", "warm-resonance"):
            argv = quality.run_argv(name, args, files, bert, 0, tmp_path / name)
            training_args = training.parse_args(argv)[2]
            cpu = bf16 and not torch.cuda.is_available()
            assert (training_args.bf16, training_args.use_cpu) == (bf16, cpu), (name, flags)


def test_the_copy_gate_and_the_data_options_reach_every_cdnpg_model_and_name_its_row(tmp_path):
    """--copy_mechanism, --drop_near_copies and --both_directions are run.py's flags of each C-DNPG model (from scratch and warm-started),
    never of BART or bert2bert, and the row names them: runs with and without copy are not averaged together."""
    from cdnpg import training
    from tests.test_convert import save_with_tokenizer, tiny_bert

    quality = load_benchmark("quality")
    bert = save_with_tokenizer(tiny_bert(), tmp_path / "bert")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "how is the cat ?", "target": "is the cat ?"}) + "\n")
    files = dict.fromkeys(("train", "valid", "test"), pairs)
    flags = [
        "--copy_mechanism",
        "learned",
        "--copy_common_tokens",
        "30",
        "--drop_near_copies",
        "50",
        "--both_directions",
        "--init_from",
        str(bert),
    ]
    args = quality.parse_args([*flags, "--tokenizer", str(bert)])
    assert quality.model_name("resonance", args) == "resonance+copy-learned-skip30+drop50+both"
    models = {
        "resonance+copy-learned+drop50+both": True,
        "warm-none+copy-learned+drop50+both": True,
        "bart": False,
        "bert2bert": False,
    }
    for name, cdnpg in models.items():
        model_args, data_args, _ = training.parse_args(quality.run_argv(name, args, files, bert, 0, tmp_path / name))
        given = (model_args.copy_mechanism, model_args.copy_common_tokens, data_args.drop_near_copies)
        assert (*given, data_args.both_directions) == (
            ("learned", 30, 50.0, True) if cdnpg else (None, None, None, False)
        )


def test_detail_retention_counts_the_numbers_and_rare_words_an_output_keeps():
    """Pooled over pairs: 1 of 2 numbers and 3 of 6 rare words reappear; common words and punctuation never count.
    The metric module reports the same as `numbers_kept` and `rare_kept` beside BLEU."""
    from cdnpg.training.paraphrase_metrics import common_words, detail_words, paraphrase_scores, retention

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
    sources = ["why did rbi introduce 2000 rupee notes ?", "is 7 a prime ?"]
    scores = paraphrase_scores(outputs, ["a", "b"], sources, common=common)
    assert scores["numbers_kept"] == 50.0 and scores["rare_kept"] == pytest.approx(50.0) and "bleu4" in scores
    assert "rare_kept" not in paraphrase_scores(outputs, ["a", "b"], sources)  # without the common words: no retention


def test_granularity_spread_is_zero_at_a_warm_start_and_shows_a_trained_head_in_its_own_layer(tmp_path):
    """A converted checkpoint starts at z = 0.5 for every token (W_G ~ 1e-6): no spread anywhere. Spreading one
    encoder layer's W_G shows in that layer's number only; the other heads, still at ~0, stay at ~0."""
    import torch

    from cdnpg.convert import convert
    from cdnpg.granularity import granularity_spread
    from tests.test_convert import save_with_tokenizer, tiny_bert

    model, tokenizer = convert(save_with_tokenizer(tiny_bert(), tmp_path / "bert"), granularity_mask="resonance")
    sentences = ["how is the cat ?", "is the cat on the mat ?", "the cat is"]

    def spread() -> dict[str, list[float]]:
        return granularity_spread(model, tokenizer, sentences, sentences[::-1])

    start = spread()
    assert [len(layers) for layers in start.values()] == [2, 2, 2]  # encoder, decoder, cross: 2 layers each
    assert max(max(layers) for layers in start.values()) < 1e-4
    torch.manual_seed(0)
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.granularity_head.proj.weight.normal_(0, 0.5)
    trained = spread()
    assert trained["encoder"][1] > 0.01 and trained["encoder"][0] < 1e-4
    assert max(trained["decoder"] + trained["cross"]) < 1e-4

    none, _ = convert(tmp_path / "bert", granularity_mask="none")
    assert granularity_spread(none, tokenizer, sentences, sentences) is None  # no granularity heads: nothing to say


def test_a_warm_start_only_run_records_no_from_scratch_sizes(tmp_path):
    """A run of warm starts alone takes its sizes and rate from the checkpoint: its settings (and the table's title)
    do not carry the from-scratch model's d_model, layers, heads, FFN or learning rate; a run with one does."""
    from tests.test_convert import save_with_tokenizer, tiny_bert

    quality = load_benchmark("quality")
    bert = save_with_tokenizer(tiny_bert(), tmp_path / "bert")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "how is the cat ?", "target": "is the cat ?"}) + "\n")
    files = dict.fromkeys(("train", "valid", "test"), pairs)
    warm = ["--init_from", str(bert), "--tokenizer", str(bert), "--warm_variants", "resonance", "--no_bart"]
    alone = quality.recipe(quality.parse_args([*warm, "--variants"]), files, bert, {})
    beside = quality.recipe(quality.parse_args([*warm, "--variants", "none"]), files, bert, {})
    sizes = {"d_model", "layers", "attention_heads", "ffn_dim", "learning_rate"}
    assert not sizes & set(alone) and alone["warm_learning_rate"] == 1e-4
    assert sizes <= set(beside) and beside["d_model"] == 450  # CDNPGConfig's default, the paper's
