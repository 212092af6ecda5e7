"""`training/run.py`'s command line: the model flags are checked before torch and transformers are imported
(seconds of imports), so that `--model_name_or_path runs/nonexistent` fails at once, naming the flag; then every flag
is parsed and checked before the training pipeline's imports (datasets, evaluate: seconds more) and any data work;
then `main`."""

import json
import os
import sys
from pathlib import Path

MODEL_FLAGS = ("model_name_or_path", "init_from")  # flags that name a model to load


def model_flags(argv: list[str]) -> dict[str, str]:
    """The model flags of a command line as `parse_args` reads it: a JSON / YAML file given first, later flags
    overriding it."""
    values: dict[str, str] = {}
    if argv and argv[0].endswith((".json", ".yaml", ".yml")) and Path(argv[0]).is_file():
        text = Path(argv[0]).read_text()
        if argv[0].endswith(".json"):
            given = json.loads(text)
        else:
            import yaml

            given = yaml.safe_load(text)
        values.update({flag: str(given[flag]) for flag in MODEL_FLAGS if isinstance(given, dict) and given.get(flag)})
    for index, argument in enumerate(argv):
        for flag in MODEL_FLAGS:
            if argument == f"--{flag}" and index + 1 < len(argv):
                values[flag] = argv[index + 1]
            elif argument.startswith(f"--{flag}="):
                values[flag] = argument.split("=", 1)[1]
    return values


def cli(argv: list[str] | None = None) -> None:
    """`main` for the command line: a wrong flag, a missing file or model, or a failure after the save ends with its
    message (the log above it has the details), not a traceback."""
    from cdnpg.hub import resolve_model_source  # huggingface_hub only

    argv = list(sys.argv[1:] if argv is None else argv)
    program = Path(sys.argv[0]).name
    for flag, value in model_flags(argv).items():
        try:
            resolve_model_source(value)
        except FileNotFoundError as error:
            raise SystemExit(f"{program}: error: --{flag} {error}") from None

    from cdnpg.training.arguments import UsageError, check_arguments, configure_logging, parse_args

    configure_logging()
    try:
        arguments = parse_args(argv)
        check_arguments(*arguments)
    except UsageError as error:
        raise SystemExit(f"{program}: error: {error}") from None

    from cdnpg.data import DataFileError
    from cdnpg.training.output_dir import PostTrainingError, TrainingInterrupted
    from cdnpg.training.pipeline import main

    try:
        main(argv, arguments=arguments)
    except (UsageError, FileNotFoundError, DataFileError, PostTrainingError) as error:
        raise SystemExit(f"{program}: error: {error}") from None
    except TrainingInterrupted as stop:  # every process of a launch gets the signal: one line, from the first
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{chr(10) if stop.progress_bar else ''}{program}: {stop}", file=sys.stderr)
        raise SystemExit(130) from None  # 128 + SIGINT, as the shell reports an interrupted command
