#!/usr/bin/env python
"""Paraphrase quality of C-DNPG's granularity masks, the plain Transformer, transformers' BART and bert2bert.

    # the CPU run of docs/benchmarks.md (its numbers and the other documented runs are there)
    python benchmarks/quality.py --d_model 128 --attention_heads 4 --layers 3 --ffn_dim 512 --max_steps 1200 \
        --learning_rate 1e-3 --warmup_steps 120 --evaluations 4 --max_test_samples 1000 --output_dir runs/quality
    python benchmarks/quality.py --quick --output_dir /tmp/quality  # tiny model, template corpus: the smoke test

Every model is trained, selected by validation loss, decoded and scored by `training/run.py`, one run.py process per
model (the baselines with `--architecture bart` / `bert2bert`: only the model differs), with one recipe, data and
tokenizer, and appends one JSON line to `OUTPUT_DIR/runs.jsonl`; report.py prints the table. Protocol:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from common import QUORA, ROOT, append_run, check_positive, check_setup, read_pairs, read_runs
from report import show

from cdnpg import training
from cdnpg.data import load_tokenizer, save_tokenizer, train_wordpiece_tokenizer, write_template_corpus
from cdnpg.training.paraphrase_metrics import common_words
from configuration_cdnpg import COPY_MECHANISMS, GRANULARITY_MASKS, CDNPGConfig

BART, BERT2BERT, COPY, HUMAN, WARM = "bart", "bert2bert", "copy-source", "human references", "warm-"
# the recipe of a CPU-sized run; flags not listed here (model sizes, batch sizes) default to training/run.py's
RECIPE = dict(max_steps=3000, learning_rate=5e-4, warmup_steps=300, evaluations=5, warm_learning_rate=1e-4)
SIZE_FLAGS = ("d_model", "layers", "attention_heads", "ffn_dim")  # a warm start takes its checkpoint's
# --quick: tiny model on the template corpus, a handful of steps and test sentences, for the flags not given
QUICK = dict(
    d_model=32, layers=2, attention_heads=4, ffn_dim=64, vocab_size=600, max_steps=12, warmup_steps=2,
    learning_rate=1e-3, batch_size=16, eval_batch_size=32, max_test_samples=12, evaluations=2, threads=1,
)  # fmt: skip
CDNPG_FLAGS = ("copy_mechanism", "copy_common_tokens", "drop_near_copies", "both_directions")  # of C-DNPG alone
RUN_FLAGS = {  # benchmark flag -> training/run.py flag, passed on when given
    **{name: name for name in (*SIZE_FLAGS, "dropout", "max_steps", "learning_rate", "warmup_steps")},
    "batch_size": "per_device_train_batch_size", "eval_batch_size": "per_device_eval_batch_size",
    "max_test_samples": "max_predict_samples",
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--train_file", help=f"training pairs (default: {QUORA / 'train.jsonl'})")
    add("--valid_file", help="validation pairs (default: the first half of the shared Quora valid.jsonl)")
    add("--test_file", help="test pairs (default: the second half of the same file)")
    add("--tokenizer", help="tokenizer directory (default: train a WordPiece vocabulary on the train file)")
    add("--vocab_size", type=int, help="size of the trained WordPiece vocabulary (train_wordpiece_tokenizer's)")
    masks = dict(nargs="*", choices=GRANULARITY_MASKS)
    add("--variants", **masks, default=["none", "resonance", "scope"], help="trained from scratch (--variants: none)")
    add("--no_bart", action="store_true", help="skip the transformers BART baseline")
    add("--init_from", help="a BART or BERT-family checkpoint to warm-start the --warm_variants models from")
    add("--no_bert2bert", action="store_true", help="skip bert2bert (trained with a BERT-family --init_from)")
    add("--warm_variants", **masks, default=["none", "resonance"], help="warm-started from --init_from")
    add("--warm_granularity_learning_rate", type=float, help="of their granularity heads (run.py's flag)")
    add("--copy_mechanism", choices=COPY_MECHANISMS[1:], help="of every C-DNPG model (named in the model's row)")
    add("--copy_common_tokens", type=int, metavar="N", help="never copy the N most frequent tokens (run.py's)")
    add("--drop_near_copies", type=float, metavar="BLEU", help="C-DNPG models leave out near-copy pairs (run.py's)")
    add("--both_directions", action="store_true", help="C-DNPG models also learn each pair reversed (run.py's)")
    add("--seeds", type=int, nargs="+", default=[0], help="one run per seed; mean ± std when several")
    for name in (*SIZE_FLAGS, "batch_size", "eval_batch_size"):
        add(f"--{name}", type=int, help="default: run.py's (CDNPGConfig's, the paper's)")
    add("--dropout", type=float, help="dropout (default: CDNPGConfig's)")
    for name, value in RECIPE.items():  # steps, AdamW's peak rate, linear warm-up, validation-loss checks per run
        add(f"--{name}", type=type(value), help=f"default {value}")
    add("--threads", type=int, help="torch CPU threads per process; 1 is fastest on a CPU shared with other jobs")
    add("--max_test_samples", type=int, help="score only the first N test pairs")
    add("--bf16", action="store_true", help="bfloat16 mixed precision: on a CPU with AVX512-BF16/AMX or a GPU only")
    add("--output_dir", default="runs/quality", help="runs, data splits, runs.jsonl")
    add("--quick", action="store_true", help="tiny model on the template corpus: < 2 minutes (flags given win)")
    args = parser.parse_args(argv)
    for name, value in {**RECIPE, **(QUICK if args.quick else {})}.items():
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    check_positive(parser, args, "max_steps", "evaluations", "batch_size", "eval_batch_size")
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"--seeds repeats a seed: {args.seeds}")
    return args


def prepare_files(args: argparse.Namespace, data_dir: Path) -> dict[str, Path]:
    """The train / valid / test files every model uses: the flags, the template corpus (--quick) or shared Quora."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.quick and not (args.train_file or args.valid_file or args.test_file):
        written = write_template_corpus(data_dir, seed=0, num_train=400, num_valid=40, num_test=40)
        return {split: written[split] for split in ("train", "valid", "test")}
    files = {"train": args.train_file or QUORA / "train.jsonl", "valid": args.valid_file, "test": args.test_file}
    for split, half in (("valid", "tune"), ("test", "report")):
        if files[split] is None and (QUORA / "valid.jsonl").is_file():  # a half of the shared valid.jsonl
            files[split] = data_dir / f"{split}.jsonl"
            read_pairs(QUORA / "valid.jsonl", half=half).to_json(files[split])
    missing = [f"{split} file {path}" for split, path in files.items() if not (path and Path(path).is_file())]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found: pass --train_file/--valid_file/--test_file")
    return {split: Path(path).resolve() for split, path in files.items()}


