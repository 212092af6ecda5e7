#!/usr/bin/env python
"""Every check of this project that needs a GPU, in one run sized for a lent one (at most 8 minutes on one H200 by
default), and the data of docs/speed.md's GPU table.

    bash scripts/gpu_check.sh                                   # on a CUDA machine: writes benchmarks/results/gpu.json
    bash scripts/gpu_check.sh --dry-run --lengths 8 --out x.json  # anywhere: the same steps, tiny, on a CPU

The steps, in this order, each within what is left of `--budget` and each saved as it ends:
1. the CUDA tests (`pytest -k cuda` of the files that hold them): compiled masks against the paper's formulas on the
   GPU, a paper-size step on SDPA's memory-efficient kernel alone;
2. the SDPA backend a paper-size training step runs (GA resonance and plain attention, the default configuration),
   and the seconds of its first step (the masks compile) and of the next, printed;
3. benchmarks/speed.py once per length (L 20, 64, 256): GA beside none and BART, its masks compiled (the default on
   CUDA) and eager, training steps and cached beam search, bf16, with the kernels each launches (`SPEED_OPTIONS`).
The output holds each step's result and `table`: the rows of docs/speed.md's GPU table, one column per length.
"""

import argparse
import contextlib
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (20, 64, 256)
CUDA_TESTS = ["tests/test_sdpa_head_padding.py", "tests/test_fused_granularity.py", "-k", "cuda"]
# benchmarks/speed.py's options besides --seq-lens and --out: GA against none and BART, its masks compiled and eager
SPEED_OPTIONS = {
    "gpu": ["--device", "cuda", "--dtype", "bf16", "--masks", "compiled", "eager", "--variants", "resonance",
            "product", "--gen-variants", "product", "--repeats", "3"],
    "dry-run": ["--device", "cpu", "--quick", "--parts", "train", "--masks", "compiled", "eager", "--variants",
                "resonance", "--repeats", "1", "--min-run-time", "0.01"],
}  # fmt: skip
RESONANCE, PRODUCT = "resonance (compiled_masks=True)", "product (compiled_masks=True)"  # speed.py's labels
# the table's rows: (speed.py result field, key after "L<length>/", label)
ROWS = [
    ("ratios", f"train/{RESONANCE} / none", "GA resonance / none, training step"),
    ("ratios", f"train/{PRODUCT} / none", "GA product / none, training step"),
    ("ratios", "train/none / bart", "none / BART, training step"),
    ("ratios", f"train/{RESONANCE} / resonance", "resonance, masks compiled / eager, training step"),
    ("ratios", "generate/product (compiled_masks=True) / none", "beam search product / none"),
    ("median_s", "train/none", "ms per training step, none"),
    ("median_s", f"train/{RESONANCE}", "ms per training step, resonance"),
    ("median_s", "train/bart", "ms per training step, BART"),
    ("kernels", "train/none", "kernels per training step, none"),
    ("kernels", f"train/{RESONANCE}", "kernels per training step, resonance"),
    ("kernels", f"train/{PRODUCT}", "kernels per training step, product"),
    ("kernels", "train/bart", "kernels per training step, BART"),
    ("kernels", "generate/none", "kernels per decoding step, none"),
    ("kernels", "generate/product (compiled_masks=True)", "kernels per decoding step, product"),
]


