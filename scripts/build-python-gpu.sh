#!/usr/bin/env bash
# Builds the Python package for the H200 (CUDA, sm_90a) into build-gpu/python, ready to travel with a
# device call beside build-gpu (scripts/build-gpu.sh): the GPU machine has CPython 3.12 and no
# compiler, so the extension is built here as an abi3 wheel for CPython >= 3.12 (nanobind's stable
# ABI) with a local 3.12 ($FDPP_PY312, else python3.12 on PATH, else pyenv's), installed with
# `pip install --target`, and the Debian libraries that machine lacks are copied into fdpp/lib
# (the extension's RPATH is $ORIGIN/lib). pytest travels too (pure Python).
# Then there: bash scripts/gpu-check-python.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py312="${FDPP_PY312:-}"
if [[ -z $py312 ]]; then
  py312=$(command -v python3.12 || true)
  [[ -z $py312 && -x "$HOME/.pyenv/versions/3.12.1/bin/python3.12" ]] && py312="$HOME/.pyenv/versions/3.12.1/bin/python3.12"
  [[ -z $py312 ]] && py312=$(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1 || true)
fi
[[ -x $py312 ]] || { echo "build-python-gpu: no CPython 3.12 found (set FDPP_PY312)" >&2; exit 1; }
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
dist="$root/build-gpu/wheel"
out="$root/build-gpu/python"
rm -rf "$dist" "$out"
mkdir -p "$dist"
"$py312" -m pip wheel --no-deps -w "$dist" "$root" -Ccmake.define.FDPP_CUDA=ON \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90a
"$py312" -m pip install -q --no-deps --target "$out" "$dist"/fdpp-*.whl
"$py312" -m pip install -q --target "$out" pytest
mkdir -p "$out/fdpp/lib"
ldd "$out"/fdpp/_core*.so | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2|libgomp|libsentencepiece|libminizip' |
  while read -r lib; do cp -Lu "$lib" "$out/fdpp/lib/"; done
du -sh "$out" "$out"/fdpp/_core*.so "$out/fdpp/lib"
