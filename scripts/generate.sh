#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds fdpp, fetches the default model
# (SmolLM2-135M-Instruct) and generates text from it on the CPU (or GPU, once built with one).
# Arguments go to `fdpp generate`; without any, a chat prompt is used.
#   bash scripts/generate.sh
#   bash scripts/generate.sh --prompt "Once upon a time" --max-tokens 64 --temperature 0.7
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" >&2
bash "$root/scripts/build.sh" >&2
if (($# == 0)); then
  set -- --chat --prompt "Write a haiku about the sea." --max-tokens 64 --temperature 0.7 --seed 1
fi
exec "${FDPP_BUILD_DIR:-$root/build}/fdpp" generate "$@"
