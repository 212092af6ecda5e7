"""Training and evaluation of C-DNPG, importable: `training/run.py` is `cli()`, and the benchmarks call the same
functions.

- `arguments`: `ModelArguments` (architecture flags default to CDNPGConfig's, the paper's), `DataArguments` (the data
  source is inferred from the data flags), `CDNPGTrainingArguments` (the paper's recipe), `parse_args`;
- `pipeline`: data and tokenizer, model, `CDNPGTrainer`, then train, save, evaluate, predict and score (`main`);
- `baselines`: transformers' BART of the same size;
- `paraphrase_metrics`: the paper's metrics as an `evaluate` module (`load_metric()`, or
  `evaluate.load(cdnpg.training.METRICS_SCRIPT)`);
- `entry`: `cli()`, the command line.

Names load on first use (PEP 562): `training/run.py` checks its model flags before torch and transformers are
imported, so that a missing model fails at once.
"""

import importlib
from typing import Any

_EXPORTS = {
    "arguments": ("DATASETS", "CDNPGTrainingArguments", "DataArguments", "ModelArguments", "UsageError", "parse_args"),
    "baselines": ("bart_config_like", "bart_like"),
    "entry": ("cli",),
    "pipeline": (
        "METRICS_SCRIPT", "CDNPGTrainer", "PostTrainingError", "TrainingInterrupted", "build_config", "build_model",
        "check_bf16_on_cpu", "data_name", "decoding_config", "load_metric", "load_pairs", "main", "make_trainer",
        "predict", "prepare_data", "score", "tokenize", "train_and_score", "write_predictions",
    ),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
