#!/usr/bin/env python
"""What `novelty` and `keep_details` (`generation_cdnpg.paraphrase`, through the pipeline) buy over plain beam search,
and over the knobs that need no z.

    # the reported run, on the last 2,000 Quora validation pairs (docs/benchmarks.md); the first 2,000: --split tune
    python benchmarks/novelty.py CHECKPOINT --split report --output_dir runs/novelty
    python benchmarks/report.py runs/novelty/runs-report.jsonl  # the table
    python benchmarks/novelty.py CHECKPOINT --quick --train_file F --valid_file F --output_dir /tmp/novelty  # smoke

Every setting (`settings`) decodes the same pairs through the text2text pipeline with `common.DECODING`, a chunk of
pairs each in turn (the time is each one's total over beam search's), and is scored by `paraphrase_metrics` and by
the high-z words kept; 5 candidates of beam search and of `novelty` 0.5 are compared on the first pairs. Every
setting appends one JSON line to `OUTPUT_DIR/runs-<split>.jsonl`; report.py prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers
from common import DECODING, append_run, check_positive, check_setup, decoding_parser, read_pairs, read_runs
from report import NOVELTY, show

import modeling_cdnpg  # noqa: F401  (registers C-DNPG with the Auto classes)
from cdnpg import training
from cdnpg.calibration import calibrate_granularity
from cdnpg.data import load_tokenizer
from cdnpg.granularity import high_z_words
from cdnpg.training.paraphrase_metrics import candidate_scores, common_words, retention
from modeling_cdnpg import CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import CONFIGURED as CONFIGURED_KEYS

NOVELTIES = (0.25, 0.5, 0.75, 1.0)
KEEPS = (0.25, 0.5, 1.0)  # keep_details on top of novelty 0.5
KNOBS = (
    ("no_repeat", "encoder_no_repeat_ngram_size", (2, 3, 4)),
    ("repetition", "encoder_repetition_penalty", (0.9, 0.7, 0.5)),
)  # transformers' own: (family, knob, values)
BATCH_SIZE, CHUNK = 64, 256  # sentences per generate() call; pairs per round of the interleaved timing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = decoding_parser(__doc__.split("\n\n")[0], split="report", output_dir="runs/novelty")
    parser.add_argument("--candidate_pairs", type=int, default=200, help="pairs of the candidates comparison")
    parser.add_argument(
        "--settings", nargs="+", metavar="NAME", help="only these (the table's names), and beam search"
    )
    args = parser.parse_args(argv)
    args.chunk = 6 if args.quick else CHUNK
    if args.quick:
        args.max_pairs, args.candidate_pairs = args.max_pairs or 12, min(args.candidate_pairs, 4)
    check_positive(parser, args, "max_pairs", "candidate_pairs", "threads")
    return args


def settings(model, quick: bool, names: list[str] | None) -> dict[str, tuple[str, float, dict]]:
    """name -> (family, the family's knob value, the pipeline's keyword arguments: paraphrase() with novelty or
    keep_details, generate() otherwise); --quick decodes one of each family.
    With `names` (--settings), those and beam search, the reference of the timings; an unknown name is refused."""
    has_z, uniform = model.config.granularity_mask != "none", {"novelty_z_layer": None}
    mirrored = has_z and not model.generation_config.novelty_z_inverted
    rows = {"beam search": ("beam", 0.0, {})}
    rows["novelty 0.001 (the copy rule alone)"] = ("copy_rule", 0.001, {"novelty": 0.001})
    for value in (0.5,) if quick else NOVELTIES:
        rows |= {f"novelty {value}": ("z", value, {"novelty": value})} if has_z else {}
        rows[f"novelty {value}, uniform"] = ("uniform", value, {"novelty": value, **uniform})
    for value in ((0.5,) if quick else (0.25, 0.5)) if has_z else ():
        rows[f"novelty {value}, z mirrored"] = ("mirrored", value, {"novelty": value, "novelty_z_inverted": mirrored})
    for value in (1.0,) if quick else KEEPS:
        keep = {"novelty": 0.5, "keep_details": value}
        rows[f"novelty 0.5, keep details {value}"] = ("keep" if has_z else "keep_uniform", value, keep)
        if has_z and value >= 0.5:
            rows[f"novelty 0.5, keep details {value}, uniform"] = ("keep_uniform", value, {**keep, **uniform})
    rows["keep details 1.0"] = ("keep_alone", 1.0, {"keep_details": 1.0})
    for family, knob, values in KNOBS:  # --quick: the middle value
        for value in values[1:2] if quick else values:
            rows[f"{knob}={value}"] = (family, value, {knob: value})
    unknown = [name for name in names or () if name not in rows]
    if unknown:
        raise SystemExit(f"--settings {', '.join(unknown)}: not a setting of this model; one of: {', '.join(rows)}")
    return {name: row for name, row in rows.items() if not names or name == "beam search" or name in names}


def decode(paraphraser, sources: list[str], n: int = 1, **kwargs) -> list[list[str]]:
    """Each source's candidates (best first) through the pipeline; none for an input it finds unreadable."""
    results = paraphraser(sources, batch_size=BATCH_SIZE, num_return_sequences=n, **DECODING, **kwargs)
    return [[candidate["generated_text"] for candidate in candidates] for candidates in results]


