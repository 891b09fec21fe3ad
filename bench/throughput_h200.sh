#!/usr/bin/env bash
# Throughput at load on the H200 (random weights, --load-format dummy): each workload offline
# (`fdpp generate -f` over the same requests as a prompts file) and served at rate inf
# (bench/serve_bench.py against `fdpp serve`), each with its scheduler step log summarized by
# bench/step_timeline.py, beside `fdpp bench`'s static decode. Runs on the GPU machine with the
# build-gpu/ folder of scripts/build-gpu.sh; Python 3 with numpy and aiohttp or httpx. JSON, logs and
# step logs under $OUT/throughput, a table on stdout.
#   FDPP_THROUGHPUT_STAGES="static chat long job7b sweep busy"   (default: static chat long job7b)
#   FDPP_THROUGHPUT_ARGS="..."   extra engine flags for generate -f and serve (e.g. --max-num-seqs 512)
#   FDPP_THROUGHPUT_SERVED=0     offline only
#   FDPP_THROUGHPUT_TAG=NAME     a suffix for the result files (runs with different flags side by side)
#
# static: fdpp bench, Llama-3-8B bf16, decode at batch 256 (and 512 where the GPU holds it), context 1K:
#         % of the read roofline.
# chat:   1,000 requests, prompts uniform in [16, 512] tokens, outputs uniform in [12, 388] (means 264
#         and 200), ignore_eos, greedy, Llama-3-8B bf16 (serve_bench --input-len 264 --output-len 200
#         --range-ratio 0.94 --num-prompts 1000 --seed 0).
# long:   256 requests of 2,048 prompt and 256 output tokens, Llama-3-8B bf16.
# job7b:  256 requests of 512 prompt and 128 output tokens, Llama-2-7B fp16 (bench/serve_h200.sh's
#         saturation job), against the static prefill + decode time of the same job.
# sweep:  the chat workload served at Poisson rates (256 requests per rate).
# busy:   the GPU's busy time (issue 40, no Nsight Systems needed): the chat workload served at rate
#         inf as in chat, fdpp serve under tools/gpu_trace's libfdpp_gpu_trace.so (CUPTI: every
#         kernel, copy and memset), then bench/gpu_busy.py over serve_bench's measured interval: busy
#         %, idle gaps by length, a timeline figure. The traces (tens of MB) go to
#         ${FDPP_GPU_TRACE_DIR:-/tmp/fdpp_gpu_trace}, not $OUT. FDPP_THROUGHPUT_BUSY_OFFLINE=1 also
#         traces the same requests offline (generate -f).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT="${OUT:-$root/out}/throughput"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
stages="${FDPP_THROUGHPUT_STAGES:-static chat long job7b}"
port="${FDPP_THROUGHPUT_PORT:-8090}"
extra="${FDPP_THROUGHPUT_ARGS:-}"
l3="$root/configs/llama-3-8b.json"
l2="$root/configs/llama-2-7b.json"
# Static batch 512 (and job7b's 256 x 576 MHA cache, 76 GiB) need an H200's memory; an 80 GB card
# runs the static figure at batches 1 and 256 only.
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
static_batches="1,256,512"
[[ ${gpu_mib:-0} -lt 120000 ]] && static_batches="1,256"

# served_summary RESULT.json NAME: serve_bench's run at rate inf in one line.
served_summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    sys.exit(f"{sys.argv[2]} served: no result ({e})")
t, p, i = r["ttft_ms"], r["tpot_ms"], r.get("itl_ms", {})
print(f"{sys.argv[2]} served (rate inf): {r['output_throughput']:.0f} output tokens/s, {r['duration_s']:.1f} s, "
      f"TTFT p50 {t['p50']:.0f} ms, TPOT p50 {p['p50']:.1f} ms, ITL p99 {i.get('p99', float('nan')):.1f} ms, "
      f"running max {r['scheduler_running_max']}, preemptions {r.get('preemptions', '?')}")
PY
}

