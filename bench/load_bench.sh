#!/usr/bin/env bash
# Load time of real-size checkpoints on the GPU machine (issue 14): fdpp's streaming GPU loader vs
# reading the files once (cat > /dev/null) vs transformers' from_pretrained(device_map="cuda"),
# cold and warm, with peak RSS. Makes random Llama-2-7B (13.5 GB) and, unless LOAD_BENCH_SIZES
# says otherwise, 13B (26 GB) bf16 sharded safetensors checkpoints one at a time under
# ${LOAD_BENCH_DIR:-/tmp/fdpp_load_bench} (deleted after each unless LOAD_BENCH_KEEP=1; the
# machine's disk is 64 GiB). Output: JSON lines and a table per size on stdout, copies in $OUT.
#   bash bench/load_bench.sh                (fdpp from build-gpu/, as scripts/gpu-check.sh)
#   FDPP=build/fdpp LOAD_BENCH_SIZES=7b bash bench/load_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
FDPP="${FDPP:-$B/fdpp}"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [[ -f $root/.ref/bin.tar.xz && ! -x $FDPP ]]; then mkdir -p "$B" && tar xJf "$root/.ref/bin.tar.xz" -C "$B"; fi
dir="${LOAD_BENCH_DIR:-/tmp/fdpp_load_bench}"
out="${OUT:-$root/out}"
mkdir -p "$out"
for size in ${LOAD_BENCH_SIZES:-7b 13b}; do
  d="$dir/llama-2-$size-random-bf16"
  python3 "$root/bench/load_bench.py" make "$d" --size "$size"
  # The checkpoint has no tokenizer files: generate by ids must work on it (issue 14).
  "$FDPP" generate --model "$d" --token-ids 1,2,3 -n 4 --temperature 0 --json --quiet > "$out/load_bench_generate_$size.json" \
    || echo "generate --token-ids on $d failed" >&2
  python3 "$root/bench/load_bench.py" run "$d" --fdpp "$FDPP" --label "llama-2-$size" | tee "$out/load_bench_$size.txt"
  [[ ${LOAD_BENCH_KEEP:-0} == 1 ]] || rm -rf "$d"
done
