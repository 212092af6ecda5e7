#!/usr/bin/env python
"""Paraphrase quality of C-DNPG's granularity masks, the plain Transformer and transformers' BART, one recipe.

    # CPU-sized run on the shared Quora pairs (see docs/benchmarks.md for the numbers and the exact command)
    python benchmarks/quality.py --d_model 256 --attention_heads 4 --max_steps 3000 --learning_rate 5e-4 \
        --warmup_steps 300 --max_test_samples 1000 --plot quality.png
    # the paper's budget on a GPU
    python benchmarks/quality.py --tokenizer ../shared/tokenizers/bert-base-uncased --max_steps 100000 \
        --learning_rate 5e-5 --warmup_steps 5000 --batch_size 32 --output_dir runs/quality-paper
    # tiny model, template corpus, a few steps: < 2 minutes (the smoke test)
    python benchmarks/quality.py --quick --output_dir /tmp/quality

Every model is trained with the same recipe, data, tokenizer and seed, selected by validation loss, and decoded the same
way (beam 8, at most 20 new tokens) on the same test file, then scored by `training/paraphrase_metrics` (iBLEU,
the released code's "iBLEU" `ibleu_paper`, BLEU-2/4, ROUGE-L, METEOR, sacreBLEU, self-BLEU-4):

- each `--variants` granularity mask ("none" is the plain Transformer), trained by `training/run.py` in a subprocess;
- `BartForConditionalGeneration` of the same size (post-LN, learned positions, ReLU, tied embeddings,
  `scale_embedding=False`; BART additionally has `layernorm_embedding` and `final_logits_bias`), trained in this
  process by `Seq2SeqTrainer` on the features of `run.tokenize`, so preprocessing is identical;
- "copy-source", the trivial baseline that outputs its input: a high BLEU-4 on Quora, and a low true iBLEU.

Data: by default the shared Quora pairs (../shared/data/quora): train.jsonl for training, and the paper's 4,000-pair
validation set split in two, the first 2,000 pairs for validation (model selection), the last 2,000 as the test split
(the paper's test set is not used). The two halves are written into `--output_dir/data`. With `--quick`, the embedded
template corpus is written there instead, so the smoke test needs nothing outside the project.

Results: `--output_dir/results.json` (rewritten after every model: per model and seed, all metrics, the number of
steps, the best validation loss and the wall time; the configuration and the machine) and a markdown table on stdout,
with the paper's Table 2 Quora numbers beside it (mean ± std over `--seeds` when several).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
for path in (ROOT, ROOT / "training"):  # runnable as `python benchmarks/quality.py` from anywhere
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import evaluate  # noqa: E402
import run as cdnpg_run  # noqa: E402  (training/run.py)
import torch  # noqa: E402
import transformers  # noqa: E402
from bart_baseline import bart_config_like  # noqa: E402
from transformers import (  # noqa: E402
    BartForConditionalGeneration,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    Seq2SeqTrainer,
    set_seed,
)

from cdnpg.data import load_tokenizer, save_tokenizer, train_wordpiece_tokenizer, write_template_corpus  # noqa: E402

VARIANTS = ("none", "resonance", "scope", "product", "mean")
BART, COPY = "bart", "copy-source"
NUM_BEAMS, MAX_NEW_TOKENS = 8, 20  # the paper's decoding (Section 4.2)
# Gu et al. 2022, Table 2, Quora: ("iBLEU" as the released code computes it, i.e. `ibleu_paper`; BLEU-4).
# Trained on 100K pairs, the paper's model size, 5,000 warm-up steps; the test set is not the one used here.
PAPER_QUORA = {"none": (21.14, 26.88), "resonance": (26.94, 34.05)}
METRIC_KEYS = ("ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4")
COLUMN_NAMES = ("iBLEU", "iBLEU (paper's code)", "BLEU-2", "BLEU-4", "ROUGE-L", "METEOR", "sacreBLEU", "self-BLEU-4")
ROW_NAMES = {
    "none": "Transformer (none)",
    "resonance": "C-DNPG resonance (R)",
    "scope": "C-DNPG scope (S)",
    "product": "C-DNPG product (R·S)",
    "mean": "C-DNPG mean ((R+S)/2)",
    BART: "BART (transformers, same size)",
    COPY: "copy the source",
}
# --quick: tiny model on the template corpus, a handful of steps and test sentences
QUICK = dict(
    d_model=32, layers=2, attention_heads=4, ffn_dim=64, vocab_size=600, max_steps=12, warmup_steps=2,
    learning_rate=1e-3, batch_size=16, eval_batch_size=32, max_test_samples=12, evaluations=2, threads=1,
)  # fmt: skip
QUICK_CORPUS = dict(num_train=400, num_valid=40, num_test=40)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    quora = SHARED / "data" / "quora"
    parser.add_argument("--train_file", default=None, help=f"training pairs (default: {quora / 'train.jsonl'})")
    parser.add_argument(
        "--valid_file",
        default=None,
        help="validation pairs (default: the first 2,000 of the shared Quora valid.jsonl)",
    )
    parser.add_argument("--test_file", default=None, help="test pairs (default: the last 2,000 of the same file)")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory (default: train a WordPiece vocabulary on the train file)",
    )
    parser.add_argument("--vocab_size", type=int, default=8000, help="size of the trained WordPiece vocabulary")
    parser.add_argument("--variants", nargs="+", default=["none", "resonance", "scope"], choices=VARIANTS)
    parser.add_argument("--no_bart", action="store_true", help="skip the transformers BART baseline")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed; mean ± std when several")
    parser.add_argument("--d_model", type=int, default=450, help="hidden size (paper: 450)")
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each (paper: 3)")
    parser.add_argument("--attention_heads", type=int, default=9, help="attention heads (paper: 9)")
    parser.add_argument("--ffn_dim", type=int, default=1024, help="feed-forward inner size (released code: 1024)")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout (residual, attention, FFN)")
    parser.add_argument("--max_steps", type=int, default=3000, help="training steps of every model")
    parser.add_argument("--learning_rate", type=float, default=5e-4, help="AdamW peak learning rate (paper: 5e-5)")
    parser.add_argument("--warmup_steps", type=int, default=300, help="linear warm-up steps (paper: 5,000)")
    parser.add_argument("--batch_size", type=int, default=32, help="training batch size (paper: 32)")
    parser.add_argument("--eval_batch_size", type=int, default=64, help="batch size of validation and beam search")
    parser.add_argument("--evaluations", type=int, default=5, help="validation-loss checks (and checkpoints) per run")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads per process (default: torch's); 1 is fastest on a CPU shared with other jobs",
    )
    parser.add_argument("--max_test_samples", type=int, default=None, help="score only the first N test pairs")
    parser.add_argument("--output_dir", default="runs/quality", help="runs, data splits, results.json")
    parser.add_argument("--plot", default=None, help="write a bar chart of iBLEU and BLEU-4 per model to this file")
    parser.add_argument("--quick", action="store_true", help="tiny model on the template corpus: < 2 minutes")
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="train nothing: print the table (and --plot) of OUTPUT_DIR/results.json",
    )
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for name in ("d_model", "layers", "attention_heads", "ffn_dim", "max_steps", "batch_size", "evaluations"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be positive, got {getattr(args, name)}")
    if args.d_model % args.attention_heads:
        raise SystemExit(f"--d_model {args.d_model} is not divisible by --attention_heads {args.attention_heads}")
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"--seeds repeats a seed: {args.seeds}")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def prepare_data(args: argparse.Namespace, data_dir: Path) -> dict[str, Path]:
    """The train / valid / test files every model uses: the flags, the template corpus (--quick) or shared Quora."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.quick and not (args.train_file or args.valid_file or args.test_file):
        written = write_template_corpus(data_dir, seed=0, **QUICK_CORPUS)
        return {"train": written["train"], "valid": written["valid"], "test": written["test"]}
    quora = SHARED / "data" / "quora"
    files = {"train": args.train_file, "valid": args.valid_file, "test": args.test_file}
    if files["train"] is None:
        files["train"] = quora / "train.jsonl"
    if files["valid"] is None or files["test"] is None:
        lines = _read_lines(quora / "valid.jsonl")
        half = len(lines) // 2  # 4,000 pairs: the first 2,000 validate, the last 2,000 test
        for split, rows in (("valid", lines[:half]), ("test", lines[half:])):
            if files[split] is None:
                files[split] = data_dir / f"{split}.jsonl"
                files[split].write_text("".join(rows), encoding="utf-8")
    for split, path in files.items():
        if not Path(path).is_file():
            raise SystemExit(f"{split} file not found: {path}")
    return {split: Path(path).resolve() for split, path in files.items()}


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass --train_file/--valid_file/--test_file, or --quick")
    return [line if line.endswith("\n") else line + "\n" for line in path.read_text(encoding="utf-8").splitlines()]


