"""What `training/run.py` does (`main`), in order: parse and check the flags, check the launch, prepare the output
folder, load the checkpoint to fine-tune, data and tokenizer, model, `CDNPGTrainer`, then train, save, evaluate,
generate and score, so that every mistake of the user's stops the run before any data work, a failure before training
leaves the output folder as it was, and the weights are on disk before anything that could fail after training
(evaluation, scoring, the model card, the push) runs. Each step is a module of its own (`data`, `model`, `trainer`,
`scoring`, `output_dir`, `checks`); the benchmarks reuse them."""

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import datasets
import evaluate
import transformers
from transformers import EarlyStoppingCallback, Seq2SeqTrainer, TrainerCallback, set_seed

from cdnpg.hub import checkpoint_name
from cdnpg.training.arguments import (
    CDNPGTrainingArguments,
    DataArguments,
    ModelArguments,
    check_arguments,
    configure_logging,
    parse_args,
)
from cdnpg.training.checks import check_bf16_on_cpu, check_distributed_launch
from cdnpg.training.data import data_name, prepare_data
from cdnpg.training.model import build_model, calibrate, load_checkpoint
from cdnpg.training.output_dir import TrainingInterrupted, model_kept_on_failure, prepared_output_dir
from cdnpg.training.paraphrase_metrics import common_words
from cdnpg.training.scoring import load_metric, predict, record, score, training_summary, write_predictions
from cdnpg.training.trainer import make_trainer, report_strategy, run_decoding_config

logger = logging.getLogger("cdnpg.training")
CALIBRATION_TEXTS = 2000  # training sources that calibrate_granularity reads (word frequencies and z): seconds
Arguments = tuple[ModelArguments, DataArguments, CDNPGTrainingArguments]


def main(
    argv: list[str] | None = None, callbacks: Sequence[TrainerCallback] = (), arguments: Arguments | None = None
) -> dict[str, float]:
    """`training/run.py`: parse and check the flags (or a JSON / YAML file; `arguments`: already parsed and checked
    from `argv`), train, save, score, write the card, push. Ctrl-C raises `TrainingInterrupted`, which names the
    checkpoint to resume from."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if arguments is None:
        configure_logging()
        arguments = parse_args(argv)
        check_arguments(*arguments)
    model_args, data_args, training_args = arguments
    try:
        return run(model_args, data_args, training_args, callbacks)
    except KeyboardInterrupt:
        raise TrainingInterrupted(
            training_args.output_dir, argv, progress_bar=not training_args.disable_tqdm
        ) from None


def run(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: CDNPGTrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> dict[str, float]:
    """`main` after parsing and checking the flags."""
    configure_logging()
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.setLevel(training_args.get_process_log_level())
    check_distributed_launch(training_args)
    check_bf16_on_cpu(training_args)
    inputs = [
        model_args.model_name_or_path, model_args.init_from, model_args.tokenizer_name, data_args.train_file,
        data_args.validation_file, data_args.test_file, data_args.quora_file, data_args.twitter_train_file,
    ]  # fmt: skip
    with prepared_output_dir(training_args, inputs) as start_training:
        # a checkpoint that does not load (truncated, corrupt) fails here, before any data work
        checkpoint = load_checkpoint(model_args.model_name_or_path) if model_args.model_name_or_path else None
        metric = load_metric() if training_args.do_predict else None
        set_seed(training_args.seed)

        corpus, tokenizer, features = prepare_data(model_args, data_args, training_args)
        model = checkpoint or build_model(model_args, tokenizer, features.get("train"))
        logger.info("C-DNPG (%s): %s parameters", model.config.granularity_mask, f"{model.num_parameters():,}")
        callbacks = list(callbacks)
        if data_args.early_stopping_patience:
            callbacks.append(EarlyStoppingCallback(data_args.early_stopping_patience))
        trainer = make_trainer(model, tokenizer, features, training_args, data_args.max_target_length, callbacks)
        report_strategy(trainer)
        start_training()

        metrics = train_and_score(trainer, corpus, features, metric, data_args.max_target_length)
        output_dir = training_args.output_dir
        with model_kept_on_failure(output_dir, "writing the model card"):
            trainer.write_model_card(
                metrics={k.removeprefix("test_"): v for k, v in metrics.items() if k.startswith("test_")},
                dataset=data_name(data_args),
                training_summary=training_summary(
                    trainer, data_name(data_args), corpus, metrics, both_directions=data_args.both_directions
                ),
                max_length=data_args.max_source_length,
                warm_start=checkpoint_name(model_args.init_from) if model_args.init_from else None,
            )
        if training_args.push_to_hub:
            with model_kept_on_failure(output_dir, "the push to the Hub"):
                trainer.push_to_hub(commit_message="C-DNPG checkpoint")
    return metrics


def train_and_score(
    trainer: Seq2SeqTrainer,
    corpus: datasets.DatasetDict,
    features: datasets.DatasetDict,
    metric: evaluate.EvaluationModule | None,
    max_new_tokens: int,
) -> dict[str, float]:
    """Train (when `do_train`), save the model, evaluate on the validation split, generate and score the test split
    (when `do_predict`), writing `predictions.jsonl`. Returns every metric; a failure after the save raises
    `PostTrainingError`."""
    args, output_dir = trainer.args, trainer.args.output_dir
    metrics: dict[str, float] = {}
    if args.do_train:
        result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        trainer.save_state()
        record(trainer, "train", result.metrics, metrics)
    # Seq2SeqTrainer leaves every generation default in the config (max_length too): save only what was chosen
    trainer.model.generation_config = run_decoding_config(trainer.model, args, max_new_tokens)
    if args.do_train:
        calibrate(trainer.model, trainer.processing_class, corpus["train"]["source"][:CALIBRATION_TEXTS])
    trainer.save_model()
    if "validation" in features and args.do_eval:
        with model_kept_on_failure(output_dir, "evaluation on the validation split"):
            record(trainer, "eval", trainer.evaluate(features["validation"], metric_key_prefix="eval"), metrics)
    if args.do_predict and "test" in features:
        with model_kept_on_failure(output_dir, "generation and scoring of the test split"):
            predictions, test_metrics = predict(trainer, features["test"])
            if trainer.is_world_process_zero():
                texts = [*corpus["train"]["source"], *corpus["train"]["target"]] if "train" in corpus else []
                common = common_words(texts) if texts else None  # what counts as a rare word: numbers_kept, rare_kept
                test_metrics.update(score(metric, predictions, corpus["test"], common))
                write_predictions(Path(output_dir) / "predictions.jsonl", corpus["test"], predictions)
            record(trainer, "test", test_metrics, metrics)
    return metrics
