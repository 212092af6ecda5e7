#!/usr/bin/env python
"""What `novelty` and `keep_details` (`generation_cdnpg.paraphrase`, through the pipeline) buy over plain beam search,
and over the knobs that need no z.

    # the reported run, on the last 2,000 Quora validation pairs (docs/benchmarks.md); the first 2,000: --split tune
    python benchmarks/novelty.py CHECKPOINT --split report --output_dir runs/novelty
    python benchmarks/report.py runs/novelty/runs-report.jsonl  # the table
    python benchmarks/novelty.py CHECKPOINT --quick --train_file F --valid_file F --output_dir /tmp/novelty  # smoke

Every setting (`settings`) decodes the same pairs through the text2text pipeline with `common.DECODING`, a chunk of
pairs each in turn (the time is each one's total over beam search's), and is scored by `paraphrase_metrics` and by
the high-z words kept. Every setting appends one JSON line to `OUTPUT_DIR/runs-<split>.jsonl`; report.py prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import DECODING, append_run, check_positive, check_setup, decoding_parser, load_checkpoint, read_runs
from report import NOVELTY, show

from cdnpg.calibration import calibrate_granularity
from cdnpg.granularity import high_z_words
from cdnpg.training.paraphrase_metrics import retention
from modeling_cdnpg import CDNPGText2TextPipeline
from modeling_cdnpg.generation_cdnpg import CONFIGURED as CONFIGURED_KEYS

NOVELTIES = (0.25, 0.5, 0.75, 1.0)
KEEPS = (0.25, 0.5, 1.0)  # keep_details on top of novelty 0.5
KNOBS = (("no_repeat", "encoder_no_repeat_ngram_size", (2, 3, 4)),)  # transformers' own: (family, knob, values)
BATCH_SIZE, CHUNK = 64, 256  # sentences per generate() call; pairs per round of the interleaved timing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = decoding_parser(__doc__.split("\n\n")[0], split="report", output_dir="runs/novelty")
    parser.add_argument(
        "--settings", nargs="+", metavar="NAME", help="only these (the table's names), and beam search"
    )
    args = parser.parse_args(argv)
    args.chunk = 6 if args.quick else CHUNK
    if args.quick:
        args.max_pairs = args.max_pairs or 12
    check_positive(parser, args, "max_pairs", "threads")
    return args


def settings(model, quick: bool, names: list[str] | None) -> dict[str, tuple[str, float, dict]]:
    """name -> (family, its knob's value, the pipeline's keyword arguments); --quick decodes one of each family, and
    `names` (--settings) those and beam search, the timings' reference; an unknown name is refused."""
    has_z, uniform = model.config.granularity_mask != "none", {"novelty_z_layer": None}
    rows = {"beam search": ("beam", 0.0, {})}
    for value in (0.5,) if quick else NOVELTIES:
        rows |= {f"novelty {value}": ("z", value, {"novelty": value})} if has_z else {}
        rows[f"novelty {value}, uniform"] = ("uniform", value, {"novelty": value, **uniform})
    for value in (1.0,) if quick else KEEPS:
        keep = {"novelty": 0.5, "keep_details": value}
        rows[f"novelty 0.5, keep details {value}"] = ("keep" if has_z else "keep_uniform", value, keep)
        if has_z and value >= 0.5:
            rows[f"novelty 0.5, keep details {value}, uniform"] = ("keep_uniform", value, {**keep, **uniform})
    rows["keep details 1.0"] = ("keep_alone", 1.0, {"keep_details": 1.0})
    for family, knob, values in KNOBS:  # --quick: the middle value
        for value in values[1:2] if quick else values:
            rows[f"{knob}={value}"] = (family, value, {knob: value})
    if unknown := [name for name in names or () if name not in rows]:
        raise SystemExit(f"--settings {', '.join(unknown)}: not a setting of this model; one of: {', '.join(rows)}")
    return {name: row for name, row in rows.items() if not names or name == "beam search" or name in names}


def decode(paraphraser, sources: list[str], **kwargs) -> list[str]:
    """Each source's paraphrase through the pipeline; "" for an input it finds unreadable."""
    results = paraphraser(sources, batch_size=BATCH_SIZE, **DECODING, **kwargs)
    return [candidates[0]["generated_text"] if candidates else "" for candidates in results]


def decode_interleaved(paraphraser, rows: dict, sources: list[str], args) -> tuple[dict[str, list[str]], dict]:
    """The first candidate of every source under every setting, and each setting's decoding time in seconds."""
    predictions = {name: [] for name in rows}
    seconds = dict.fromkeys(rows, 0.0)
    for start in range(0, len(sources), args.chunk):
        chunk = sources[start : start + args.chunk]
        for name, (_, _, kwargs) in rows.items():
            began = time.perf_counter()
            predictions[name] += decode(paraphraser, chunk, **kwargs)
            seconds[name] += time.perf_counter() - began
        print(f"decoded {start + len(chunk)} / {len(sources)} pairs with {len(rows)} settings", flush=True)
    return predictions, seconds


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    out_dir = Path(args.output_dir)
    model, tokenizer, train, common, pairs, metric = load_checkpoint(args)
    # the checkpoint's default paraphrasing (the recipe's novelty) left out: each setting decodes as it is named, and
    # "beam search" is the model's own
    shipped = {key: getattr(model.generation_config, key) for key in CONFIGURED_KEYS
               if getattr(model.generation_config, key, None) is not None}  # fmt: skip
    for key in shipped:
        delattr(model.generation_config, key)
    calibration = None  # the layer of z the rules read: the checkpoint's, or calibrated in memory (the file is kept)
    if model.config.granularity_mask != "none" and hasattr(model.generation_config, "novelty_z_layer"):
        calibration = {key: getattr(model.generation_config, key) for key in ("novelty_z_layer", "novelty_z_inverted")}
    elif model.config.granularity_mask != "none":
        calibration = calibrate_granularity(model, tokenizer, train["source"])
    paraphraser = CDNPGText2TextPipeline(model=model, tokenizer=tokenizer, device=model.device)
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
    samples = {name: list(predictions[name][:20]) for name in rows}
    (out_dir / f"samples-{args.split}.json").write_text(json.dumps(samples, indent=1) + "\n", encoding="utf-8")
    runs = read_runs([runs_path])
    show(runs)
    return runs


if __name__ == "__main__":
    main()
