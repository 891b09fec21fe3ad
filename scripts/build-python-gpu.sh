#!/usr/bin/env bash
# Builds the Python package for the H200 (CUDA, sm_90a) into build-gpu/python, ready to travel with a
# device call beside build-gpu (scripts/build-gpu.sh): the GPU machine has CPython 3.12 and no
# compiler, so the extension is built here as an abi3 wheel for CPython >= 3.12 (nanobind's stable
# ABI) with a local 3.12 ($FDPP_PY312, else python3.12 on PATH, else pyenv's), installed with
# `pip install --target`, and the Debian libraries that machine lacks are copied into fdpp/lib
# (the extension's RPATH is $ORIGIN/lib). pytest travels too (pure Python).
# Then there: bash scripts/gpu-check-python.sh, carrying build-gpu/python.tar.xz (or build-gpu/python).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py312=""
# The first candidate that really is CPython 3.12 (pyenv's shims exist for versions not selected).
for c in ${FDPP_PY312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then py312=$(command -v "$c"); break; fi
done
[[ -n $py312 ]] || { echo "build-python-gpu: no CPython 3.12 found (set FDPP_PY312)" >&2; exit 1; }
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
find "$out" -name __pycache__ -prune -exec rm -rf {} +
# One compressed file to carry (a device call takes 64 MiB in all; this is ~10 MB of 38).
tar cJf "$root/build-gpu/python.tar.xz" -C "$root/build-gpu" python
du -sh "$out" "$out"/fdpp/_core*.so "$out/fdpp/lib" "$root/build-gpu/python.tar.xz"
