#!/usr/bin/env python
"""Training steps of the README's main job (training/configs/template_cpu.yaml) with torch's default threads, with one
thread, and with run.py's own choice (OMP_NUM_THREADS unset), on an idle machine and beside one `while True: pass`
process: interleaved rounds, the median of each, and its ratio to torch's default under the same load.

    python scripts/busy_cpu.py --rounds 2 --steps 30    # from the project root; about 5 minutes on 2 cores
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]


def train_seconds(steps: int, threads: str | None, output: Path, extra: list[str]) -> tuple[float, str]:
    """train_runtime of `steps` steps, with OMP_NUM_THREADS=`threads` (None: unset, run.py chooses), and the line in
    which run.py says it trains on fewer threads, if it does."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env |= {} if threads is None else {"OMP_NUM_THREADS": threads}
    command = [sys.executable, "training/run.py", "training/configs/template_cpu.yaml", "--max_steps", str(steps),
               "--do_eval", "false", "--do_predict", "false", "--save_strategy", "no", "--disable_tqdm", "true",
               "--logging_steps", str(steps), "--overwrite_output_dir", "true", "--output_dir", str(output), *extra]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"busy_cpu: training/run.py failed:\n{done.stderr[-3000:]}")
    said = [line for line in done.stderr.splitlines() if "cores busy: training on" in line]
    return json.loads((output / "train_results.json").read_text())["train_runtime"], " ".join(said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="busy-cpu-"))
    default = torch.get_num_threads()
    arms = {f"torch's default ({default})": str(default), "one thread": "1", "run.py's choice": None}
    train_seconds(args.steps, "1", work / "first", [])  # trains the tokenizer once
    tokenizer = ["--tokenizer_name", str(work / "first" / "tokenizer")]
    times = {(load, arm): [] for load in ("idle", "busy") for arm in arms}
    for round_ in range(args.rounds):
        for load in ("idle", "busy"):
            loop = subprocess.Popen(BUSY_LOOP) if load == "busy" else None
            try:
                for arm, threads in arms.items():
                    seconds, said = train_seconds(args.steps, threads, work / "run", tokenizer)
                    times[load, arm].append(seconds)
                    print(f"round {round_ + 1} {load:4} {arm:22} {seconds:6.1f} s {said}", flush=True)
            finally:
                if loop:
                    loop.kill()
    print(f"\n| load | threads | {args.steps} steps (median of {args.rounds}) | against torch's default |")
    print("|---|---|---:|---:|")
    for load in ("idle", "busy"):
        reference = statistics.median(times[load, next(iter(arms))])
        for arm in arms:
            median = statistics.median(times[load, arm])
            print(f"| {load} | {arm} | {median:.1f} s | {median / reference:.2f}× |")


if __name__ == "__main__":
    main()
