"""Training and evaluation of C-DNPG, importable: `training/run.py` is `cli()`, and the benchmarks call the same
functions.

- `arguments`: `ModelArguments` (architecture flags default to CDNPGConfig's, the paper's), `DataArguments` (the data
  source is inferred from the data flags), `CDNPGTrainingArguments` (the paper's recipe), `parse_args` (full flag
  names only), `check_arguments` (what the flags must agree on before any data is read);
- `pipeline`: `main`, what run.py does, top to bottom: parse, check, output folder, data, model, Trainer, then train,
  save, evaluate, predict and score (`train_and_score`), write the card, push;
- `checks`: the launch and the hardware (processes launched together, --bf16 on a CPU that emulates it);
- `output_dir`: the run's folder (refused when not empty, resumed, replaced; left as found by a run that fails before
  training) and the errors that say where the model is;
- `data`: pairs, tokenizer and features (`prepare_data`);
- `model`: the model to train (`build_model`) and the calibration of z after training;
- `trainer`: `CDNPGTrainer` (optimizer groups, decoding defaults, the card, the DDP / FSDP workarounds), `make_trainer`;
- `scoring`: the paper's metrics on the test split's predictions, the metrics files, the card's account of the run;
- `baselines`: transformers' BART of the same size, and bert2bert from a warm start's checkpoint;
- `paraphrase_metrics`: the paper's metrics as an `evaluate` module (`load_metric()`, or
  `evaluate.load(cdnpg.training.METRICS_SCRIPT)`);
- `entry`: `cli()`, the command line.

Names load on first use (PEP 562): `training/run.py` checks its model flags before torch and transformers are
imported, so that a missing model fails at once.
"""

import importlib
from typing import Any

_EXPORTS = {
    "arguments": (
        "DATASETS", "CDNPGTrainingArguments", "DataArguments", "ModelArguments", "UsageError", "check_arguments",
        "parse_args",
    ),
    "baselines": ("bart_config_like", "bart_like", "bert2bert"),
    "entry": ("cli",),
    "checks": ("check_bf16_on_cpu",),
    "data": ("data_name", "load_pairs", "prepare_data", "tokenize"),
    "model": ("build_config", "build_model"),
    "output_dir": ("PostTrainingError", "TrainingInterrupted"),
    "pipeline": ("main", "train_and_score"),
    "scoring": ("METRICS_SCRIPT", "load_metric", "predict", "score", "write_predictions"),
    "trainer": ("CDNPGTrainer", "decoding_config", "make_trainer"),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