# workload NAME CONFIG VOCAB DTYPE SERVE_BENCH_ARGS...: offline, then served at rate inf.
workload() {
  local name=$1${FDPP_THROUGHPUT_TAG:+_$FDPP_THROUGHPUT_TAG} config=$2 vocab=$3 dtype=$4
  shift 4
  python3 "$root/bench/serve_bench.py" "$@" --warmup 2 --vocab-size "$vocab" --write-prompts "$OUT/$name.jsonl"
  "$B/fdpp" generate -f "$OUT/$name.jsonl" --load-format dummy --config "$config" --dtype "$dtype" --quiet \
    --step-log "$OUT/${name}_offline_steps.jsonl" $extra >"$OUT/${name}_offline_out.jsonl" 2>"$OUT/${name}_offline.log"
  echo "$name offline: $(tail -1 "$OUT/${name}_offline.log")"
  python3 "$root/bench/step_timeline.py" "$OUT/${name}_offline_steps.jsonl" --json "$OUT/${name}_offline_timeline.json" \
    --plot "$OUT/${name}_offline_timeline.png" | sed 's/^/  /'
  [[ ${FDPP_THROUGHPUT_SERVED:-1} == 1 ]] || return 0
  local serve="$B/fdpp serve --load-format dummy --config $config --dtype $dtype --port $port --step-log $OUT/${name}_served_steps.jsonl $extra"
  python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$port" "$@" --warmup 2 --request-rate inf \
    --launch "$serve" --launch-timeout 600 --result-json "$OUT/${name}_served.json" >"$OUT/${name}_served.log" 2>&1
  served_summary "$OUT/${name}_served.json" "$name"
  python3 "$root/bench/step_timeline.py" "$OUT/${name}_served_steps.jsonl" --json "$OUT/${name}_served_timeline.json" \
    --plot "$OUT/${name}_served_timeline.png" | sed 's/^/  /'
}

for stage in $stages; do
  case $stage in
    static)
      "$B/fdpp" bench --load-format dummy --config "$l3" --dtype bf16 -b "$static_batches" -c 1024 -p 1024 -r 2 --json \
        >"$OUT/static_l3.json" 2>"$OUT/static_l3.err" || echo "static: fdpp bench failed: $(tail -1 "$OUT/static_l3.err")"
      python3 - "$OUT/static_l3.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"static: no result ({e})")
for x in r["results"]:
    if x["test"].startswith("tg"):
        print(f"static Llama-3-8B bf16 {x['test']}: {x['ms_per_step']:.2f} ms/step, {x['tokens_per_second']:.0f} tokens/s, "
              f"{100 * x['roofline_measured']:.1f}% of the read roofline (measured bandwidth)")
    elif x["test"].startswith("pp"):
        print(f"static Llama-3-8B bf16 {x['test']}: {x['tokens_per_second']:.0f} tokens/s")
PY
      ;;
    chat)
      workload chat "$l3" 128256 bf16 --input-len 264 --output-len 200 --range-ratio 0.94 --num-prompts 1000 --seed 0
      ;;
    long)
      workload long "$l3" 128256 bf16 --input-len 2048 --output-len 256 --num-prompts 256 --seed 0
      ;;
    job7b)
      workload job7b "$l2" 32000 f16 --input-len 512 --output-len 128 --num-prompts 256 --seed 0
      # The static figure: prefill of 256 x 512 tokens at fdpp bench's pp rate, plus 128 decode steps at
      # batch 256 and the job's mean context (512 + 64).
      "$B/fdpp" bench --load-format dummy --config "$l2" -b 256 -c 576 -p 512 -r 2 --json >"$OUT/job7b_static.json" \
        2>"$OUT/job7b_static.err"
      python3 - "$OUT/job7b_static.json" "$OUT/job7b${FDPP_THROUGHPUT_TAG:+_$FDPP_THROUGHPUT_TAG}_served.json" <<'PY'
import json, sys
try:
    r = {x["test"]: x for x in json.load(open(sys.argv[1]))["results"]}
    s = json.load(open(sys.argv[2]))["runs"][0]
except Exception as e:
    sys.exit(f"job7b static: no result ({e})")
pp, tg = r["pp512"], r["tg256@576"]
static_s = 256 * 512 / pp["tokens_per_second"] + 128 * tg["ms_per_step"] / 1e3
print(f"job7b static: 256 x 512 prefill at {pp['tokens_per_second']:.0f} tok/s + 128 steps of {tg['ms_per_step']:.2f} ms "
      f"= {static_s:.2f} s ({256 * 128 / static_s:.0f} output tokens/s); served {s['output_throughput']:.0f} tokens/s "
      f"= {100 * s['output_throughput'] * static_s / (256 * 128):.1f}% of static")
