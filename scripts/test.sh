#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs everything on a fresh machine, checks style and runs the suite, whose
# remote-code tests also run in a transformers 4.57.x environment (.venv-compat), whose training test also runs from a
# wheel install (.venv-wheel) and whose Space test runs in the Space's own environment (.venv-space). Arguments are
# passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# .venv with uv in it (scripts/uv.sh makes it): every environment below installs with it, all at once
bash scripts/uv.sh --version >/dev/null

# A virtualenv DIR (with pip, as `python -m venv` makes it) with PACKAGES, torch pinned to the local CPU build: an
# unpinned one pulls a multi-GB CUDA build.
venv_with() {
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  bash scripts/uv.sh pip install --quiet --python "$dir/bin/python" "$@"
}
# The bytecode of what the tests import in an environment (PYTHON, then Python statements), compiled while the rest
# installs: the tests' processes would otherwise compile it on first import, where this machine sets
# PYTHONDONTWRITEBYTECODE in each process anew.
compile_imports() {
  local python=$1
  shift
  env -u PYTHONDONTWRITEBYTECODE "$python" -c "$*"
}
# A copy of the checkout for the side environments to build from, so that their builds never write the build files
# of the editable install here: all of them install at once.
build_copy=$(mktemp -d)
trap 'rm -rf "$build_copy"' EXIT
"$PYTHON" -c 'import shutil, sys; shutil.copytree(".", sys.argv[1], ignore=shutil.ignore_patterns(
    ".*", "build", "dist", "runs", "*.egg-info", "__pycache__", "*.whl"))' "$build_copy/cdnpg"
# Debian's chromium for the browser test of the demo page (tests/test_demo.py drives it through playwright, from the
# test extra); where it cannot be installed, that test skips and says why.
browser() {
  command -v chromium >/dev/null 2>&1 && return 0
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  { $as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium; } ||
    echo "test.sh: chromium could not be installed: the demo's browser test will skip" >&2
}
# .venv with the test extra and WordNet (scripts/setup.sh), then chromium: one apt-get at a time
main_env() {
  bash scripts/setup.sh test
  compile_imports .venv/bin/python "import cdnpg.augment, cdnpg.commands, cdnpg.demo, cdnpg.training.run, evaluate"
  browser
}
main_env &
main_pid=$!
# transformers 4.57.x beside the current 5.x: checkpoints saved here must load there with trust_remote_code
compat_env() {
  venv_with .venv-compat torch==2.13.0 "transformers==4.57.*" safetensors
  compile_imports .venv-compat/bin/python "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline"
}
compat_env &
compat_pid=$!
# a non-editable install with the train extras: tests/test_training.py builds a wheel of the checkout, installs it
# there and runs training/run.py from another directory, as a user of `pip install .[train]`
wheel_env() {
  venv_with .venv-wheel torch==2.13.0 "setuptools>=64" wheel "$build_copy/cdnpg[train]"
  compile_imports .venv-wheel/bin/python "import cdnpg.training.run, evaluate"
}
wheel_env &
wheel_pid=$!
# the demo Space as Spaces build it: a clean virtualenv with the gradio of its README's sdk_version, then its
# requirements.txt alone, which names the wheel built beside it as docs/demo.md builds it; tests/test_demo.py runs
# the Space's app.py with that Python
space_venv() {
  local space="$build_copy/space" venv="$PWD/.venv-space"
  rm -rf "$venv"  # anew each time: a package left from an earlier requirements.txt would hide a missing one
  cp -r spaces/cdnpg-demo "$space"
  bash scripts/uv.sh build --quiet --wheel --out-dir "$space" "$build_copy/cdnpg"
  venv_with "$venv" torch==2.13.0 "gradio==$(sed -n 's/^sdk_version: //p' "$space/README.md")"
  (cd "$space" && bash "$OLDPWD/scripts/uv.sh" pip install --quiet --python "$venv/bin/python" -r requirements.txt)
  compile_imports "$venv/bin/python" "import cdnpg.demo"
}
space_venv &
space_pid=$!
wait "$main_pid"
wait "$compat_pid"
wait "$wheel_pid"
wait "$space_pid"
.venv-wheel/bin/python training/install_wordnet.py  # WordNet for the wheel's METEOR, from what setup.sh installed

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two pytest-xdist workers on one thread each (a tiny model gains nothing from a second thread, and two workers with
# two threads each would wait on each other's cores). The tests marked `serial` start processes of their own on every
# core: they run one after another on one worker (tests/conftest.py), while the other worker runs the rest. The 30
# slowest tests are listed.
export CDNPG_COMPAT_PYTHON="$PWD/.venv-compat/bin/python" CDNPG_WHEEL_PYTHON="$PWD/.venv-wheel/bin/python"
export CDNPG_SPACE_PYTHON="$PWD/.venv-space/bin/python"
export OMP_NUM_THREADS=1
# The suite starts over a hundred Python processes: a module that compile_imports did not compile is compiled to
# bytecode once, by the first process that imports it, even where the machine sets PYTHONDONTWRITEBYTECODE.
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