def prepare_tokenizer(args: argparse.Namespace, train_file: Path, out_dir: Path) -> Path:
    """A tokenizer directory shared by every model: --tokenizer, or WordPiece trained once on the train split."""
    if args.tokenizer:
        load_tokenizer(args.tokenizer)  # fail now if it does not load
        return Path(args.tokenizer).resolve() if Path(args.tokenizer).exists() else Path(args.tokenizer)
    if not (out_dir / "tokenizer.json").is_file():
        pairs = read_pairs(train_file)
        vocab_size = {"vocab_size": args.vocab_size} if args.vocab_size else {}
        save_tokenizer(train_wordpiece_tokenizer([*pairs["source"], *pairs["target"]], **vocab_size), out_dir)
    return out_dir.resolve()


def model_name(mask: str, args: argparse.Namespace) -> str:
    """A C-DNPG model's row: its mask, and its copy gate and data when given ("warm-resonance+copy-learned+drop50+both")."""
    copy = f"+copy-{args.copy_mechanism}" if args.copy_mechanism else ""
    copy += f"-skip{args.copy_common_tokens}" if args.copy_common_tokens else ""
    drop = f"+drop{args.drop_near_copies:g}" if args.drop_near_copies else ""
    return mask + copy + drop + ("+both" if args.both_directions else "")


