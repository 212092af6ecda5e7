#!/usr/bin/env bash
# uv, as scripts/setup.sh installs it into .venv, with the arguments given (`bash scripts/uv.sh pip install ...`),
# looking where pip looks for local wheels too (PIP_FIND_LINKS, space-separated; uv reads UV_FIND_LINKS, commas).
# Modules are compiled to bytecode when first imported, not at install (uv's default): Python compiles only what runs.
set -euo pipefail
[ -z "${PIP_FIND_LINKS:-}" ] || export UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS// /,}}"
exec "$(dirname "$0")/../.venv/bin/uv" "$@"
