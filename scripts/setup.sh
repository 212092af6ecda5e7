#!/usr/bin/env bash
# Fresh-machine set-up: a virtualenv in .venv with the CPU build of torch, this project with the given extras
# ("train" or "test"), and WordNet 3.0 for METEOR (Debian's packages laid out for NLTK; NLTK cannot download here).
# Packages install with uv (pip installs uv itself into .venv first, scripts/uv.sh runs it); WordNet's Debian
# packages install meanwhile.
# Usage: bash scripts/setup.sh train|test
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-train}"
PYTHON="$(bash scripts/python.sh)"

wordnet() {
  dpkg -s wordnet-base wordnet-sense-index >/dev/null 2>&1 && return 0
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index
}
wordnet &
wordnet_pid=$!

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet uv
# Pinned first: an unpinned torch would pull a multi-GB CUDA build; 2.13.0 is a local CPU wheel here. pip stays in
# .venv, up to date, for those who use it.
bash scripts/uv.sh pip install --quiet --python .venv/bin/python --upgrade pip torch==2.13.0
excludes=()  # the test extra less scripts/test-excludes.txt, which says why
[ "$extra" != test ] || excludes=(--excludes scripts/test-excludes.txt)
bash scripts/uv.sh pip install --quiet --python .venv/bin/python "${excludes[@]}" -e ".[${extra}]"

wait "$wordnet_pid"
.venv/bin/python training/install_wordnet.py
