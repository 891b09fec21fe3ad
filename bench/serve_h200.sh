#!/usr/bin/env bash
# Issue 12's serving measurements on the H200 (Llama-2-7B fp16, random weights: --load-format dummy),
# each beside the `fdpp bench` number it is judged against. Runs on the GPU machine with the
# build-gpu/ folder of scripts/build-gpu.sh (carry ["build-gpu"]); Python 3 with numpy and aiohttp
# or httpx; no network beyond 127.0.0.1. Results (JSON + logs) under $OUT/serve, a table on stdout.
#   FDPP_SERVE_STAGES="c1 saturation sweep"   (default: all three; each fits one 10-minute call)
#   FDPP_SERVE_CONFIG=configs/llama-2-7b.json  FDPP_SERVE_ARGS="..." extra flags for fdpp serve
#
# c1:         concurrency 1 (16 requests one after another, 512-token prompts, 128 outputs): TPOT vs
#             fdpp bench's decode at batch 1 and context 576 (the mean context of those 128 steps).
#             Goal: within 5%.
# saturation: 256 requests at once, 512 prompt / 128 output tokens: output tokens/s vs fdpp bench's
#             static decode at the largest batch the scheduler reached (read from /metrics while it
#             ran) and context 576. Goal: at least 90%.
# sweep:      Poisson rates 2, 4, 8, 16, 32 req/s and inf, 128 requests each: TTFT/TPOT percentiles.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT="${OUT:-$root/out}/serve"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
config="${FDPP_SERVE_CONFIG:-$root/configs/llama-2-7b.json}"
stages="${FDPP_SERVE_STAGES:-c1 saturation sweep}"
port="${FDPP_SERVE_PORT:-8080}"
# 256 rows so that the saturation run can batch every request; 8192 tokens per step lets 16 prompts
# of 512 prefill in one step (the scheduler chunks beyond).
serve="$B/fdpp serve --load-format dummy --config $config --port $port --max-num-seqs 256 --max-batched-tokens 8192 ${FDPP_SERVE_ARGS:-}"
bench=(python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$port" --input-len 512 --output-len 128
       --launch "$serve" --launch-timeout 600)
static() {  # fdpp bench decode at batch sizes $1 (comma list), context 576, no prefill table
  "$B/fdpp" bench --load-format dummy --config "$config" -b "$1" -c 576 -p 512 -r 2 --json 2>"$OUT/bench_$2.err" >"$OUT/bench_$2.json"
}
tg() {  # ms/step and tokens/s of fdpp bench's tg<batch>@576
  python3 - "$1" "$2" <<'PY'
import json, sys
r = [x for x in json.load(open(sys.argv[1]))["results"] if x["test"] == f"tg{sys.argv[2]}@576"]
print(f"{r[0]['ms_per_step']:.3f} {r[0]['tokens_per_second']:.1f}" if r else "nan nan")
PY
}
field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(eval(sys.argv[2]))" "$@"; }

for stage in $stages; do
  case $stage in
    c1)
      static 1 b1
      "${bench[@]}" --num-prompts 16 --max-concurrency 1 --result-json "$OUT/serve_c1.json" >"$OUT/serve_c1.log" 2>&1
      read -r ms _ < <(tg "$OUT/bench_b1.json" 1)
      tpot=$(field "$OUT/serve_c1.json" "r['tpot_ms']['p50']")
      echo "c1: server TPOT p50 $tpot ms vs fdpp bench tg1@576 $ms ms/token: $(python3 -c "print(f'{$tpot/$ms*100-100:+.1f}%')")"
      # Issue 40's other half at concurrency 1: TTFT of the 512-token prompts against fdpp bench's pp512.
      pp_ms=$(python3 -c "import json,sys; r=[x for x in json.load(open(sys.argv[1]))['results'] if x['test']=='pp512']; print(f\"{r[0]['seconds']*1e3:.3f}\" if r else 'nan')" "$OUT/bench_b1.json")
      ttft=$(field "$OUT/serve_c1.json" "r['ttft_ms']['p50']")
      echo "c1: server TTFT p50 $ttft ms vs fdpp bench pp512 $pp_ms ms: $(python3 -c "print(f'{$ttft/$pp_ms*100-100:+.1f}%')")"
      ;;
    saturation)
      "${bench[@]}" --num-prompts 256 --request-rate inf --result-json "$OUT/serve_sat.json" >"$OUT/serve_sat.log" 2>&1
      batch=$(field "$OUT/serve_sat.json" "int(r['scheduler_running_max'] or 1)")
      static "$batch" static
      read -r ms tps < <(tg "$OUT/bench_static.json" "$batch")
      out=$(field "$OUT/serve_sat.json" "round(r['output_throughput'], 1)")
      echo "saturation: server $out output tokens/s (running max $batch) vs fdpp bench tg$batch@576 $tps tokens/s: $(python3 -c "print(f'{$out/$tps*100:.1f}%')")"
      ;;
    sweep)
      "${bench[@]}" --num-prompts 128 --sweep 2,4,8,16,32,inf --result-json "$OUT/serve_sweep.json" >"$OUT/serve_sweep.log" 2>&1
      python3 - "$OUT/serve_sweep.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("| rate (req/s) | req/s | output tok/s | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) | running max |")
print("| ---: | ---: | ---: | --- | --- | ---: |")
for r in d["runs"]:
    t, p = r["ttft_ms"], r["tpot_ms"]
    print(f"| {r['request_rate']} | {r['request_throughput']:.2f} | {r['output_throughput']:.0f} | "
          f"{t['p50']:.1f} / {t['p90']:.1f} / {t['p99']:.1f} | {p['p50']:.2f} / {p['p90']:.2f} / {p['p99']:.2f} | "
          f"{r['scheduler_running_max']} |")
PY
      ;;
    *) echo "serve_h200: unknown stage '$stage'"; exit 2 ;;
  esac
done
