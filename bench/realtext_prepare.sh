#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh's realtext stage reads (issue 41, item 2: prefill attention's
# fallback rows on real text), in .ref/realtext/ (or $1), small enough for one GPU call:
#   gpl3.txt, readme.txt   real prompts: the first 32,000 bytes of Debian's GPL-3 text (6,926 tokens)
#                          and the first 22,000 of README.md (7,482 tokens at 2026-12-07)
#   model.gguf.xz          the default model's first 10 of 30 layers, the prompts' token embeddings
#                          kept (bench/gguf_first_layers.py), xz-compressed (22 MB)
#   first10.calib.json     `fdpp calibrate` of that model on the CPU (the built-in prompts)
# Needs the default model (scripts/fetch-default-model.sh), a build's fdpp (FDPP_BIN, default
# build/fdpp), xz, and the gguf package (installed into a throwaway virtual environment here).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/.ref/realtext}"
fdpp="${FDPP_BIN:-$root/build/fdpp}"
cache="${FDPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fdpp}"
model="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -x $fdpp ]] || { echo "realtext_prepare: no fdpp at $fdpp (build first, or set FDPP_BIN)" >&2; exit 1; }
[[ -s $model ]] || bash "$root/scripts/fetch-default-model.sh"
[[ -s /usr/share/common-licenses/GPL-3 ]] || { echo "realtext_prepare: /usr/share/common-licenses/GPL-3 missing (Debian base-files)" >&2; exit 1; }
mkdir -p "$out"
head -c 32000 /usr/share/common-licenses/GPL-3 >"$out/gpl3.txt"
head -c 22000 "$root/README.md" >"$out/readme.txt"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q gguf numpy
"$venv/bin/python" "$root/bench/gguf_first_layers.py" "$model" --layers 10 -o "$venv/first10.gguf" \
  --keep-tokens-of "$out/gpl3.txt" "$out/readme.txt" --fdpp "$fdpp"
"$fdpp" calibrate -m "$venv/first10.gguf" -o "$out/first10.calib.json" >/dev/null
xz -T0 -6 -c "$venv/first10.gguf" >"$out/model.gguf.xz"
ls -la "$out"
