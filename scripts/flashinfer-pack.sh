#!/usr/bin/env bash
# Packs FlashInfer (issue 13's strongest decode-attention peer) for the GPU machine, which has no
# internet and takes 64 MiB a call: its wheel is 101 MB (0.7.4), mostly the sources of kernels that
# decode does not use. Here, on the development machine (no GPU needed: nvcc compiles for sm_90a):
#   1. installs flashinfer-python and apache-tvm-ffi into a scratch virtual environment;
#   2. compiles FlashInfer's paged decode kernels ahead of time for the given head dims, fp16: its
#      CUDA-core decode module and its tensor-core (fa2 prefill) modules, ~3 min per head dim on
#      2 cores;
#   3. writes .ref/flashinfer-site.tar.xz (23 MB for head dims 128 and 64): the flashinfer package
#      without the kernel sources of its other operators, the compiled modules where FlashInfer
#      loads ahead-of-time modules from (flashinfer/data/aot/NAME/NAME.so), and tvm_ffi for the GPU
#      machine's Python 3.12. The GPU machine's image has FlashInfer's other imports.
# scripts/gpu-check.sh's flashinfer stage unpacks it to /tmp/flashinfer-site and runs
# bench/peers/flashinfer_decode.py (carry .ref; with the binaries as well, stay under 64 MiB: carry
# fdpp alone, not the test binary).
#   usage: bash scripts/flashinfer-pack.sh [HEAD_DIMS, default 128,64]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
head_dims="${1:-128,64}"
version="0.7.4"
tvm_ffi_version="0.1.15.post2"  # flashinfer 0.7.4 needs >=0.1.11,<0.2
work="${FLASHINFER_PACK_DIR:-/tmp/flashinfer-pack}"
venv="$work/venv"
mkdir -p "$work" "$root/.ref"

if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch  # flashinfer imports it (PyPI's build; no GPU is used here)
fi
# The imports flashinfer makes at `import flashinfer`, as on the GPU machine (its image has these).
# pip then warns that its other requirements (cutlass-dsl, cudnn-frontend, ...) are missing: the
# decode kernels need none of them.
"$venv/bin/pip" install -q --no-deps "flashinfer-python==$version"
"$venv/bin/pip" install -q click einops ninja numpy nvidia-ml-py packaging requests tabulate tqdm \
  cuda-bindings cuda-core cuda-pathfinder "apache-tvm-ffi==$tvm_ffi_version"

# Compile: the modules BatchDecodeWithPagedKVCacheWrapper loads for fp16 at these head dims, with
# use_tensor_cores False (batch decode) and True (fa2 batch prefill: its primary and paged modules).
export FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE="$work"
"$venv/bin/python" - "$head_dims" "$work/modules.txt" <<'PY'
import sys, time, torch
from flashinfer.jit.attention import modules
import flashinfer.prefill as prefill
with open(sys.argv[2], "w") as out:
    for d in (int(x) for x in sys.argv[1].split(",")):
        args = (torch.float16, torch.float16, torch.float16, torch.int32, d, d, 0, False, False)
        specs = [modules.gen_batch_decode_module(*args),
                 prefill._gen_batch_prefill_primary_module("fa2", *args, False, False),
                 prefill._gen_batch_prefill_independent_paged_module("fa2", *args, False, False)]
        for spec in specs:
            t = time.time()
            spec.build(verbose=False)
            print(f"{spec.name}: {time.time() - t:.0f} s", flush=True)
            print(spec.name, spec.jit_library_path, file=out)
PY

site="$("$venv/bin/python" -c 'import flashinfer, pathlib
print(pathlib.Path(flashinfer.__file__).parents[1])')"
stage="$work/stage"
rm -rf "$stage" && mkdir -p "$stage"
tar -C "$site" --exclude='__pycache__' -cf - flashinfer | tar -C "$stage" -xf -
# Kernel sources of other operators: data/csrc's subfolders and the CUDA sources that its
# generated backends (flashinfer/cake_*, experimental, ...) keep beside their Python.
find "$stage/flashinfer/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
find "$stage/flashinfer" -path "$stage/flashinfer/data" -prune -o -type f \
  \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.inl' \) -print0 |
  xargs -0 rm -f
while read -r name so; do
  mkdir -p "$stage/flashinfer/data/aot/$name"
  cp "$so" "$stage/flashinfer/data/aot/$name/$name.so"
done <"$work/modules.txt"
"$venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$work/wheels" \
  "apache-tvm-ffi==$tvm_ffi_version"
tvm_wheel=("$work"/wheels/apache_tvm_ffi-"$tvm_ffi_version"-cp312-*.whl)
(cd "$stage" && python3 -m zipfile -e "${tvm_wheel[0]}" .)
tar -C "$stage" -cJf "$root/.ref/flashinfer-site.tar.xz" .
ls -la "$root/.ref/flashinfer-site.tar.xz"