def run_argv(name: str, args: argparse.Namespace, files: dict, tokenizer: Path, seed: int, out: Path) -> list[str]:
    """The `training/run.py` flags of one model: the recipe every model shares (data, sizes, optimiser, schedule,
    selection, decoding), the model (C-DNPG's mask, or the baseline's `--architecture`), C-DNPG's copy gate and both
    directions; the warm-started models and bert2bert take the checkpoint's own sizes and tokenizer, and the warm
    learning rate (bert2bert its dropout too)."""
    # whole steps: the Trainer reads a float eval_steps below 1 as a share of training, but 1.0 as "every step"
    every = str(-(-args.max_steps // args.evaluations))
    argv = [
        "--train_file", str(files["train"]), "--validation_file", str(files["valid"]),
        "--test_file", str(files["test"]), "--output_dir", str(out),
        "--do_train", "true", "--do_eval", "true", "--do_predict", "true",
        "--eval_strategy", "steps", "--save_strategy", "steps",  # selection by validation loss, every 1/evaluations
        "--eval_steps", every, "--save_steps", every, "--save_only_model", "true",
        "--logging_steps", str(max(1, args.max_steps // 20)), "--seed", str(seed),
        "--dataloader_pin_memory", "false", "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    if args.bf16:  # the Trainer asks for use_cpu before it autocasts a CPU to bfloat16
        argv += ["--bf16", "true", *([] if torch.cuda.is_available() else ["--use_cpu", "true"])]
    given = {key: getattr(args, key) for key in RUN_FLAGS if getattr(args, key) is not None}
    if name in (BART, BERT2BERT):
        argv += ["--architecture", name]
    else:
        argv += ["--granularity_mask", name.removeprefix(WARM).split("+")[0]]
    if name == BERT2BERT:  # the checkpoint's dropout
        given.pop("dropout", None)
    if name.startswith(WARM) or name == BERT2BERT:
        given = {key: value for key, value in given.items() if key not in (*SIZE_FLAGS, "learning_rate")}
        argv += ["--init_from", args.init_from, "--learning_rate", str(args.warm_learning_rate)]
        if args.warm_granularity_learning_rate is not None:  # bert2bert has no granularity heads: nothing changes
            argv += ["--granularity_learning_rate", str(args.warm_granularity_learning_rate)]
    else:
        argv += ["--tokenizer_name", str(tokenizer)]
    argv += [item for key, value in given.items() for item in (f"--{RUN_FLAGS[key]}", str(value))]
    if name not in (BART, BERT2BERT):
        argv += [item for key in CDNPG_FLAGS if getattr(args, key) for item in (f"--{key}", str(getattr(args, key)))]
    return argv


def train(name: str, argv: list[str], log_path: Path, threads: int | None) -> dict[str, float]:
    """One model's run, `training/run.py` in a process of its own (memory is returned between models): its
    all_results."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONUNBUFFERED"] = "1"  # the log shows the losses as they come
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, str(ROOT / "training" / "run.py"), *argv]
    with log_path.open("w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"training/run.py for {name} failed (log: {log_path}):\n{tail}")
    return json.loads((Path(argv[argv.index("--output_dir") + 1]) / "all_results.json").read_text())


def test_metrics(raw: dict[str, float]) -> dict[str, float]:
    """run.py's `test_*` scores without the prefix (and without its timings)."""
    timings = ("_runtime", "_per_second")
    return {k.removeprefix("test_"): v for k, v in raw.items() if k.startswith("test_") and not k.endswith(timings)}


def recipe(args: argparse.Namespace, files: dict, tokenizer: Path, data: dict) -> dict:
    """What every model is trained with, defaults filled in (run.py parses the recipe as it will for each model): a
    run's `settings`. Without a model from scratch, the sizes and rate are the warm start's, so they are left out."""
    try:
        argv = run_argv("none", args, files, tokenizer, 0, ROOT)  # parsed only: no folder is written
        model_args, data_args, training_args = training.parse_args(argv)
    except training.UsageError as error:
        raise SystemExit(f"error: {error}") from None
    config = CDNPGConfig(**model_args.config_overrides())
    settings = {
        **data, "d_model": config.d_model, "layers": config.encoder_layers, "ffn_dim": config.encoder_ffn_dim,
        "attention_heads": config.encoder_attention_heads, "dropout": config.dropout,
        "vocab_size": len(load_tokenizer(tokenizer)), "batch_size": training_args.per_device_train_batch_size,
        "num_beams": training_args.generation_num_beams, "max_new_tokens": data_args.max_target_length,
        **{key: getattr(args, key) for key in (*RECIPE, "warm_granularity_learning_rate", "init_from", "bf16")},
        **{key: getattr(args, key) for key in CDNPG_FLAGS if getattr(args, key)},
    }  # fmt: skip
    if not args.variants and args.no_bart:
        return {key: value for key, value in settings.items() if key not in (*SIZE_FLAGS, "learning_rate")}
    return settings


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    out_dir = Path(args.output_dir).resolve()
    transformers.utils.logging.set_verbosity_warning()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = prepare_files(args, out_dir / "data")
    tokenizer_dir = prepare_tokenizer(args, files["train"], out_dir / "tokenizer")
    train_pairs, test_pairs = read_pairs(files["train"]), read_pairs(files["test"], args.max_test_samples)
    metric, runs_path = training.load_metric(), out_dir / "runs.jsonl"
    data = {"data": f"{len(train_pairs):,} training pairs ({files['train'].name})",
            "test": f"{len(test_pairs)} pairs of {files['test'].name}"}  # fmt: skip
    settings = recipe(args, files, tokenizer_dir, data)
    check_setup(runs_path, data)
    check_setup(runs_path, settings)
    common = common_words([*train_pairs["source"], *train_pairs["target"]])  # as run.py counts rare words
    anchor = {"benchmark": "quality", "seed": 0, "settings": data}
    human = test_metrics(training.score(metric, test_pairs["target"], test_pairs, common))
    append_run(runs_path, {**anchor, "model": HUMAN, "metrics": {k: v for k, v in human.items() if "kept" in k}})
    (out_dir / COPY).mkdir(exist_ok=True)  # the trivial baseline: the prediction is the source itself
    training.write_predictions(out_dir / COPY / "predictions.jsonl", test_pairs, test_pairs["source"])
    copied = test_metrics(training.score(metric, test_pairs["source"], test_pairs, common))
    append_run(runs_path, {**anchor, "model": COPY, "metrics": copied})
    warm = [f"{WARM}{model_name(mask, args)}" for mask in args.warm_variants] if args.init_from else []
    if args.init_from and not args.no_bert2bert:
        bert = transformers.AutoConfig.from_pretrained(args.init_from).model_type == "bert"
        warm = [BERT2BERT, *warm] if bert else warm  # the baseline first: every warm-start figure is read against it
    for seed in args.seeds:
        for name in [*warm, *(model_name(mask, args) for mask in args.variants), *([] if args.no_bart else [BART])]:
            run_dir = out_dir / f"{name}-seed{seed}"
            argv = run_argv(name, args, files, tokenizer_dir, seed, run_dir)
            tic = time.perf_counter()
            raw = train(name, argv, out_dir / f"{name}-seed{seed}.log", args.threads)
            wall_s = time.perf_counter() - tic
            state = json.loads((run_dir / "trainer_state.json").read_text())
            steps, runtime = state.get("global_step"), raw.get("train_runtime")
            append_run(runs_path, {
                "benchmark": "quality", "model": name, "seed": seed, "settings": settings,
                "metrics": test_metrics(raw),
                "steps": steps, "s_per_step": runtime / steps if steps and runtime else None,
                "best_validation_loss": state.get("best_metric", raw.get("eval_loss")),
                "train_loss": {row["step"]: row["loss"] for row in state.get("log_history", []) if "loss" in row},
                "wall_s": round(wall_s, 1),
            })  # fmt: skip
    runs = read_runs([runs_path])
    show(runs)
    return runs


if __name__ == "__main__":
    main()