def decode_interleaved(paraphraser, rows: dict, sources: list[str], args) -> tuple[dict[str, list[str]], dict]:
    """The first candidate of every source under every setting, and each setting's decoding time in seconds."""
    predictions = {name: [] for name in rows}
    seconds = dict.fromkeys(rows, 0.0)
    for start in range(0, len(sources), args.chunk):
        chunk = sources[start : start + args.chunk]
        for name, (_, _, kwargs) in rows.items():
            began = time.perf_counter()
            outputs = decode(paraphraser, chunk, **kwargs)
            seconds[name] += time.perf_counter() - began
            predictions[name] += [candidates[0] if candidates else "" for candidates in outputs]
        print(f"decoded {start + len(chunk)} / {len(sources)} pairs with {len(rows)} settings", flush=True)
    return predictions, seconds


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    out_dir = Path(args.output_dir)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(args.checkpoint).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    # the checkpoint's default paraphrasing (the recipe's novelty) left out: each setting decodes as it is named, and
    # "beam search" is the model's own
    shipped = {key: getattr(model.generation_config, key) for key in CONFIGURED_KEYS
               if getattr(model.generation_config, key, None) is not None}  # fmt: skip
    for key in shipped:
        delattr(model.generation_config, key)
    train = read_pairs(args.train_file)
    calibration = None  # the layer of z the rules read: the checkpoint's, or calibrated in memory (the file is kept)
    if model.config.granularity_mask != "none" and hasattr(model.generation_config, "novelty_z_layer"):
        calibration = {key: getattr(model.generation_config, key) for key in ("novelty_z_layer", "novelty_z_inverted")}
    elif model.config.granularity_mask != "none":
        calibration = calibrate_granularity(model, tokenizer, train["source"])
    common = common_words([*train["source"], *train["target"]])
    pairs = read_pairs(args.valid_file, args.max_pairs, half=args.split)
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
    metric = training.load_metric()
    rows = settings(model, args.quick, args.settings)

    runs_path = out_dir / f"runs-{args.split}.jsonl"
    setup = {"split": args.split, "pairs": len(pairs), "decoding": DECODING, "batch_size": BATCH_SIZE}
    check_setup(runs_path, setup)
    predictions, seconds = decode_interleaved(paraphraser, rows, list(pairs["source"]), args)
    details = [{"high_z": words} for words in high_z_words(model, tokenizer, pairs["source"])]
    rows |= {"human reference": ("anchor", None, None), "copy the source": ("anchor", None, None)}
    predictions |= {"human reference": pairs["target"], "copy the source": pairs["source"]}
    run = {"benchmark": "novelty", "model": str(args.checkpoint), "calibration": calibration, "settings": setup,
           "checkpoint_default": shipped}  # fmt: skip
    for name, (family, value, kwargs) in rows.items():
        scores = metric.compute(predictions=predictions[name], references=pairs["target"], sources=pairs["source"],
                                common=common)  # fmt: skip
        metrics = {key: scores[key] for key in NOVELTY if key in scores}  # the table's columns
        metrics["high_z_kept"] = retention(details, predictions[name])["high_z"]
        if name in seconds:
            metrics["time_ratio"] = seconds[name] / seconds["beam search"]
        append_run(runs_path, {**run, "setting": name, "family": family, "value": value, "kwargs": kwargs,
                               "metrics": metrics, "time_s": round(seconds.get(name, 0), 2)})  # fmt: skip
    few = pairs.select(range(min(args.candidate_pairs, len(pairs))))
    for name, kwargs in (("beam search (5 best beams)", {}), ("novelty 0.5 (5 candidates)", {"novelty": 0.5})):
        if not kwargs or "novelty 0.5" in rows:
            candidates = decode(paraphraser, list(few["source"]), 5, **kwargs)
            stats = candidate_scores(candidates, few["source"], few["target"])
            append_run(runs_path, {**run, "setting": name, "family": "candidates", "value": None, "metrics": stats})
    samples = {name: list(predictions[name][:20]) for name in rows}
    (out_dir / f"samples-{args.split}.json").write_text(json.dumps(samples, indent=1) + "\n", encoding="utf-8")
    runs = read_runs([runs_path])
    show(runs)
    return runs


if __name__ == "__main__":
    main()
