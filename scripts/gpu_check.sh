#!/usr/bin/env bash
# Every check that needs a GPU, in one run sized for a lent one (at most 8 minutes on one H200 by default): the CUDA
# tests, SDPA's chosen backend, benchmarks/speed.py at L 20 / 64 / 256 with kernel counts; writes the data of
# docs/speed.md's GPU table to benchmarks/results/gpu.json (scripts/gpu_check.py says what each step runs).
#   bash scripts/gpu_check.sh                                    # on a CUDA machine
#   bash scripts/gpu_check.sh --dry-run --lengths 8 --out x.json  # anywhere: the same steps, tiny, on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
