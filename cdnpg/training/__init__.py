"""Training and evaluation of C-DNPG, importable: `training/run.py` is `cli()`, and the benchmarks call the same
functions.

- `arguments`: `ModelArguments` (architecture flags default to CDNPGConfig's, the paper's), `DataArguments` (the data
  source is inferred from the data flags), `CDNPGTrainingArguments` (the paper's recipe), `parse_args`;
- `pipeline`: data and tokenizer, model, `CDNPGTrainer`, then train, save, evaluate, predict and score (`main`);
- `baselines`: transformers' BART of the same size;
- `paraphrase_metrics`: the paper's metrics as an `evaluate` module (`load_metric()`, or
  `evaluate.load(cdnpg.training.METRICS_SCRIPT)`).
"""

from cdnpg.training.arguments import (
    DATASETS,
    CDNPGTrainingArguments,
    DataArguments,
    ModelArguments,
    UsageError,
    parse_args,
)
from cdnpg.training.baselines import bart_config_like, bart_like
from cdnpg.training.pipeline import (
    METRICS_SCRIPT,
    CDNPGTrainer,
    PostTrainingError,
    build_config,
    build_model,
    cli,
    data_name,
    decoding_config,
    load_metric,
    load_pairs,
    main,
    make_trainer,
    predict,
    prepare_data,
    score,
    tokenize,
    train_and_score,
    write_predictions,
)

__all__ = [
    "DATASETS",
    "METRICS_SCRIPT",
    "CDNPGTrainer",
    "CDNPGTrainingArguments",
    "DataArguments",
    "ModelArguments",
    "PostTrainingError",
    "UsageError",
    "bart_config_like",
    "bart_like",
    "build_config",
    "build_model",
    "cli",
    "data_name",
    "decoding_config",
    "load_metric",
    "load_pairs",
    "main",
    "make_trainer",
    "parse_args",
    "predict",
    "prepare_data",
    "score",
    "tokenize",
    "train_and_score",
    "write_predictions",
]
