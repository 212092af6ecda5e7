#!/usr/bin/env python
"""How long a fresh process takes to start what every cdnpg process imports, per Python environment: each round runs
the code in a fresh process of each environment, in alternating order; the child's CPU seconds (user + system), the
median over rounds, and each one's ratio to the first. With --compare-collector, each environment also runs it with
`cdnpg.startup.long_lived_imports` doing nothing: the garbage collector at work while training/run.py imports.

    python benchmarks/startup.py --pythons .venv/bin/python ../other-checkout/.venv/bin/python --rounds 5
    python benchmarks/startup.py --pythons .venv/bin/python --compare-collector --code run.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
from pathlib import Path

from common import check_positive

ROOT = Path(__file__).resolve().parents[1]  # the checkout: training/run.py is run from here
IMPORTS = "from transformers import PreTrainedModel"  # torch and transformers, as the model, pipeline and Trainer need
RUN_PY_HELP = (
    'import runpy, sys; sys.argv = ["run.py", "--help"]; runpy.run_path("training/run.py", run_name="__main__")'
)
COLLECTOR_AT_WORK = "import contextlib, cdnpg.startup\ncdnpg.startup.long_lived_imports = contextlib.nullcontext\n"


def cpu_seconds(python: str, code: str) -> float:
    """CPU seconds of a fresh `python -c code` in the checkout, which must succeed; what it prints is dropped."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [python, "-c", code],
        check=True,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # this script's own output is the JSON line alone
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythons", nargs="+", required=True, help="the interpreters of the environments to compare")
    parser.add_argument(
        "--code",
        default=IMPORTS,
        help=f"what each process runs: Python code, or `run.py` for training/run.py --help, which imports all that a "
        f"training imports (default: {IMPORTS})",
    )
    parser.add_argument("--rounds", type=int, default=5, help="processes per environment (default 5)")
    parser.add_argument(
        "--compare-collector", action="store_true", help="also run the code with long_lived_imports doing nothing"
    )
    args = parser.parse_args(argv)
    check_positive(parser, args, "rounds")
    if len(set(args.pythons)) < len(args.pythons):
        parser.error("--pythons: name each interpreter once")
    code = RUN_PY_HELP if args.code == "run.py" else args.code
    runs = {python: (python, code) for python in args.pythons}
    if args.compare_collector:
        runs |= {f"{python} (collector at work)": (python, COLLECTOR_AT_WORK + code) for python in args.pythons}
    for python in args.pythons:
        if shutil.which(python) is None:
            parser.error(f"--pythons: {python} is not an executable")
    for name, run in runs.items():  # the first import of an environment writes its bytecode: not timed
        try:
            cpu_seconds(*run)
        except subprocess.CalledProcessError as failed:
            parser.error(f"--code failed in {name} (exit status {failed.returncode}; its error is above)")
    seconds = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name in list(runs)[:: 1 if round_ % 2 == 0 else -1]:
            seconds[name].append(cpu_seconds(*runs[name]))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    first = medians[args.pythons[0]]
    result = {"code": code, "cpu_seconds": seconds, "median_s": medians,
              "ratio_to_first": {name: median / first for name, median in medians.items()}}  # fmt: skip
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
