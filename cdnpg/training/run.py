"""`main()`, what `training/run.py` runs, top to bottom as transformers' examples/pytorch/translation/run_translation.py
reads: arguments → logging → the launch and the CPU → the output folder → seed → data → model → Trainer → train →
save → evaluate → predict → model card → push. Data preparation (`data`), the model (`model`), the metrics
(`scoring`), the output folder's rules (`output_dir`) and the library workarounds (`workarounds`) are modules of
their own.

Every mistake of the user's stops the run before any data work; a run that fails or is stopped before its first save
leaves the output folder as it found it; the model is on disk before anything that could fail after training
(evaluation, scoring, the model card, the push) runs.
"""

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import transformers
from transformers import EarlyStoppingCallback, TrainerCallback, set_seed

from cdnpg.data import DataFileError
from cdnpg.hub import checkpoint_name
from cdnpg.training.arguments import CDNPGTrainingArguments, UsageError, check_arguments, configure_logging, parse_args
from cdnpg.training.checks import check_bf16_on_cpu, check_distributed_launch, choose_cpu_threads, report_strategy
from cdnpg.training.data import hub_dataset, prepare_data
from cdnpg.training.model import build_model, load_checkpoint, save_trained_model
from cdnpg.training.output_dir import (
    PostTrainingError,
    TrainingInterrupted,
    model_kept_on_failure,
    prepared_output_dir,
    run_lock,
    terminate_as_interrupt,
)
from cdnpg.training.scoring import load_metric, predict_and_score, record, training_summary
from cdnpg.training.trainer import make_trainer

logger = logging.getLogger("cdnpg.training")


def main(argv: list[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, float]:
    """Train, save, evaluate and score a C-DNPG paraphraser (or, with `--architecture`, a baseline of transformers'
    own) as `argv` (flags, or a JSON / YAML file given first) says; returns every metric. A wrong flag or input raises `UsageError`, Ctrl-C or `kill` `TrainingInterrupted` (naming
    the checkpoint to resume from), a failure after the save `PostTrainingError` (naming where the model is)."""
    argv = list(sys.argv[1:] if argv is None else argv)

    # Arguments: every flag is checked before any data is read
    configure_logging()
    model_args, data_args, training_args = parse_args(argv)
    check_arguments(model_args, data_args, training_args)

    # Logging
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.setLevel(training_args.get_process_log_level())

    # The launch and the CPU
    check_distributed_launch(training_args)
    check_bf16_on_cpu(training_args)
    choose_cpu_threads(training_args)

    # The output folder: one run at a time; an earlier run there is refused, resumed or replaced; put back if this run
    # stops before a save
    inputs = [
        model_args.model_name_or_path, model_args.init_from, model_args.tokenizer_name, data_args.train_file,
        data_args.validation_file, data_args.test_file, data_args.quora_file, data_args.twitter_train_file,
    ]  # fmt: skip
    output_dir, metrics = training_args.output_dir, {}
    with (
        terminate_as_interrupt(),
        interrupted(training_args, argv),
        run_lock(training_args, argv),
        prepared_output_dir(training_args, inputs, argv) as start_training,
    ):
        # A checkpoint that does not load, or a missing WordNet for METEOR, fails now, before any data work
        checkpoint = load_checkpoint(model_args.model_name_or_path) if model_args.model_name_or_path else None
        metric = load_metric() if training_args.do_predict else None
        set_seed(training_args.seed)

        # Data: pairs, tokenizer (trained on the training split unless given) and features
        corpus, data, tokenizer, features = prepare_data(model_args, data_args, training_args)

        # Model
        model = checkpoint or build_model(model_args, tokenizer, features.get("train"))
        cdnpg = model.config.model_type == "cdnpg"
        name = f"C-DNPG ({model.config.granularity_mask})" if cdnpg else f"{type(model).__name__} (a baseline)"
        logger.info("%s: %s parameters", name, f"{model.num_parameters():,}")

        # Trainer
        if data_args.early_stopping_patience:
            callbacks = [*callbacks, EarlyStoppingCallback(data_args.early_stopping_patience)]
        trainer = make_trainer(model, tokenizer, features, training_args, data_args.max_target_length, callbacks)
        report_strategy(trainer.accelerator)

        # Training
        start_training()
        if training_args.do_train:
            train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
            trainer.save_state()
            record(trainer, "train", train_result.metrics, metrics)

        # Save: the decoding defaults, z calibrated, the weights
        save_trained_model(trainer, corpus, data_args.max_target_length)

        # Evaluation on the validation split
        if training_args.do_eval and "validation" in features:
            with model_kept_on_failure(output_dir, "evaluation on the validation split"):
                record(trainer, "eval", trainer.evaluate(features["validation"], metric_key_prefix="eval"), metrics)

        # Prediction: the test split decoded and scored with the paper's metrics, predictions.jsonl
        if training_args.do_predict and "test" in features:
            with model_kept_on_failure(output_dir, "generation and scoring of the test split"):
                record(trainer, "test", predict_and_score(trainer, corpus, features["test"], metric), metrics)

        # Model card and push
        with model_kept_on_failure(output_dir, "writing the model card"):
            trainer.write_model_card(
                metrics={key.removeprefix("test_"): v for key, v in metrics.items() if key.startswith("test_")},
                dataset=hub_dataset(data_args),
                demo_corpus=data_args.dataset == "template",
                training_summary=training_summary(
                    trainer, data, corpus, metrics, both_directions=data_args.both_directions
                ),
                max_length=data_args.max_source_length,
                warm_start=checkpoint_name(model_args.init_from) if model_args.init_from else None,
            )
        if training_args.push_to_hub:
            with model_kept_on_failure(output_dir, "the push to the Hub"):
                trainer.push_to_hub(commit_message="C-DNPG checkpoint")
    if training_args.process_index == 0 and cdnpg:  # the last line, after the metrics the Trainer prints
        print(f"Try the model on a page: cdnpg demo --model {output_dir} (pip install -e '.[demo]' first)")
    return metrics


@contextmanager
def interrupted(args: CDNPGTrainingArguments, argv: Sequence[str]) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) as `TrainingInterrupted`, whose message names the checkpoint to resume from."""
    try:
        yield
    except KeyboardInterrupt:
        raise TrainingInterrupted(args.output_dir, argv, progress_bar=not args.disable_tqdm) from None


@contextmanager
def one_line_errors() -> Iterator[None]:
    """`training/run.py`'s command line: a wrong flag, a missing file or model, or a failure after the save ends with
    its message (the log above it has the details), not a traceback; Ctrl-C with one line and the exit code 130. In a
    launch of several processes, the first one says it."""
    program, first = Path(sys.argv[0]).name, int(os.environ.get("RANK", "0")) == 0
    try:
        yield
    except (UsageError, FileNotFoundError, DataFileError, PostTrainingError) as error:  # alike in every process
        raise SystemExit(f"{program}: error: {error}" if first else 1) from None
    except TrainingInterrupted as stop:  # every process of a launch gets the signal
        if first:
            print(f"{chr(10) if stop.progress_bar else ''}{program}: {stop}", file=sys.stderr)
        raise SystemExit(130) from None  # 128 + SIGINT, as the shell reports an interrupted command
