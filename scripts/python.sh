#!/usr/bin/env bash
# Prints the Python that scripts/setup.sh and scripts/test.sh make their virtualenvs with: $PYTHON where set; else the
# system's /usr/bin/python3 where it is 3.10 or newer, makes a virtualenv with pip and has its C headers (inductor
# compiles kernels against Python.h); else python3 from PATH.
# Debian's is statically linked and built with profile-guided and link-time optimisation: it imports torch and
# transformers in about a fifth less CPU time than a default source build (pyenv's, which often comes first on PATH),
# and the suite starts over a hundred processes that import them.
set -euo pipefail
if [ -n "${PYTHON:-}" ]; then
  echo "$PYTHON"
elif /usr/bin/python3 -c 'import ensurepip, os, sys, sysconfig, venv
sys.exit(sys.version_info < (3, 10) or not os.path.isfile(os.path.join(sysconfig.get_path("include"), "Python.h")))' \
  2>/dev/null; then
  echo /usr/bin/python3
else
  echo python3
fi
