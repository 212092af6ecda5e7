#!/usr/bin/env bash
# Fresh-machine set-up: a virtualenv in .venv with the CPU build of torch, this project with the given extras
# ("train" or "test"), and WordNet 3.0 for METEOR (Debian's packages laid out for NLTK; NLTK cannot download here).
# Usage: bash scripts/setup.sh train|test
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-train}"
PYTHON="${PYTHON:-python3}"

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# Pinned first: an unpinned torch would pull a multi-GB CUDA build; 2.13.0 is a local CPU wheel here.
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[${extra}]"

if ! dpkg -s wordnet-base wordnet-sense-index >/dev/null 2>&1; then
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index
fi
.venv/bin/python training/install_wordnet.py