def run_tests(timeout: float) -> dict:
    """The CUDA tests in a subprocess: pytest's summary line and exit code (5: none selected, as on a CPU)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS]
    result = run(command, timeout)
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|deselected|error).*?)\s*=*$", result["output"], re.M)
    return {**result, "summary": summary[-1] if summary else None}


def first_steps(device: str) -> tuple[dict, dict]:
    """The SDPA ops one training step runs, per mask, at the paper's size (a tiny model on a CPU dry run), batch 32,
    L 20: which of SDPA's kernels (flash, memory-efficient, cuDNN, math) the masks let it choose; and the seconds of
    the first step (where the masks compile, on CUDA) and of the second."""
    import torch
    from torch.profiler import profile

    from modeling_cdnpg import CDNPGConfig, CDNPGForConditionalGeneration

    size = {} if device == "cuda" else {"vocab_size": 200, "d_model": 36, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32}

    def step(model, ids):
        with torch.autocast("cuda", torch.bfloat16) if device == "cuda" else contextlib.nullcontext():
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        loss.backward()

    def timed(model, ids) -> float:
        start = time.perf_counter()
        step(model, ids)
        if device == "cuda":
            torch.cuda.synchronize()
        return round(time.perf_counter() - start, 3)

    found, seconds = {}, {}
    for mask in ("resonance", "none"):
        model = CDNPGForConditionalGeneration(CDNPGConfig(granularity_mask=mask, **size)).to(device).train()
        ids = torch.randint(103, model.config.vocab_size, (32, 20), device=device)
        seconds[mask] = {"first_step_s": timed(model, ids), "second_step_s": timed(model, ids)}  # first: compiles
        with profile() as prof:
            step(model, ids)
        names = [event.name for event in prof.events() if "scaled_dot_product" in event.name]
        found[mask] = {name: names.count(name) for name in sorted(set(names))}
    return found, seconds


def run_speed(length: int, options: list[str], out: Path, timeout: float) -> dict:
    """benchmarks/speed.py at one length; its result file, as far as it got (it saves after each part)."""
    command = [sys.executable, "benchmarks/speed.py", "--seq-lens", str(length), *options, "--out", str(out)]
    result = run(command, timeout)
    result["result"] = json.loads(out.read_text()) if out.is_file() else None
    return result


def run(command: list[str], timeout: float) -> dict:
    """A command from the repository root, stopped after `timeout` seconds: its exit code (None when stopped), its
    wall time and the end of its output."""
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1))
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        code, output = None, (stopped.stdout or b"").decode() + (stopped.stderr or b"").decode()
    return {"command": " ".join(command), "returncode": code, "wall_s": round(time.monotonic() - start, 1),
            "output": output[-4000:]}  # fmt: skip


def table(speed: dict[int, dict]) -> dict:
    """The rows of docs/speed.md's GPU table: one value per length, None where that run did not measure it."""

    def value(field: str, key: str, length: int) -> float | None:
        result = speed[length]["result"] or {}
        if field == "ratios":  # {"L20/train/resonance_vs_none": {"value": ...}}
            ratio = result.get("ratios", {}).get(f"L{length}/{key}")
            return round(ratio["value"], 3) if ratio else None
        if field == "median_s":  # {"L20/train": {"resonance": seconds}}
            part, runner = key.split("/", 1)
            seconds = result.get("median_s", {}).get(f"L{length}/{part}", {}).get(runner)
            return round(seconds * 1000, 1) if seconds is not None else None
        counts = result.get("kernels", {}).get(f"L{length}/{key}")  # {"L20/train/resonance": {"total": ...}}
        return counts["total"] if counts else None

    rows = [{"label": label, "field": field, "key": key, "values": [value(field, key, n) for n in speed]}
            for field, key, label in ROWS]  # fmt: skip
    return {"columns": [f"L {length}" for length in speed], "rows": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: a tiny model, the same steps, seconds")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="speed.py's, one call each")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all steps (default 8 minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu.json")
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    deadline = time.monotonic() + args.budget
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join(["scripts/gpu_check.sh", *(sys.argv[1:] if argv is None else argv)]),
              "machine": {"python": platform.python_version(), "host": platform.node()}, "device": device,
              "speed_options": SPEED_OPTIONS["dry-run" if args.dry_run else "gpu"]}  # fmt: skip

    def save():
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    report["tests"] = run_tests(min(150, deadline - time.monotonic()))
    save()
    report["sdpa_backends"], report["first_steps"] = first_steps(device)
    print("training step at L 20, seconds (the first compiles the masks):", json.dumps(report["first_steps"]))
    save()
    speed = {}
    for done, length in enumerate(args.lengths):
        share = (deadline - time.monotonic()) / (len(args.lengths) - done)  # what is left, shared by what is left
        speed[length] = run_speed(length, report["speed_options"], args.out.with_name(f"speed_L{length}.json"), share)
        report["speed"], report["table"] = speed, table(speed)
        save()
    print(json.dumps(report["table"], indent=1))
    return report


if __name__ == "__main__":
    main()
