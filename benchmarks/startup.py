#!/usr/bin/env python
"""How long a fresh process takes to start what every cdnpg process imports, per Python environment: each round runs
the import in a fresh process of each environment, in alternating order; the child's CPU seconds (user + system),
the median over rounds, and each environment's ratio to the first.

    python benchmarks/startup.py --pythons .venv/bin/python ../other-checkout/.venv/bin/python --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess

from common import check_positive

IMPORTS = "from transformers import PreTrainedModel"  # torch and transformers, as the model, pipeline and Trainer need


def cpu_seconds(python: str, code: str) -> float:
    """CPU seconds of a fresh `python -c code`, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [python, "-c", code], check=True, stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythons", nargs="+", required=True, help="the interpreters of the environments to compare")
    parser.add_argument("--code", default=IMPORTS, help=f"what each process runs (default: {IMPORTS})")
    parser.add_argument("--rounds", type=int, default=5, help="processes per environment (default 5)")
    args = parser.parse_args(argv)
    check_positive(parser, args, "rounds")
    if len(set(args.pythons)) < len(args.pythons):
        parser.error("--pythons: name each interpreter once")
    for python in args.pythons:  # the first import of an environment writes its bytecode: not timed
        if shutil.which(python) is None:
            parser.error(f"--pythons: {python} is not an executable")
        try:
            cpu_seconds(python, args.code)
        except subprocess.CalledProcessError as failed:
            parser.error(f"--code failed in {python} (exit status {failed.returncode}; its error is above)")
    seconds = {python: [] for python in args.pythons}
    for round_ in range(args.rounds):
        for python in args.pythons[:: 1 if round_ % 2 == 0 else -1]:
            seconds[python].append(cpu_seconds(python, args.code))
    medians = {python: statistics.median(values) for python, values in seconds.items()}
    first = medians[args.pythons[0]]
    result = {"code": args.code, "cpu_seconds": seconds, "median_s": medians,
              "ratio_to_first": {python: median / first for python, median in medians.items()}}  # fmt: skip
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
