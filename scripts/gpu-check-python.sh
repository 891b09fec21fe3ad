#!/usr/bin/env bash
# On the GPU machine: the Python package's tests on the GPU (FDPP_TEST_DEVICE=cuda), then the
# throughput of llm.generate against `fdpp bench` (bench/python_generate_bench.py). Needs
# build-gpu/python (scripts/build-python-gpu.sh) and build-gpu/fdpp + build-gpu/lib
# (scripts/build-gpu.sh) carried with the call, and the default model at /root/ref/model.gguf (as
# scripts/gpu-check.sh joins it) or $FDPP_MODEL. Output under $OUT (or ./out).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
if [[ ! -d $B/python && -f $B/python.tar.xz ]]; then tar xJf "$B/python.tar.xz" -C "$B"; fi
# fdpp and lib/ may travel as scripts/gpu-check.sh takes them (.ref/bin.tar.xz).
if [[ ! -x $B/fdpp && -f $root/.ref/bin.tar.xz ]]; then mkdir -p "$B" && tar xJf "$root/.ref/bin.tar.xz" -C "$B"; fi
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}"
export FDPP_BIN="$B/fdpp"
# The default model travels in FDPP_MODEL_PARTS parts, one per call, as scripts/gpu-check.sh takes
# it: each call's .ref/part.* is kept in /root/ref, and the model is joined once all are there.
if [[ ! -s /root/ref/model.gguf ]]; then
  mkdir -p /root/ref
  cp "$root"/.ref/part.* /root/ref/ 2>/dev/null
  n_parts=$(ls /root/ref/part.* 2>/dev/null | wc -l)
  if [[ $n_parts -gt 0 && $n_parts -eq ${FDPP_MODEL_PARTS:-2} ]]; then cat /root/ref/part.* >/root/ref/model.gguf; fi
fi
if [[ -z ${FDPP_MODEL:-} && -s /root/ref/model.gguf ]]; then export FDPP_MODEL=/root/ref/model.gguf; fi
python3 -c "import fdpp; print('fdpp', fdpp.__file__, 'cuda built:', fdpp.cuda_built)"
rc=0
# The fresh-venv install test needs a compiler and PyPI: not on this machine.
(cd "$root/tests/python" && FDPP_TEST_DEVICE=cuda FDPP_TEST_INSTALL=0 CI= python3 -m pytest -q -rs -p no:cacheprovider . \
   2>&1 | tee "$OUT/pytest-gpu.txt") || rc=1
python3 "$root/bench/python_generate_bench.py" --fdpp "$B/fdpp" --json "$OUT/python_generate_bench.json" \
  2>&1 | tee "$OUT/python_generate_bench.txt" || rc=1
python3 "$root/bench/python_generate_bench.py" --fdpp "$B/fdpp" --batch 256 \
  2>&1 | tee -a "$OUT/python_generate_bench.txt" || rc=1
exit $rc
