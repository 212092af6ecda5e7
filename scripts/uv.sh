#!/usr/bin/env bash
# uv, as scripts/setup.sh installs it into .venv, with the arguments given (`bash scripts/uv.sh pip install ...`),
# looking where pip looks for local wheels too (PIP_FIND_LINKS, space-separated; uv reads UV_FIND_LINKS, commas), and
# compiling the installed modules to bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, Python would
# otherwise compile torch and transformers from source in every process that imports them.
set -euo pipefail
[ -z "${PIP_FIND_LINKS:-}" ] || export UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS// /,}}"
export UV_COMPILE_BYTECODE="${UV_COMPILE_BYTECODE:-1}"
exec "$(dirname "$0")/../.venv/bin/uv" "$@"
