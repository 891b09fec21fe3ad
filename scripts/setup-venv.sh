#!/usr/bin/env bash
# The project's own Python virtual environment (.venv at the repository root) with the packages of
# the server tests (tests/requirements.txt: the openai client, pytest, httpx, pinned). Idempotent:
# reinstalls only when the requirements changed. Needs python3-venv (scripts/setup.sh installs it)
# and PyPI.
#   FDPP_VENV=DIR   another place for the environment
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FDPP_VENV:-$root/.venv}"
req="$root/tests/requirements.txt"
stamp="$venv/.fdpp-requirements"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup-venv: creating $venv"
  python3 -m venv "$venv"
fi
if ! cmp -s "$req" "$stamp"; then
  echo "setup-venv: installing $(grep -v '^#' "$req" | tr '\n' ' ')"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi
