#!/usr/bin/env python
"""Where the time of benchmarks/speed.py goes: torch.profiler tables of one training step and one cached beam search.

    python benchmarks/speed_profile.py --seq-lens 20 256 --out prof

For each model of `--variants` at each length (the shapes speed.py times), one profiled call after a warm-up, written
to OUT/L<length>_<train|generate>_<variant>.txt (`key_averages()` by self CPU time, then grouped by input shape),
and OUT/summary.json with the time in the labelled ranges. The model is not edited: forward hooks open a
`record_function` range around every `GranularityHead` ("cdnpg::GranularityHead") and every `CDNPGAttention`
("cdnpg::CDNPGAttention": projections, mask, cache and attention), so product vs none attention shows the GA share.
Backward ops keep their autograd names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import speed
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from modeling_cdnpg import GRANULARITY_MASKS, GranularityHead
from modeling_cdnpg.modeling_cdnpg import CDNPGAttention

LABELS = {GranularityHead: "cdnpg::GranularityHead (eq. 4)", CDNPGAttention: "cdnpg::CDNPGAttention"}


@contextlib.contextmanager
def labelled_modules(model: torch.nn.Module):
    """A profiler range around the forward pass of every granularity head and attention module, through hooks."""
    handles = []
    for module in model.modules():
        label = LABELS.get(type(module))
        if label is None:
            continue
        opened = []

        def enter(module, inputs, label=label, opened=opened):
            opened.append(record_function(label).__enter__())

        def leave(module, inputs, output, opened=opened):
            opened.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[20, 256])
    parser.add_argument("--variants", nargs="+", default=["product", "none"], choices=GRANULARITY_MASKS)
    parser.add_argument("--quick", action="store_true", help="speed.py's tiny model")
    parser.add_argument("--out", type=Path, required=True, help="folder of the tables and summary.json")
    args = parser.parse_args(argv)
    options = speed.parse_args(["--quick"] if args.quick else [])  # speed.py's shapes: CPU, fp32, its batches, beams
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for length in args.seq_lens:
        batch, gen_batch, new_tokens = speed.shapes(options, length)
        for variant in args.variants:
            for part, runner, rows in (("train", variant, batch), ("generate", f"{variant}+cache", gen_batch)):
                model = speed.build_model(runner, speed.QUICK_MODEL if args.quick else {}, options.seed)
                call = speed.workload(runner, model, part, rows, length, new_tokens, options)
                call()  # warm-up
                with labelled_modules(model), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    call()
                averages = prof.key_averages()
                total = sum(event.self_cpu_time_total for event in averages) / 1e6
                name = f"L{length}_{part}_{variant}"
                (args.out / f"{name}.txt").write_text(
                    f"{name}: batch {rows}, self CPU total {total:.3f} s\n"
                    + averages.table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=70)
                    + "\n\nby input shape:\n"
                    + prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40)
                )
                ranges = {e.key: e.cpu_time_total / 1e6 for e in averages if e.key.startswith("cdnpg::")}
                summary.append({"name": name, "batch": rows, "self_cpu_total_s": total, "ranges_s": ranges})
                print(f"{name}: {total:.3f} s; " + ", ".join(f"{k} {100 * t / total:.1f}%" for k, t in ranges.items()))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