def prepare_tokenizer(args: argparse.Namespace, train_file: Path, out_dir: Path) -> Path:
    """A tokenizer directory shared by every model: --tokenizer, or WordPiece trained once on the train split."""
    if args.tokenizer:
        load_tokenizer(args.tokenizer)  # fail now if it does not load
        return Path(args.tokenizer).resolve() if Path(args.tokenizer).exists() else Path(args.tokenizer)
    if not (out_dir / "tokenizer.json").is_file():
        rows = [json.loads(line) for line in train_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts = [text for row in rows for text in (row["source"], row["target"])]
        save_tokenizer(train_wordpiece_tokenizer(texts, vocab_size=args.vocab_size), out_dir)
    return out_dir.resolve()


# ---------------------------------------------------------------------------------------------------------------------
# The shared recipe
# ---------------------------------------------------------------------------------------------------------------------


def recipe_argv(args: argparse.Namespace, files: dict[str, Path], tokenizer: Path, seed: int, out: Path) -> list[str]:
    """`training/run.py` flags shared by every model: data, sizes, optimiser, schedule, selection, decoding."""
    argv = [
        "--dataset", "files",
        "--train_file", str(files["train"]),
        "--validation_file", str(files["valid"]),
        "--test_file", str(files["test"]),
        "--tokenizer_name", str(tokenizer),
        "--d_model", str(args.d_model),
        "--layers", str(args.layers),
        "--attention_heads", str(args.attention_heads),
        "--ffn_dim", str(args.ffn_dim),
        "--dropout", str(args.dropout),
        "--output_dir", str(out),
        "--do_train", "true", "--do_eval", "true", "--do_predict", "true",
        "--max_steps", str(args.max_steps),
        "--learning_rate", str(args.learning_rate),
        "--warmup_steps", str(args.warmup_steps),
        "--per_device_train_batch_size", str(args.batch_size),
        "--per_device_eval_batch_size", str(args.eval_batch_size),
        "--eval_strategy", "steps", "--save_strategy", "steps",  # selection by validation loss, every 1/evaluations
        "--eval_steps", str(1 / args.evaluations), "--save_steps", str(1 / args.evaluations),
        "--save_only_model", "true",
        "--logging_steps", str(max(1, args.max_steps // 20)),
        "--generation_num_beams", str(NUM_BEAMS),
        "--seed", str(seed),
        "--dataloader_pin_memory", "false",
        "--report_to", "none",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    if args.max_test_samples:
        argv += ["--max_predict_samples", str(args.max_test_samples)]
    return argv


def train_cdnpg(variant: str, argv: list[str], log_path: Path, threads: int | None) -> dict[str, float]:
    """One `training/run.py` run in a subprocess (memory is returned between models); its metrics.json."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, str(ROOT / "training" / "run.py"), "--granularity_mask", variant, *argv]
    with log_path.open("w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"training/run.py --granularity_mask {variant} failed (log: {log_path}):\n{tail}")
    out_dir = Path(argv[argv.index("--output_dir") + 1])
    return json.loads((out_dir / "metrics.json").read_text())


def build_bart(model_args, tokenizer) -> BartForConditionalGeneration:
    """BART with C-DNPG's dimensions and special tokens; what differs is BART's own (layernorm_embedding,
    final_logits_bias) and the attention (no granularity mask)."""
    config = bart_config_like(cdnpg_run.build_config(model_args, tokenizer))
    model = BartForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        num_beams=NUM_BEAMS,
        max_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
    return model


def train_bart(argv: list[str], metric) -> dict[str, float]:
    """BART through `Seq2SeqTrainer` with run.py's arguments, data loading and tokenization, in this process."""
    model_args, data_args, training_args = cdnpg_run.parse_args(argv)
    set_seed(training_args.seed)
    corpus = cdnpg_run.load_pairs(data_args)
    tokenizer = load_tokenizer(model_args.tokenizer_name)
    features = cdnpg_run.tokenize(corpus, tokenizer, data_args)
    model = build_bart(model_args, tokenizer)
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=features["train"],
        eval_dataset=features["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
    )
    metrics = dict(trainer.train().metrics)
    metrics.update(trainer.evaluate(features["validation"], metric_key_prefix="eval"))
    prediction = trainer.predict(features["test"], metric_key_prefix="test")
    metrics.update(prediction.metrics)
    ids = prediction.predictions
    ids[ids < 0] = tokenizer.pad_token_id
    predictions = tokenizer.batch_decode(ids, skip_special_tokens=True)
    test = corpus["test"]
    scores = metric.compute(predictions=predictions, references=test["target"], sources=test["source"])
    metrics.update({f"test_{k}": float(v) for k, v in scores.items()})
    metrics["best_metric"] = trainer.state.best_metric
    metrics["global_step"] = trainer.state.global_step
    out_dir = Path(training_args.output_dir)
    write_predictions(out_dir / "predictions.jsonl", test["source"], test["target"], predictions)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def copy_source(files: dict[str, Path], max_test_samples: int | None, metric, out_dir: Path) -> dict[str, float]:
    """The trivial baseline: the prediction is the source sentence itself."""
    rows = [json.loads(line) for line in files["test"].read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = rows[:max_test_samples] if max_test_samples else rows
    sources, targets = [row["source"] for row in rows], [row["target"] for row in rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_predictions(out_dir / "predictions.jsonl", sources, targets, sources)
    scores = metric.compute(predictions=sources, references=targets, sources=sources)
    return {f"test_{k}": float(v) for k, v in scores.items()}


def write_predictions(path: Path, sources, references, predictions) -> None:
    with path.open("w", encoding="utf-8") as out:
        for source, reference, predicted in zip(sources, references, predictions, strict=True):
            out.write(json.dumps({"source": source, "reference": reference, "prediction": predicted}) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------------


def summarize(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Mean and (sample) standard deviation over seeds of every metric; std is 0 for a single seed."""
    summary = {}
    for key in METRIC_KEYS:
        values = [run["metrics"][key] for run in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[key] = {"mean": statistics.fmean(values), "std": std, "n": len(values)}
    return summary


def record(results: dict, name: str, seed: int, raw: dict[str, float], wall_s: float) -> None:
    metrics = {key.removeprefix("test_"): value for key, value in raw.items() if key.startswith("test_")}
    entry = results["models"].setdefault(name, {"runs": []})
    entry["runs"] = [run for run in entry["runs"] if run["seed"] != seed]
    entry["runs"].append(
        {
            "seed": seed,
            "metrics": {k: v for k, v in metrics.items() if k in METRIC_KEYS or k == "sacrebleu_self"},
            "steps": raw.get("global_step", raw.get("train_global_step")),
            "best_validation_loss": raw.get("best_metric", raw.get("eval_loss")),
            "eval_loss": raw.get("eval_loss"),
            "wall_s": round(wall_s, 1),
        }
    )
    entry["summary"] = summarize(entry["runs"])


def previous_runs(path: Path, config: dict) -> dict:
    """The models of an earlier results.json with the same setup, so that `--seeds 1` adds runs to a `--seeds 0` run.

    Any difference in data, sizes or recipe starts afresh: only the seeds, the models trained and the plot may change.
    """
    if not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    ignored = {"seeds", "variants", "no_bart", "report_only"}
    same = {k: v for k, v in previous.get("config", {}).items() if k not in ignored}
    if same != {k: v for k, v in config.items() if k not in ignored}:
        return {}
    return previous.get("models", {})


def write_results(results: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


def markdown_table(results: dict) -> str:
    """One row per model: each metric as mean (± sample std over seeds when there are several), the best validation
    loss, and the paper's Table 2 numbers where it has them."""
    header = ["model", *COLUMN_NAMES, "valid. loss", "seeds", 'paper "iBLEU"', "paper BLEU-4"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", *["---:"] * (len(header) - 1)]) + "|"]
    for name, entry in results["models"].items():
        cells = []
        for key in METRIC_KEYS:
            stats = entry["summary"][key]
            cells.append(f"{stats['mean']:.2f} ± {stats['std']:.2f}" if stats["n"] > 1 else f"{stats['mean']:.2f}")
        losses = [run["best_validation_loss"] for run in entry["runs"] if run.get("best_validation_loss") is not None]
        cells.append(f"{statistics.fmean(losses):.3f}" if losses else "–")
        cells.append(",".join(str(run["seed"]) for run in entry["runs"]) if losses else "–")
        paper = PAPER_QUORA.get(name)
        cells += [f"{paper[0]:.2f}", f"{paper[1]:.2f}"] if paper else ["–", "–"]
        lines.append("| " + " | ".join([ROW_NAMES.get(name, name), *cells]) + " |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["models"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, title in zip(axes, ("ibleu", "bleu4"), ("iBLEU (α = 0.8, vs source)", "BLEU-4")):
        means = [results["models"][n]["summary"][key]["mean"] for n in names]
        stds = [results["models"][n]["summary"][key]["std"] for n in names]
        axis.bar(range(len(names)), means, yerr=stds, color=["C0"] * (len(names) - 1) + ["C7"])
        axis.set_xticks(range(len(names)), names, rotation=30, ha="right")
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(f"{results['config']['data']}, {results['config']['recipe']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def report(results: dict, plot_path: str | None) -> None:
    """The markdown table on stdout (and the bar chart), from a results dictionary."""
    if plot_path:
        plot(results, plot_path)
    config = results["config"]
    print(
        f"Quality on {config['files']['test']} ({config.get('test_pairs', config['max_test_samples'])} pairs); {config['data']}; {config['recipe']}; "
        f"beam {config['num_beams']}, {config['max_new_tokens']} new tokens"
    )
    print()
    print(markdown_table(results))
    print()
    print(
        'Paper: Gu et al. 2022, Table 2 (Quora), trained on 100K pairs with the paper-size model; its "iBLEU" is the '
        "released code's quantity (our ibleu_paper column), and its test set differs from ours."
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out_dir = Path(args.output_dir).resolve()
    if args.report_only:
        results = json.loads((out_dir / "results.json").read_text())
        report(results, args.plot)
        return results
    out_dir.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.set_verbosity_warning()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = prepare_data(args, out_dir / "data")
    tokenizer_dir = prepare_tokenizer(args, files["train"], out_dir / "tokenizer")
    n_train = sum(1 for line in files["train"].read_text(encoding="utf-8").splitlines() if line.strip())
    metric = evaluate.load(str(ROOT / "training" / "paraphrase_metrics"))
    results = {
        "config": {
            **{k: v for k, v in vars(args).items() if k != "plot"},
            "files": {split: str(path) for split, path in files.items()},
            "tokenizer_dir": str(tokenizer_dir),
            "train_pairs": n_train,
            "test_pairs": _count_test(files, args),
            "num_beams": NUM_BEAMS,
            "max_new_tokens": MAX_NEW_TOKENS,
            "data": f"{n_train:,} training pairs ({files['train'].name})",
            "recipe": f"d {args.d_model}, {args.layers}+{args.layers} layers, {args.attention_heads} heads, ffn "
            f"{args.ffn_dim}; {args.max_steps} steps, lr {args.learning_rate}, warm-up {args.warmup_steps}, "
            f"batch {args.batch_size}",
        },
        "machine": {
            "cpu": _cpu_name(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "paper_quora_table2": {k: {"ibleu_paper": v[0], "bleu4": v[1]} for k, v in PAPER_QUORA.items()},
        "models": {},
    }
    results_path = out_dir / "results.json"
    results["models"] = previous_runs(results_path, results["config"])
    started = time.perf_counter()
    record(results, COPY, 0, copy_source(files, args.max_test_samples, metric, out_dir / COPY), 0.0)
    write_results(results, results_path)
    for seed in args.seeds:
        for name in [*args.variants, *([] if args.no_bart else [BART])]:
            run_dir = out_dir / f"{name}-seed{seed}"
            run_dir.mkdir(parents=True, exist_ok=True)
            argv_run = recipe_argv(args, files, tokenizer_dir, seed, run_dir)
            tic = time.perf_counter()
            if name == BART:
                raw = train_bart(argv_run, metric)
            else:
                raw = train_cdnpg(name, argv_run, out_dir / f"{name}-seed{seed}.log", args.threads)
            record(results, name, seed, raw, time.perf_counter() - tic)
            # C-DNPG's metrics.json has no step count; read it from the trainer state
            state = run_dir / "trainer_state.json"
            if name != BART and state.is_file():
                trainer_state = json.loads(state.read_text())
                run_entry = results["models"][name]["runs"][-1]
                run_entry["steps"] = trainer_state.get("global_step")
                run_entry["best_validation_loss"] = trainer_state.get("best_metric")
            results["wall_s"] = round(time.perf_counter() - started, 1)
            write_results(results, results_path)
    order = [*args.variants, *([] if args.no_bart else [BART])]
    order += [name for name in results["models"] if name not in (*order, COPY)] + [COPY]
    results["models"] = {name: results["models"][name] for name in order}
    results["config"]["seeds"] = sorted({run["seed"] for entry in results["models"].values() for run in entry["runs"]})
    write_results(results, results_path)
    report(results, args.plot)
    return results


def _count_test(files: dict[str, Path], args: argparse.Namespace) -> int:
    n = sum(1 for line in files["test"].read_text(encoding="utf-8").splitlines() if line.strip())
    return min(n, args.max_test_samples) if args.max_test_samples else n


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
