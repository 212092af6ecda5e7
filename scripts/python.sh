#!/usr/bin/env bash
# Prints the Python that scripts/setup.sh and scripts/test.sh make their virtualenvs with: $PYTHON where set; else the
# system's /usr/bin/python3 where it is 3.10 or newer and makes a virtualenv with pip; else python3 from PATH.
# Debian's is statically linked and built with profile-guided and link-time optimisation: it imports torch and
# transformers in about a fifth less CPU time than a default source build (pyenv's, which often comes first on PATH),
# and the suite starts over a hundred processes that import them.
set -euo pipefail
if [ -n "${PYTHON:-}" ]; then
  echo "$PYTHON"
elif /usr/bin/python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo /usr/bin/python3
else
  echo python3
fi
