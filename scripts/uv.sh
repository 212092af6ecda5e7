#!/usr/bin/env bash
# uv with the arguments given (`bash scripts/uv.sh pip install ...`): the uv of .venv, which is made first when absent
# (`python -m venv .venv`, then pip installs uv into it). It looks where pip looks for local wheels too
# (PIP_FIND_LINKS, space-separated; uv reads UV_FIND_LINKS, commas). Modules are compiled to bytecode when first
# imported, not at install (uv's default): Python compiles only what runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/.venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$root/.venv"
[ -x "$root/.venv/bin/uv" ] || "$root/.venv/bin/python" -m pip install --quiet uv
[ -z "${PIP_FIND_LINKS:-}" ] || export UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS// /,}}"
exec "$root/.venv/bin/uv" "$@"
