"""Training and evaluation of C-DNPG, importable: `training/run.py` is `main()` (module `run`), and the benchmarks
call the same functions.

- `run`: `main`, read top to bottom as transformers' run_translation.py: arguments, logging, the launch and the CPU,
  the output folder, data, model, Trainer, train, save, evaluate, predict, card, push, for C-DNPG and for the
  baselines (`--architecture`); `one_line_errors`, the command line's error messages;
- `arguments`: `ModelArguments` (architecture flags default to CDNPGConfig's, the paper's), `DataArguments` (the data
  source is inferred from the data flags), `CDNPGTrainingArguments` (the paper's recipe), `parse_args` (full flag
  names only), `check_arguments` (what the flags must agree on before any data is read);
- `checks`: the launch and the hardware (processes launched together, the strategy that trains, --bf16 on a CPU that
  emulates it, the threads of a busy CPU);
- `output_dir`: the run's folder (one run at a time, refused when not empty, resumed, replaced; left as found by a run that stops before
  its first save) and the errors that say where the model is;
- `data`: pairs, tokenizer and features (`prepare_data`);
- `model`: the model to train (`build_model`), the calibration of z after training and the save;
- `trainer`: `CDNPGTrainer` (optimizer groups, the test split decoded as the checkpoint decodes, the card),
  `make_trainer`;
- `workarounds`: every workaround of a library limitation (DDP, FSDP2, prediction, resuming), each naming its version;
- `scoring`: the paper's metrics on the test split's predictions, the metrics files, the card's account of the run;
- `baselines`: transformers' BART of the same size, and bert2bert from a warm start's checkpoint;
- `paraphrase_metrics`: the paper's metrics as an `evaluate` module (`load_metric()`, or
  `evaluate.load(cdnpg.training.METRICS_SCRIPT)`).

Names load on first use (PEP 562): importing the package imports neither torch nor datasets.
"""

import importlib
from typing import Any

_EXPORTS = {
    "arguments": (
        "ARCHITECTURES", "DATASETS", "CDNPGTrainingArguments", "DataArguments", "ModelArguments", "UsageError",
        "check_arguments", "parse_args",
    ),
    "baselines": ("bart_config_like", "bart_like", "bert2bert"),
    "checks": ("check_bf16_on_cpu", "cpu_threads"),
    "data": ("describe_data", "hub_dataset", "load_pairs", "prepare_data", "tokenize"),
    "model": ("build_config", "build_model"),
    "output_dir": ("PostTrainingError", "TrainingInterrupted"),
    "run": ("main", "one_line_errors"),
    "scoring": ("METRICS_SCRIPT", "load_metric", "predict", "score", "write_predictions"),
    "trainer": ("CDNPGTrainer", "decoding_config", "make_trainer"),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
