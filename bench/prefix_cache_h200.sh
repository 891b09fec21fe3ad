#!/usr/bin/env bash
# Issue 43's prefix caching goals on the H200 (Llama-3-8B bf16, random weights: --load-format dummy),
# each workload served twice by bench/serve_bench.py: with the prefix cache (the default) and with
# --no-prefix-cache. Runs on the GPU machine with the build-gpu/ folder of scripts/build-gpu.sh
# (carry ["build-gpu"]); Python 3 with numpy and aiohttp or httpx. Results (JSON + logs) under
# $OUT/prefix_cache, a line per goal on stdout. Not run yet: no GPU in the session that wrote it.
#   FDPP_PC_STAGES="sysprompt multiturn unique pressure"   (default: all; each fits one 10-minute call)
#   FDPP_PC_CONFIG=configs/llama-3-8b.json  FDPP_PC_ARGS="..." extra flags for fdpp serve
#   FDPP_PC_ANSWER=384: output tokens of a multi-turn answer (8 turns of 128 new + 384 answered tokens
#                       bring a conversation to about 4K tokens)
#   FDPP_PC_PRESSURE_PERCENT=120: the pressure stage's KV pool in % of the working set (below 100 the
#                       conversations cannot all stay cached: evictions and preemptions)
#
# sysprompt: a 4,096-token system prompt shared by every request plus a 64-token question, one request
#            at a time (16). Goal: warm TTFT p50 at most 10% of the uncached one.
# multiturn: 64 users x 8 turns at rate inf, each turn resending the conversation plus 128 new
#            tokens. Goal: output tokens/s at least 2.5x, TTFT p50 at least 4x lower.
# unique:    256 unique 512-token prompts, 128 outputs, rate inf. Goal: within 2% of no cache.
# pressure:  multiturn with a KV pool of 1.2x its working set (64 x 4K tokens). Goal: no failed
#            request; evictions show in /metrics (serve_bench's "prefix_cache_evictions").
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT="${OUT:-$root/out}/prefix_cache"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
config="${FDPP_PC_CONFIG:-$root/configs/llama-3-8b.json}"
stages="${FDPP_PC_STAGES:-sysprompt multiturn unique pressure}"
answer="${FDPP_PC_ANSWER:-384}"
port="${FDPP_PC_PORT:-8080}"
serve="$B/fdpp serve --load-format dummy --config $config --port $port --ctx-size 8192 ${FDPP_PC_ARGS:-}"
run() {  # run NAME EXTRA_SERVE_FLAGS serve_bench flags...: one served run, JSON in $OUT/NAME.json
  local name=$1 flags=$2
  shift 2
  python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$port" --launch "$serve $flags --step-log $OUT/$name.steps.jsonl" \
    --launch-timeout 600 --result-json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
}
field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(eval(sys.argv[2]))" "$@"; }
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.3f}' if b else 'nan')" "$1" "$2"; }

for stage in $stages; do
  case $stage in
    sysprompt)
      args=(--num-prompts 16 --max-concurrency 1 --shared-prefix-len 4096 --input-len 64 --output-len 128)
      run sys_on "" "${args[@]}"
      run sys_off --no-prefix-cache "${args[@]}"
      on=$(field "$OUT/sys_on.json" "r['ttft_ms']['p50']"); off=$(field "$OUT/sys_off.json" "r['ttft_ms']['p50']")
      echo "sysprompt: TTFT p50 $on ms cached vs $off ms uncached: ratio $(ratio "$on" "$off") (goal <= 0.10)"
      ;;
    multiturn|pressure)
      flags=""
      # The working set: 64 conversations of 8 x (128 + answer) tokens.
      [[ $stage == pressure ]] && flags="--kv-cache-tokens $(( 64 * 8 * (128 + answer) * ${FDPP_PC_PRESSURE_PERCENT:-120} / 100 ))"
      args=(--num-prompts 64 --turns 8 --input-len 128 --output-len "$answer" --request-rate inf)
      run "${stage}_on" "$flags" "${args[@]}"
      if [[ $stage == pressure ]]; then
        echo "pressure: failed $(field "$OUT/pressure_on.json" "r['failed']") (goal 0), evictions" \
             "$(field "$OUT/pressure_on.json" "r['prefix_cache_evictions']"), preemptions $(field "$OUT/pressure_on.json" "r['preemptions']")"
        continue
      fi
      run multiturn_off --no-prefix-cache "${args[@]}"
      on=$(field "$OUT/multiturn_on.json" "r['output_throughput']"); off=$(field "$OUT/multiturn_off.json" "r['output_throughput']")
      ton=$(field "$OUT/multiturn_on.json" "r['ttft_ms']['p50']"); toff=$(field "$OUT/multiturn_off.json" "r['ttft_ms']['p50']")
      echo "multiturn: output $on vs $off tokens/s: $(ratio "$on" "$off")x (goal >= 2.5); TTFT p50 $ton vs $toff ms:" \
           "$(ratio "$toff" "$ton")x lower (goal >= 4); cached prompt tokens $(field "$OUT/multiturn_on.json" "r['cached_prompt_tokens']")"
      ;;
    unique)
      args=(--num-prompts 256 --input-len 512 --output-len 128 --request-rate inf)
      run unique_on "" "${args[@]}"
      run unique_off --no-prefix-cache "${args[@]}"
      on=$(field "$OUT/unique_on.json" "r['output_throughput']"); off=$(field "$OUT/unique_off.json" "r['output_throughput']")
      echo "unique: output $on vs $off tokens/s: $(ratio "$on" "$off") (goal >= 0.98)"
      ;;
    *) echo "prefix_cache_h200: unknown stage '$stage'"; exit 2 ;;
  esac
done
