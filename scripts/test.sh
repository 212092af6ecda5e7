#!/usr/bin/env bash
# The test command (README.md, .ci/run): installs everything on a fresh machine, checks style and runs the suite, whose
# remote-code tests also run in a transformers 4.57.x environment (.venv-compat) and whose training test also runs
# from a wheel install (.venv-wheel). Arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# A virtualenv DIR with PACKAGES (torch pinned to the local CPU build: an unpinned one pulls a multi-GB CUDA build).
venv_with() {
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  "$dir/bin/python" -m pip install --quiet "$@"
}
# transformers 4.57.x beside the current 5.x: checkpoints saved here must load there with trust_remote_code. It builds
# nothing in the checkout, so it installs while .venv does.
venv_with .venv-compat torch==2.13.0 "transformers==4.57.*" safetensors &
compat_pid=$!
# a non-editable install with the train extras (and WordNet): tests/test_training.py builds a wheel of the checkout,
# installs it there and runs training/run.py from another directory, as a user of `pip install .[train]` would. Its
# torch installs while .venv does; the checkout itself only once setup.sh has built its editable install, as two
# builds in one folder would write the same build files.
venv_with .venv-wheel torch==2.13.0 "setuptools>=64" wheel &
wheel_pid=$!
bash scripts/setup.sh test
# Debian's chromium for the browser test of the demo page (tests/test_demo.py drives it through playwright, from the
# test extra); where it cannot be installed, that test skips and says why
browser() {
  command -v chromium >/dev/null 2>&1 && return 0
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  { $as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium; } ||
    echo "test.sh: chromium could not be installed: the demo's browser test will skip" >&2
}
browser &
browser_pid=$!
wait "$wheel_pid"
.venv-wheel/bin/python -m pip install --quiet ".[train]"
.venv-wheel/bin/python training/install_wordnet.py

wait "$browser_pid"
wait "$compat_pid"

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two pytest-xdist workers on one thread each (a tiny model gains nothing from a second thread, and two workers with
# two threads each would wait on each other's cores); then the tests marked `serial`, which start several processes
# of their own, alone. The 30 slowest tests of each part are listed.
export CDNPG_COMPAT_PYTHON="$PWD/.venv-compat/bin/python" CDNPG_WHEEL_PYTHON="$PWD/.venv-wheel/bin/python"
export OMP_NUM_THREADS=1
status=0
.venv/bin/python -m pytest -q -n 2 --dist loadgroup -m "not serial" --durations=30 "$@" || status=$?
.venv/bin/python -m pytest -q -m serial --durations=30 "$@" || [ $? -eq 5 ] || status=1  # 5: none selected
exit $status
