"""The paper's metrics on a run's predictions: the `evaluate` module, beam search on the test split, the scores, the
predictions file, the metrics files, and the model card's account of the run."""

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import evaluate
from transformers import Seq2SeqTrainer

from cdnpg.training.checks import distributed_strategy
from cdnpg.training.paraphrase_metrics import common_words

METRICS_SCRIPT = Path(__file__).with_name("paraphrase_metrics.py")  # an `evaluate` module, shipped in the package


def load_metric() -> evaluate.EvaluationModule:
    """The paper's metrics through `evaluate`, tried on one sentence: a missing WordNet fails now, not after
    training."""
    metric = evaluate.load(str(METRICS_SCRIPT))
    metric.compute(predictions=["a test"], references=["a test"], sources=["a test"])
    return metric


def predict(trainer: Seq2SeqTrainer, features: datasets.Dataset) -> tuple[list[str], dict[str, float]]:
    """Beam search on a tokenized split with the model's decoding defaults: the texts, and the Trainer's metrics."""
    output = trainer.predict(features, metric_key_prefix="test")
    ids = output.predictions
    ids[ids < 0] = trainer.processing_class.pad_token_id  # the padding between batches of different lengths
    return trainer.processing_class.batch_decode(ids, skip_special_tokens=True), output.metrics


def predict_and_score(
    trainer: Seq2SeqTrainer,
    corpus: datasets.DatasetDict,
    features: datasets.Dataset,
    metric: evaluate.EvaluationModule,
) -> dict[str, float]:
    """Beam search on the tokenized test split (`features`) with the model's decoding defaults, scored with the paper's
    metrics against `corpus["test"]` (with the training text's `common_words`: the numbers and rare words kept), and
    written to `predictions.jsonl`. The Trainer's metrics and the scores, as `test_*` keys."""
    predictions, metrics = predict(trainer, features)
    if trainer.is_world_process_zero():
        texts = [*corpus["train"]["source"], *corpus["train"]["target"]] if "train" in corpus else []
        metrics.update(score(metric, predictions, corpus["test"], common_words(texts) if texts else None))
        write_predictions(Path(trainer.args.output_dir) / "predictions.jsonl", corpus["test"], predictions)
    return metrics


def score(
    metric: evaluate.EvaluationModule,
    predictions: Sequence[str],
    pairs: datasets.Dataset,
    common: set[str] | None = None,
) -> dict[str, float]:
    """The paper's metrics of the predictions against the pairs' targets and sources, as `test_*` keys; with the
    training text's `common_words`, also the numbers and rare source words the predictions keep (left out when the
    sources have none: their share is NaN)."""
    scores = metric.compute(
        predictions=list(predictions), references=pairs["target"], sources=pairs["source"], common=common
    )
    return {f"test_{key}": float(value) for key, value in scores.items() if not math.isnan(value)}


def write_predictions(path: str | os.PathLike, pairs: datasets.Dataset, predictions: Sequence[str]) -> None:
    """One JSON line per pair: source, reference, prediction."""
    with Path(path).open("w", encoding="utf-8") as out:
        for source, reference, predicted in zip(pairs["source"], pairs["target"], predictions, strict=True):
            row = {"source": source, "reference": reference, "prediction": predicted}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def record(trainer: Seq2SeqTrainer, split: str, new: dict[str, float], metrics: dict[str, float]) -> None:
    """Log the metrics of a stage, write them to `<split>_results.json` and `all_results.json`, and collect them."""
    trainer.log_metrics(split, new)
    trainer.save_metrics(split, new)
    metrics.update(new)


def training_summary(
    trainer: Seq2SeqTrainer,
    data: str,
    corpus: datasets.DatasetDict,
    metrics: dict[str, float],
    both_directions: bool = False,
) -> str:
    """The model card's account of the data (`data`: its words for the source, `describe_data`; the split sizes), the
    recipe and which model was kept. `both_directions`: the training
    split holds every pair and its reverse (run.py's --both_directions), which its size alone does not say."""
    args, state = trainer.args, trainer.state
    sizes = {split: f"{len(rows):,} {split}" for split, rows in corpus.items()}
    if both_directions and "train" in corpus:
        sizes["train"] += " (each pair also reversed: --both_directions)"
    splits = ", ".join(sizes.values())
    if args.load_best_model_at_end and state.best_metric is not None:
        selection = f"the checkpoint with the best validation {args.metric_for_best_model} ({state.best_metric:.4f})"
    else:
        selection = f"the model of the last step ({state.global_step})"
    if "eval_loss" in metrics:
        selection += f", validation loss {metrics['eval_loss']:.4f}"
    devices = f"{args.world_size} device{'s' if args.world_size > 1 else ''}"
    return (
        f"Trained on {data}, split into {splits} pairs; AdamW lr {args.learning_rate}, {args.lr_scheduler_type.value} schedule, "
        f"{args.warmup_steps:g} warm-up steps, batch {args.per_device_train_batch_size} per device x "
        f"{devices} ({distributed_strategy(trainer.accelerator)}), {state.global_step} steps; kept {selection}."
    )
