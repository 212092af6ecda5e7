#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs everything on a fresh machine, checks style and runs the suite, whose
# remote-code tests also run in a transformers 4.57.x environment (.venv-compat), whose training test also runs from a
# wheel install (.venv-wheel) and whose Space test runs in the Space's own environment (.venv-space). Arguments are
# passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="$(bash scripts/python.sh)"
# The suite starts over a hundred Python processes: each module is compiled to bytecode once, by the first process that
# imports it, even where the machine sets PYTHONDONTWRITEBYTECODE (each process would compile torch anew).
unset PYTHONDONTWRITEBYTECODE

bash scripts/setup.sh test  # .venv, with uv, which installs the side environments below too

# A virtualenv DIR of $PYTHON with pip in it, as `python -m venv` makes one (uv's --seed, in a tenth of the time), and
# PACKAGES, torch pinned to the local CPU build: an unpinned one pulls a multi-GB CUDA build.
venv_with() {
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || bash scripts/uv.sh venv --quiet --seed --python "$PYTHON" "$dir"
  bash scripts/uv.sh pip install --quiet --python "$dir/bin/python" "$@"
}
# A copy of the checkout for the side environments to build from, so that their builds never write the build files
# of the editable install here: all of them install at once.
build_copy=$(mktemp -d)
trap 'rm -rf "$build_copy"' EXIT
"$PYTHON" -c 'import shutil, sys; shutil.copytree(".", sys.argv[1], ignore=shutil.ignore_patterns(
    ".*", "build", "dist", "runs", "*.egg-info", "__pycache__", "*.whl"))' "$build_copy/cdnpg"
# transformers 4.57.x beside the current 5.x: checkpoints saved here must load there with trust_remote_code
venv_with .venv-compat torch==2.13.0 "transformers==4.57.*" safetensors &
compat_pid=$!
# a non-editable install with the train extras and WordNet: tests/test_training.py builds a wheel of the checkout,
# installs it there and runs training/run.py from another directory, as a user of `pip install .[train]`
wheel_env() {
  venv_with .venv-wheel torch==2.13.0 "setuptools>=64" wheel "$build_copy/cdnpg[train]"
  .venv-wheel/bin/python training/install_wordnet.py
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
}
space_venv &
space_pid=$!
# Debian's chromium for the browser test of the demo page (tests/test_demo.py drives it through playwright, from the
# test extra); where it cannot be installed, that test skips and says why. After setup.sh: one apt-get at a time.
browser() {
  command -v chromium >/dev/null 2>&1 && return 0
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  { $as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium; } ||
    echo "test.sh: chromium could not be installed: the demo's browser test will skip" >&2
}
browser &
browser_pid=$!
wait "$compat_pid"
wait "$wheel_pid"
wait "$space_pid"
wait "$browser_pid"

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two pytest-xdist workers on one thread each (a tiny model gains nothing from a second thread, and two workers with
# two threads each would wait on each other's cores). The tests marked `serial` start processes of their own on every
# core: they run one after another on one worker (tests/conftest.py), while the other worker runs the rest. The 30
# slowest tests are listed.
export CDNPG_COMPAT_PYTHON="$PWD/.venv-compat/bin/python" CDNPG_WHEEL_PYTHON="$PWD/.venv-wheel/bin/python"
export CDNPG_SPACE_PYTHON="$PWD/.venv-space/bin/python"
# Inductor compiles each test process's kernels in that process: its default pool of compile workers, one process
# per core that imports torch, would only add processes to two busy cores.
export OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
