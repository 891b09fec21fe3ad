#!/usr/bin/env bash
# FP8 weights (--quantization fp8) on the H200 against the same model in bf16, random weights
# (--load-format dummy, Llama-3-8B shapes). Runs on the GPU machine with the build-gpu/ folder of
# scripts/build-gpu.sh. Raw output under $OUT/fp8, a table on stdout.
#   FDPP_FP8_STAGES="static crossover llama2 chat"   (default: all)
#   FDPP_FP8_MODES="gemv flat cublas"   the crossover stage's forced kernels
#
# static:    fdpp bench, bf16 and fp8: prefill of 1,024 tokens and decode at batch 1, 8, 64, 256 and
#            context 1,024; the % of roofline is of each run's own bytes (fp8 reads half the layers').
# crossover: fp8 decode at batch 1-64 with each kernel forced (--linear gemv|flat|cublas; the GEMV
#            stops at 8): where the dispatcher's switches (fp8_choice) should be.
# llama2:    issue 42's goals: Llama-2-7B f16 and fp8 at batch 1 and 64, context 1K.
# chat:      issue 40's chat workload offline (bench/throughput_h200.sh), fp8.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT_TOP="${OUT:-$root/out}"
OUT="$OUT_TOP/fp8"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
stages="${FDPP_FP8_STAGES:-static crossover llama2 chat}"
l3="$root/configs/llama-3-8b.json"

table() {  # table JSON TITLE: one line per test
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"{sys.argv[2]}: no result ({e})")
for x in r["results"]:
    if x["test"].startswith("tg"):
        print(f"{sys.argv[2]} {x['test']}: {x['ms_per_step']:.3f} ms/step, {x['tokens_per_second']:.0f} tokens/s, "
              f"{100 * x['roofline_measured']:.1f}% of its read roofline")
    elif x["test"].startswith("pp"):
        print(f"{sys.argv[2]} {x['test']}: {x['tokens_per_second']:.0f} tokens/s")
PY
}

for stage in $stages; do
  case $stage in
    static)
      for q in none fp8; do
        "$B/fdpp" bench --load-format dummy --config "$l3" --dtype bf16 --quantization $q -b 1,8,64,256 -c 1024 \
          -p 1024 -r 2 --json >"$OUT/static_$q.json" 2>"$OUT/static_$q.err" || echo "static $q: $(tail -1 "$OUT/static_$q.err")"
        table "$OUT/static_$q.json" "Llama-3-8B bf16 weights $q"
      done
      ;;
    crossover)
      for mode in ${FDPP_FP8_MODES:-gemv flat cublas}; do
        batches=1,2,4,8,16,32,64
        [[ $mode == gemv ]] && batches=1,2,3,4,5,6,8
        "$B/fdpp" bench --load-format dummy --config "$l3" --dtype bf16 --quantization fp8 --linear $mode \
          -b $batches -c 1024 -r 2 --json >"$OUT/crossover_$mode.json" 2>"$OUT/crossover_$mode.err" ||
          echo "crossover $mode: $(tail -1 "$OUT/crossover_$mode.err")"
        table "$OUT/crossover_$mode.json" "fp8 --linear $mode"
      done
      ;;
    llama2)
      for q in none fp8; do
        "$B/fdpp" bench --load-format dummy --config "$root/configs/llama-2-7b.json" --dtype f16 --quantization $q \
          -b 1,64 -c 1024 -r 2 --json >"$OUT/llama2_$q.json" 2>"$OUT/llama2_$q.err" || echo "llama2 $q: $(tail -1 "$OUT/llama2_$q.err")"
        table "$OUT/llama2_$q.json" "Llama-2-7B f16 weights $q"
      done
      ;;
    chat)
      OUT="$OUT_TOP" FDPP_THROUGHPUT_STAGES=chat FDPP_THROUGHPUT_SERVED="${FDPP_FP8_SERVED:-0}" FDPP_THROUGHPUT_TAG=fp8 \
        FDPP_THROUGHPUT_ARGS="--quantization fp8" bash "$root/bench/throughput_h200.sh"
      ;;
    *) echo "fp8_h200: unknown stage '$stage'"; exit 2 ;;
  esac
done