PY
      ;;
    sweep)
      serve="$B/fdpp serve --load-format dummy --config $l3 --dtype bf16 --port $port $extra"
      python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$port" --input-len 264 --output-len 200 \
        --range-ratio 0.94 --num-prompts 256 --sweep 8,16,32,64,inf --launch "$serve" --launch-timeout 600 \
        --result-json "$OUT/chat_sweep.json" >"$OUT/chat_sweep.log" 2>&1
      python3 - "$OUT/chat_sweep.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("| rate (req/s) | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 (ms) | ITL p99 (ms) | ITL p99 / TPOT p50 |")
print("| ---: | ---: | --- | ---: | ---: | ---: |")
for r in d["runs"]:
    t, p, i = r["ttft_ms"], r["tpot_ms"], r.get("itl_ms", {"p99": float("nan")})
    print(f"| {r['request_rate']} | {r['output_throughput']:.0f} | {t['p50']:.0f} / {t['p99']:.0f} | {p['p50']:.1f} | "
          f"{i['p99']:.1f} | {i['p99'] / p['p50']:.2f} |")
PY
      ;;
    busy)
      lib="$B/libfdpp_gpu_trace.so"
      if [[ ! -f $lib ]]; then echo "busy: no $lib (scripts/build-gpu.sh builds it where CUPTI is found)"; continue; fi
      name=chat_busy${FDPP_THROUGHPUT_TAG:+_$FDPP_THROUGHPUT_TAG}
      traces="${FDPP_GPU_TRACE_DIR:-/tmp/fdpp_gpu_trace}"
      mkdir -p "$traces"
      chat=(--input-len 264 --output-len 200 --range-ratio 0.94 --num-prompts 1000 --seed 0 --warmup 2)
      # `env` puts the tracer on fdpp serve alone. serve_bench stops the server with SIGTERM: fdpp serve
      # drains and exits through atexit, where the tracer writes the rest of the trace.
      serve="env CUDA_INJECTION64_PATH=$lib FDPP_GPU_TRACE_OUT=$traces/${name}_served.gputrace $B/fdpp serve --load-format dummy \
        --config $l3 --dtype bf16 --port $port --step-log $OUT/${name}_served_steps.jsonl $extra"
      python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$port" "${chat[@]}" --request-rate inf \
        --launch "$serve" --launch-timeout 600 --result-json "$OUT/${name}_served.json" >"$OUT/${name}_served.log" 2>&1
      served_summary "$OUT/${name}_served.json" "$name (traced)"
      grep -E "^fdpp_gpu_trace" "$OUT/${name}_served.log" | sed 's/^/  /'
      python3 "$root/bench/gpu_busy.py" "$traces/${name}_served.gputrace" --serve-bench "$OUT/${name}_served.json" \
        --json "$OUT/${name}_served_gpu_busy.json" --plot "$OUT/${name}_served_gpu_busy.png" | sed 's/^/  /'
      if [[ ${FDPP_THROUGHPUT_BUSY_OFFLINE:-0} == 1 ]]; then
        [[ -s $OUT/chat.jsonl ]] || python3 "$root/bench/serve_bench.py" "${chat[@]}" --vocab-size 128256 \
          --write-prompts "$OUT/chat.jsonl"
        CUDA_INJECTION64_PATH="$lib" FDPP_GPU_TRACE_OUT="$traces/${name}_offline.gputrace" "$B/fdpp" generate \
          -f "$OUT/chat.jsonl" --load-format dummy --config "$l3" --dtype bf16 --quiet $extra \
          >"$OUT/${name}_offline_out.jsonl" 2>"$OUT/${name}_offline.log"
        echo "$name offline (traced): $(grep -v '^fdpp_gpu_trace' "$OUT/${name}_offline.log" | tail -1)"
        # No client interval offline: the busiest stretch from the first attention kernel (the job).
        python3 "$root/bench/gpu_busy.py" "$traces/${name}_offline.gputrace" --json "$OUT/${name}_offline_gpu_busy.json" \
          --plot "$OUT/${name}_offline_gpu_busy.png" | sed 's/^/  /'
      fi
      ;;
    *) echo "throughput_h200: unknown stage '$stage'"; exit 2 ;;
  esac
done
