#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, compute-sanitizer, benchmarks (ours and the peers, same
# run), a short table printed last. Full logs and JSON go to $OUT (or ./out).
#
# The build travels with the call (CMake and the Debian -dev packages are on the development
# machine, not the GPU machine):  here: bash scripts/build-gpu.sh   then run this there with
# carry ["build-gpu"] (plus ".ref" parts of the default model for the greedy test, see below).
#   bash scripts/gpu-check.sh [STAGE...]   (or FDPP_GPU_STAGES="STAGE ..."); the stages, in the order
#   they run, are known_stages below.
# The default, "tests sanitizer attention" (the GPU suite, compute-sanitizer and the decode
# attention grid with its peers), is what one call's 10 minutes hold; the summary gives each
# stage's wall time. The rest go in further calls, e.g. "prefill ttft linear dataflow", "bench
# peers", "gguf", "moe", "load python"; tp needs two GPUs (nvidia-h200-x2).
# The GPU suite alone outgrew 300 s on an H100: split it over calls with googletest's own sharding
# (GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=0, then 1), or pick tests with GTEST_FILTER.
# Only a few files come back from the device call: everything is written under $OUT/full and
# packed into $OUT/full.tar.gz at the end, beside summary.md.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${FDPP_BUILD_DIR:-$root/build-gpu}"
OUT_TOP="${OUT:-$root/out}"
OUT="$OUT_TOP/full"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# NCCL for --tensor-parallel (loaded with dlopen): the toolkit's, else the one PyTorch ships.
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2 && [[ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [[ -n $nccl_dir ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir"
fi
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on the shared GPU machines (device README)
export FDPP_TEST_DIR_OVERRIDE="$root/tests"
stages="${*:-${FDPP_GPU_STAGES:-tests sanitizer attention}}"
# In the order they run:
known_stages="tests sanitizer attention attnlayout attnstream flashinfer attnprofile prefill ttft realtext longctx linear tune dataflow bench gguf moe throughput tp peers load rss python"
for s in $stages; do
  [[ " $known_stages " == *" $s "* ]] || { echo "gpu-check.sh: unknown stage '$s' (stages: $known_stages)" >&2; exit 2; }
done
presets="llama-2-7b llama-2-13b llama-3-8b opt-6.7b chatglm2-6b"
summary="$OUT_TOP/summary.md"
: >"$summary"
log() { echo "$@" | tee -a "$summary"; }
# stage NAME: true when NAME is one of $stages; each stage's wall time goes to the summary (the
# previous stage's when the next one starts, the last one's at the end: stage_done).
stage_name="" stage_t0=0
stage_done() { [[ -n $stage_name ]] && log "(stage $stage_name: $(( $(date +%s) - stage_t0 )) s)"; stage_name=""; }
stage() {
  [[ " $stages " == *" $1 "* ]] || return 1
  stage_done
  stage_name=$1 stage_t0=$(date +%s)
}

# The binaries may travel compressed (.ref/bin.tar.xz: fdpp, fdpp_gpu_tests, lib/ of build-gpu, as
# scripts/pack_device.py packs them).
if [[ -f $root/.ref/bin.tar.xz ]]; then mkdir -p "$B" && tar xJf "$root/.ref/bin.tar.xz" -C "$B"; fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# The default model (98 MB) does not fit one call's 64 MiB: it travels in FDPP_MODEL_PARTS parts
# (split -b 25000000: .ref/part.aa, .ab, ...), one per call, each copied to /root/ref by the
# calls before this one, and is joined here.
model=/root/ref/model.gguf
if [[ ! -s $model ]]; then
  mkdir -p /root/ref
  cp "$root"/.ref/part.* /root/ref/ 2>/dev/null
  n_parts=$(ls /root/ref/part.* 2>/dev/null | wc -l)
  if [[ $n_parts -gt 0 && $n_parts -eq ${FDPP_MODEL_PARTS:-2} ]]; then cat /root/ref/part.* >"$model"; fi
fi
# New HF fixtures made on this machine in the same call (FDPP_HF_FIXTURES_ARCHIVE) join the suite.
if [[ -n ${FDPP_HF_FIXTURES_ARCHIVE:-} && -f $FDPP_HF_FIXTURES_ARCHIVE ]]; then
  tar xzf "$FDPP_HF_FIXTURES_ARCHIVE" -C "$root/tests/fixtures/hf"
fi
if [[ -s $model ]]; then export FDPP_MODEL=$model; mkdir -p /root/.cache/fdpp/models; ln -sf "$model" /root/.cache/fdpp/models/SmolLM2-135M-Instruct.Q4_1.gguf; fi

if stage tests; then
  "$B/fdpp" devices | tee -a "$OUT/gpu.txt"
  "$B/fdpp_gpu_tests" --gtest_color=no 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|NMSE|Failure" | tail -40
  log "GPU tests: $(grep -E '^\[  PASSED  \]' "$OUT/gpu_tests.log" | head -1) $(grep -E '^\[  FAILED  \] [0-9]+ test' "$OUT/gpu_tests.log" | head -1) $(grep -E '^\[  SKIPPED \] [0-9]+ test' "$OUT/gpu_tests.log" | head -1)"
  # The GPU tracer (tools/gpu_trace) on known kernels, a SIGTERM and an fdpp generate run.
  if [[ -f $B/libfdpp_gpu_trace.so ]]; then
    python3 "$root/tests/gpu_trace_test.py" cuda "$B/libfdpp_gpu_trace.so" "$B/fdpp_gpu_trace_probe" "$B/fdpp" \
      >"$OUT/gpu_trace_test.log" 2>&1
    rc=$?
    log "GPU tracer test: exit $rc $(grep -E '^gpu_trace_test|Error' "$OUT/gpu_trace_test.log" | tr '\n' ' ')"
  fi
  if [[ -s $model ]]; then
    for d in cpu cuda; do
      "$B/fdpp" generate --device $d --prompt "What is the capital of France?" --chat --temperature 0 -n 32 --ignore-eos --json >"$OUT/greedy_$d.json" 2>>"$OUT/gpu_tests.log"
    done
    python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/greedy_{d}.json")) for d in ("cpu", "cuda"))
same = a["token_ids"] == b["token_ids"]
print(f"greedy 32 tokens, default model, cpu vs cuda: {'IDENTICAL' if same else 'DIFFERENT'}; cuda decode {b['timings']['decode_tokens_per_second']:.0f} tok/s; text: {b['text'][:60]!r}")
PY
    # Issue 5: the unified max's fallback rate on real text (this repository's README as the
    # prompt, 256 generated tokens), with the default phi = 0 and after fdpp calibrate.
    prompt="$(head -c 6000 "$root/README.md")"
    "$B/fdpp" generate --device cuda --prompt "$prompt" --temperature 0 -n 256 --ignore-eos --json >"$OUT/fallback_default_phi.json" 2>>"$OUT/gpu_tests.log"
    "$B/fdpp" calibrate -m "$model" >"$OUT/calibrate.log" 2>&1 || log "calibrate failed: $(tail -1 "$OUT/calibrate.log")"
    "$B/fdpp" generate --device cuda --prompt "$prompt" --temperature 0 -n 256 --ignore-eos --json >"$OUT/fallback_calibrated.json" 2>>"$OUT/gpu_tests.log"
    python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys
for name in ("default_phi", "calibrated"):
    try:
        r = json.load(open(f"{sys.argv[1]}/fallback_{name}.json"))
        a = r["attention"]
        print(f"unified-max fallback on real text ({name}, {r['timings']['prompt_tokens']} prompt + 256 tokens): {a['fallback_rows']} of {a['decode_rows']} decode rows ({100*a['fallback_rows']/max(1,a['decode_rows']):.3f}%)")
    except Exception as e:
        print(f"fallback {name}: no result ({e})")
PY
    grep -E "phi|fallback" "$OUT/calibrate.log" | tail -3 | tee -a "$summary"
  fi
fi

if stage sanitizer && command -v compute-sanitizer >/dev/null; then
  filter="${FDPP_SANITIZER_FILTER:-*Small*:*Rope*:*Norm*:*KvCache*:*Embedding*:*SampleTies*:*SampleGreedy*:*SampleTopK1*:*SingleRow*:*GraphReplay*:*KvCacheFull*:*Fused*:*SplitKv*:*FlatGemmSplitK*:*GemvPlainApi*}"
  for tool in ${FDPP_SANITIZER_TOOLS:-memcheck racecheck}; do
    # racecheck without the engine tests: their cuBLASLt GEMMs (nvjet_sm90_* kernels) report races
    # whose both sides are inside NVIDIA's code (2026-12-01, docs/results/2026-12-01p-stream-patterns.md).
    tool_filter=$filter
    [[ $tool == racecheck && -z ${FDPP_SANITIZER_FILTER:-} ]] && tool_filter="$filter:-CudaEngine.*"
    compute-sanitizer --tool $tool --error-exitcode 99 "$B/fdpp_gpu_tests" --gtest_filter="$tool_filter" >"$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    log "compute-sanitizer $tool (filter $tool_filter): rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
  done
fi

# The decode-attention stages' head dim (attention, flashinfer).
attn_head_dim="${FDPP_ATTN_HEAD_DIM:-128}"
if stage attention; then
  # Issue 5: decode attention alone, ours (async, sync) and torch SDPA (cuDNN, flash), same shapes.
  ab="${FDPP_ATTN_BATCHES:-1,8,32,64}"
  ac="${FDPP_ATTN_CONTEXTS:-512,1024,4096,16384,65536}"
  for kvh in ${FDPP_ATTN_KV_HEADS:-32 8 2}; do
    "$B/fdpp" bench-attention --heads 32 --kv-heads $kvh --head-dim "$attn_head_dim" -b "$ab" -c "$ac" --json \
      >"$OUT/attn_ours_$kvh.json" 2>"$OUT/attn_ours_$kvh.err" || log "bench-attention 32/$kvh failed: $(tail -1 "$OUT/attn_ours_$kvh.err")"
    # The query group on CUDA cores instead of tensor cores (issue 13's ablation), async only.
    [[ $kvh != 32 && ${FDPP_ATTN_CORE:-1} == 1 ]] && FDPP_DECODE_PATH=core "$B/fdpp" bench-attention --heads 32 --kv-heads $kvh \
      --head-dim "$attn_head_dim" -b "$ab" -c "$ac" --modes async --json >"$OUT/attn_core_$kvh.json" 2>>"$OUT/attn_ours_$kvh.err"
    # Variants of our kernel on the same grid, each a column of the table: FDPP_ATTN_VARIANTS="NAME=FLAGS;..."
    # (flags of fdpp bench-attention). The earlier runs' switches as variants: FDPP_ATTN_WARPS="4 8" is
    # "w4=--decode-warps 4;w8=--decode-warps 8", FDPP_ATTN_COMBINE=1 "combine-kernel=--modes async
    # --async-combine kernel;combine-launch=--modes async --async-combine launch", FDPP_ATTN_MMA_MHA=1
    # "mma=--decode-path mma" (which also runs GQA, where mma is the default).
    IFS=';' read -ra variants <<<"${FDPP_ATTN_VARIANTS:-}"
    for v in "${variants[@]}"; do
      [[ -n $v ]] || continue
      "$B/fdpp" bench-attention --heads 32 --kv-heads $kvh --head-dim "$attn_head_dim" -b "$ab" -c "$ac" ${v#*=} --json \
        >"$OUT/attn_variant_${v%%=*}_$kvh.json" 2>>"$OUT/attn_ours_$kvh.err" || log "bench-attention 32/$kvh ${v#*=} failed"
    done
    # Another build's fdpp on the same grid (FDPP_ATTN_BASE=PATH, e.g. the commit before a change
    # to the kernels, with the same lib/): the "base" column and ours over it.
    if [[ -n ${FDPP_ATTN_BASE:-} ]]; then
      "$FDPP_ATTN_BASE" bench-attention --heads 32 --kv-heads $kvh --head-dim "$attn_head_dim" -b "$ab" -c "$ac" --json \
        >"$OUT/attn_variant_base_$kvh.json" 2>>"$OUT/attn_ours_$kvh.err" || log "base bench-attention 32/$kvh failed"
    fi
    if [[ ${FDPP_ATTN_PEERS:-1} == 1 ]]; then
      python3 "$root/bench/peers/attention_peers.py" --heads 32 --kv-heads $kvh --head-dim "$attn_head_dim" -b "$ab" -c "$ac" \
        --json "$OUT/attn_peers_$kvh.json" >"$OUT/attn_peers_$kvh.log" 2>&1 || log "attention peers 32/$kvh failed: $(tail -1 "$OUT/attn_peers_$kvh.log")"
    fi
  done
  { echo; echo "### decode attention (graph-timed, L2 rotated), fp16, head_dim $attn_head_dim"; \
    python3 "$root/bench/attention_table.py" "$OUT"/attn_ours_*.json --peers $(ls "$OUT"/attn_peers_*.json 2>/dev/null) \
      --core $(ls "$OUT"/attn_core_*.json 2>/dev/null) \
      $(IFS=';' read -ra vs <<<"${FDPP_ATTN_VARIANTS:-}"; for v in "${vs[@]}"; do n=${v%%=*}; \
          ls "$OUT"/attn_variant_${n}_*.json >/dev/null 2>&1 && echo "--extra $n=$(ls "$OUT"/attn_variant_${n}_*.json | paste -sd,)"; done; \
        ls "$OUT"/attn_variant_base_*.json >/dev/null 2>&1 && echo "--extra base=$(ls "$OUT"/attn_variant_base_*.json | paste -sd,)"); } |
    tee -a "$summary"
fi

if stage attnlayout; then
  # Issue 13: how much of the gap to cuDNN (which reads dense [B, KVH, L, D] K/V) is the paged cache's
  # layout. The same kernels on a token-major cache (a token's kv heads adjacent, one head's rows
  # 256 bytes apart from the next token's by KVH x 256) and a head-major one (the engine's: a kv
  # head's block_size rows adjacent), at block sizes FDPP_ATTN_LAYOUT_BLOCKS (default 16 64).
  ab="${FDPP_ATTN_BATCHES:-1,8,32,64}"
  ac="${FDPP_ATTN_CONTEXTS:-512,1024,4096,16384,65536}"
  for kvh in ${FDPP_ATTN_KV_HEADS:-32 8 2}; do
    for layout in token-major head-major; do
      for bs in ${FDPP_ATTN_LAYOUT_BLOCKS:-16 64}; do
        "$B/fdpp" bench-attention --heads 32 --kv-heads $kvh --head-dim 128 -b "$ab" -c "$ac" --kv-layout $layout \
          --block-size $bs --json >"$OUT/attn_layout_${layout}_b${bs}_$kvh.json" 2>>"$OUT/attn_layout.err" ||
          log "bench-attention 32/$kvh $layout block $bs failed: $(tail -1 "$OUT/attn_layout.err")"
      done
    done
  done
  base=$(ls "$OUT"/attn_layout_token-major_b16_*.json | paste -sd' ')
  { echo; echo "### decode attention by KV layout (async and sync us; base: token-major, block 16)"; \
    python3 "$root/bench/attention_table.py" $base \
      $(for f in "$OUT"/attn_layout_*_b*_32.json; do n=$(basename "$f" _32.json); n=${n#attn_layout_}; \
          [[ $n == token-major_b16 ]] || echo "--extra $n=$(ls "$OUT"/attn_layout_${n}_*.json | paste -sd,)"; done); } |
    tee -a "$summary"
  if command -v ncu >/dev/null; then
    # Where the bytes go: one kernel per layout, GQA 32/8 at batch 8, 16K (async), MHA at batch 32, 16K.
    for shape in "8 8 async" "32 32 async" "32 32 sync"; do
      set -- $shape
      for layout in token-major head-major; do
        ncu --kernel-name regex:decode_attention_kernel --launch-count 1 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section WarpStateStats "$B/fdpp" bench-attention --heads 32 --kv-heads $2 \
          --head-dim 128 -b $1 -c 16384 --modes $3 --kv-layout $layout >"$OUT/ncu_layout_${layout}_$2_b$1_$3.txt" 2>&1
        { echo; echo "### ncu 32/$2 B $1 L 16K $3, $layout"; grep -E "Duration|DRAM Throughput|L2 Hit|Mem Busy|Max Bandwidth|Stall Long|Warp Cycles Per Issued" \
            "$OUT/ncu_layout_${layout}_$2_b$1_$3.txt" | head -10; } | tee -a "$summary"
      done
    done
  fi
fi

if stage attnstream; then
  # Issue 13: what decode attention's K/V access patterns can stream as pure copies (no math), beside
  # whole-GPU linear sweeps (bench/kernels/kv_stream_bench.cu). Shapes BATCHxKV_HEADSxCONTEXT.
  for shape in ${FDPP_ATTN_STREAM_SHAPES:-64x8x16384 8x8x16384 64x2x65536}; do
    IFS=x read -r sb skvh sl <<<"$shape"
    "$B/fdpp_kv_stream_bench" --batch "$sb" --kv-heads "$skvh" --context "$sl" >"$OUT/attn_stream_$shape.md" 2>&1 ||
      log "kv_stream_bench $shape failed: $(tail -1 "$OUT/attn_stream_$shape.md")"
    { echo; echo "### pure K/V copies, $shape (token-major; full table in attn_stream_$shape.md)";       grep -E "^\| (sweep|chunks)|token-major" "$OUT/attn_stream_$shape.md"; } | tee -a "$summary"
  done
fi

if stage flashinfer; then
  # FlashInfer's paged decode kernels (issue 13's strongest peer) on the attention stage's grid, pages
  # shuffled as ours. The machine has no internet: FlashInfer travels as .ref/flashinfer-site.tar.xz
  # (scripts/flashinfer-pack.sh: the package with its decode kernels compiled ahead of time, and
  # tvm_ffi), or as a source distribution .ref/flashinfer.tar.gz, installed here without
  # dependencies and JIT-compiled at first use (slow: minutes per kernel).
  ab="${FDPP_ATTN_BATCHES:-1,8,32,64}"
  ac="${FDPP_ATTN_CONTEXTS:-512,1024,4096,16384,65536}"
  fi_site=""
  if [[ -f $root/.ref/flashinfer-site.tar.xz ]]; then
    fi_site=/tmp/flashinfer-site
    mkdir -p $fi_site && tar xJf "$root/.ref/flashinfer-site.tar.xz" -C $fi_site
  elif [[ -f $root/.ref/flashinfer.tar.gz ]]; then
    fi_site=/tmp/flashinfer
    python3 -m pip install --no-deps --no-build-isolation --target $fi_site "$root/.ref/flashinfer.tar.gz" \
      >"$OUT/flashinfer_install.log" 2>&1 || log "flashinfer install failed: $(grep -iE 'error' "$OUT/flashinfer_install.log" | head -3)"
  fi
  if [[ -n $fi_site ]]; then
    for kvh in ${FDPP_FLASHINFER_KV_HEADS:-32 8 2}; do
      PYTHONPATH=$fi_site timeout "${FDPP_FLASHINFER_TIMEOUT:-240}" python3 "$root/bench/peers/flashinfer_decode.py" \
        --heads 32 --kv-heads $kvh --head-dim "$attn_head_dim" -b "$ab" -c "$ac" --json "$OUT/attn_peers_fi_$kvh.json" \
        >"$OUT/flashinfer_$kvh.log" 2>&1
      log "flashinfer 32/$kvh: rc $?; $(grep -c ' us$' "$OUT/flashinfer_$kvh.log") points; last: $(tail -1 "$OUT/flashinfer_$kvh.log" | head -c 300)"
    done
    # The attention stage's table again, FlashInfer beside cuDNN.
    if ls "$OUT"/attn_ours_*.json >/dev/null 2>&1; then
      { echo; echo "### decode attention with FlashInfer (graph-timed, L2 rotated), fp16, head_dim $attn_head_dim"; \
        python3 "$root/bench/attention_table.py" "$OUT"/attn_ours_*.json \
          --peers $(ls "$OUT"/attn_peers_*.json 2>/dev/null); } | tee -a "$summary"
    fi
  else
    log "flashinfer: neither .ref/flashinfer-site.tar.xz (bash scripts/flashinfer-pack.sh) nor .ref/flashinfer.tar.gz"
  fi
fi

if stage attnprofile && command -v ncu >/dev/null; then
  # Issue 13's open question: why the async CUDA-core loop runs at 86% of the bandwidth where the
  # sync one reaches 93% (MHA 32/32, batch 32, 16K, one split each). One kernel of each under ncu.
  for mode in async sync; do
    ncu --kernel-name regex:decode_attention_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section MemoryWorkloadAnalysis "$B/fdpp" bench-attention --heads 32 --kv-heads 32 \
      --head-dim 128 -b 32 -c 16384 --modes $mode >"$OUT/ncu_decode_$mode.txt" 2>&1
    { echo; echo "### ncu, decode attention $mode, 32/32, B 32, L 16K"; \
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issue Slots|L2 Hit" "$OUT/ncu_decode_$mode.txt" | head -24; } | tee -a "$summary"
  done
fi

if stage prefill; then
  # Issue 11: causal prefill attention alone (tensor cores), ours (async, sync) and torch SDPA
  # (cuDNN, flash) on the same points, TFLOP/s over the causal flops.
  pp="${FDPP_PREFILL_POINTS:-1x1024,1x4096,1x16384,1x32768,8x2048}"
  { echo; echo "### prefill attention (causal, graph-timed), fp16, head_dim 128, points $pp"; } | tee -a "$summary"
  for kvh in 32 8; do
    "$B/fdpp" bench-attention --prefill --heads 32 --kv-heads $kvh --head-dim 128 --points "$pp" --prefill-config "${FDPP_PREFILL_CONFIGS:-all}" \
      >"$OUT/prefill_ours_$kvh.md" 2>"$OUT/prefill_ours_$kvh.err" || log "bench-attention --prefill 32/$kvh failed: $(tail -1 "$OUT/prefill_ours_$kvh.err")"
    tee -a "$summary" <"$OUT/prefill_ours_$kvh.md"
    # Variants on the same points, each its own table: FDPP_PREFILL_VARIANTS="NAME=FLAGS;..." (flags of
    # fdpp bench-attention, e.g. "tm=--kv-layout token-major").
    IFS=';' read -ra pvariants <<<"${FDPP_PREFILL_VARIANTS:-}"
    for v in "${pvariants[@]}"; do
      [[ -n $v ]] || continue
      echo "prefill variant ${v%%=*} (${v#*=}):" | tee -a "$summary"
      "$B/fdpp" bench-attention --prefill --heads 32 --kv-heads $kvh --head-dim 128 --points "$pp" \
        --prefill-config "${FDPP_PREFILL_CONFIGS:-all}" ${v#*=} >"$OUT/prefill_variant_${v%%=*}_$kvh.md" 2>>"$OUT/prefill_ours_$kvh.err" ||
        log "bench-attention --prefill 32/$kvh ${v#*=} failed"
      tee -a "$summary" <"$OUT/prefill_variant_${v%%=*}_$kvh.md"
    done
    if [[ ${FDPP_ATTN_PEERS:-1} == 1 ]]; then
      python3 "$root/bench/peers/attention_peers.py" --prefill --heads 32 --kv-heads $kvh --head-dim 128 --points "$pp" \
        --json "$OUT/prefill_peers_$kvh.json" 2>&1 | tee "$OUT/prefill_peers_$kvh.log" | tee -a "$summary" \
        || log "prefill peers 32/$kvh failed"
    fi
  done
fi

if stage ttft; then
  # Issue 11: time to first token end to end (fdpp bench's pp: the prompt in one step, first token
  # sampled) against HF transformers' sdpa forward of the same shape, same run.
  ttft() {  # ttft CONFIG LENGTHS: fdpp for each prefill attention configuration, then HF
    for pc in ${FDPP_TTFT_PREFILL_CONFIGS:-auto}; do
      "$B/fdpp" bench --load-format dummy --config "$root/configs/$1.json" -b 1 -c 1024 --steps 4 --mixed-chunk 0 \
        -p "$2" -r 3 --prefill-attention "$pc" --json >"$OUT/ttft_$1_$pc.json" 2>"$OUT/ttft_$1_$pc.err" \
        || log "ttft $1 $pc failed: $(tail -1 "$OUT/ttft_$1_$pc.err")"
      python3 - "$OUT/ttft_$1_$pc.json" "$1" "$pc" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    if "n_tokens" in x:
        print(f"| fdpp ({sys.argv[3]}) | {sys.argv[2]} | pp{x['n_tokens']} | {x['seconds']*1e3:.1f} ms | {x['tokens_per_second']:.0f} tok/s |")
PY
    done
    PYTHONUNBUFFERED=1 python3 "$root/bench/peers/prefill_peers.py" "$root/configs/$1.json" --lengths "$2" \
      --json "$OUT/ttft_hf_$1.json" 2>"$OUT/ttft_hf_$1.err" | tee -a "$summary" || log "hf prefill $1 failed: $(tail -1 "$OUT/ttft_hf_$1.err")"
  }
  { echo; echo "### time to first token (batch 1, fp16, dummy weights): fdpp vs HF transformers sdpa"; echo "| engine | model | test | time | tokens/s |"; echo "| --- | --- | --- | ---: | ---: |"; } | tee -a "$summary"
  ttft llama-2-7b "${FDPP_TTFT_7B:-1024,4096}"
  ttft llama-3-8b "${FDPP_TTFT_L3:-8000}"
  ttft llama-3.1-8b "${FDPP_TTFT_L31:-32000}"
  # FDPP_TTFT_TRACE=1: the longest Llama-3.1-8B prompt's time by kernel class (attention, GEMMs,
  # the rest), fdpp (the engine's default kernels, under tools/gpu_trace) against HF (torch.profiler).
  if [[ ${FDPP_TTFT_TRACE:-0} == 1 && -f $B/libfdpp_gpu_trace.so ]]; then
    n=${FDPP_TTFT_L31:-32000}
    n=${n##*,}
    cfg="$root/configs/llama-3.1-8b.json"
    layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$cfg")
    CUDA_INJECTION64_PATH="$B/libfdpp_gpu_trace.so" FDPP_GPU_TRACE_OUT=/tmp/ttft_fdpp.gputrace "$B/fdpp" bench \
      --load-format dummy --config "$cfg" -b 1 -c 1024 --steps 1 --mixed-chunk 0 -p "$n" -r 1 >/dev/null 2>"$OUT/ttft_trace.err"
    python3 "$root/bench/gpu_busy.py" /tmp/ttft_fdpp.gputrace --window first-attention --top 1000 \
      --json "$OUT/ttft_trace_fdpp.json" >/dev/null 2>>"$OUT/ttft_trace.err"
    python3 "$root/bench/peers/prefill_peers.py" "$cfg" --lengths "$n" --reps 1 --kernels --json "$OUT/ttft_trace_hf.json" \
      >/dev/null 2>>"$OUT/ttft_trace.err"
    { echo; echo "### llama-3.1-8b pp$n by kernel class"; } | tee -a "$summary"
    python3 "$root/bench/ttft_breakdown.py" --fdpp "$OUT/ttft_trace_fdpp.json" --layers "$layers" \
      --hf "$OUT/ttft_trace_hf.json" 2>&1 | tee -a "$summary"
  fi
fi

if stage realtext; then
  # Issue 41, item 2: prefill attention's fallback rows on real text. A real model's first layers
  # (bench/gguf_first_layers.py: the default model's, with the embeddings of the prompts' tokens;
  # FDPP_REALTEXT_MODEL, xz or plain) over real prompts (*.txt in FDPP_REALTEXT_DIR), one
  # generated token each, per dtype, per phi (0, and the calibration file *.calib.json there when
  # there is one) and per prefill configuration; the engine's counters give the rows.
  # bench/realtext_prepare.sh makes the default FDPP_REALTEXT_DIR, .ref/realtext.
  dir="${FDPP_REALTEXT_DIR:-$root/.ref/realtext}"
  rt_model="${FDPP_REALTEXT_MODEL:-$dir/model.gguf.xz}"
  if [[ $rt_model == *.xz ]]; then xz -dc "$rt_model" >/tmp/realtext_model.gguf && rt_model=/tmp/realtext_model.gguf; fi
  calib=$(ls "$dir"/*.calib.json 2>/dev/null | head -1)
  { echo; echo "### prefill attention on real text: rows recomputed by the unified max's fallback"
    echo "| dtype | phi | configuration | prompt | tokens | prefill rows | fallback rows | share | prefill ms |"
    echo "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"; } | tee -a "$summary"
  for dt in ${FDPP_REALTEXT_DTYPES:-f16 bf16}; do
    for phi in zero ${calib:+calibrated}; do
      for pc in ${FDPP_REALTEXT_CONFIGS:-auto}; do
        for txt in "$dir"/*.txt; do
          name=$(basename "$txt" .txt)
          res="$OUT/realtext_${dt}_${phi}_${pc}_$name.json"
          cal_args=()
          [[ $phi == calibrated ]] && cal_args=(--calibration "$calib")
          "$B/fdpp" generate -m "$rt_model" --dtype "$dt" --prefill-attention "$pc" -n 1 --json "${cal_args[@]}" \
            -p "$(cat "$txt")" >"$res" 2>"$res.err" \
            || { log "realtext $dt $phi $pc $name failed: $(tail -1 "$res.err")"; continue; }
          python3 - "$res" "$dt" "$phi" "$pc" "$name" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
a, t = r["attention"], r["timings"]
share = a["prefill_fallback_rows"] / max(a["prefill_rows"], 1)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {t['prompt_tokens']} | {a['prefill_rows']} | "
      f"{a['prefill_fallback_rows']} | {100 * share:.2f}% | {t['prefill_seconds'] * 1e3:.1f} |")
PY
        done
      done
    done
  done
fi

if stage longctx; then
  # Issue 41, item 3: long prompts end to end, Llama-3.1-8B bf16 (dummy weights), fdpp serve with
  # its defaults (a prompt prefilled in chunks of --max-batched-tokens beside the decode rows):
  #  - one prompt alone at each of FDPP_LONGCTX_LENS tokens: TTFT (2 warmup requests first);
  #  - the first of them arriving while 64 chat requests (264 in, 1,000 out) decode: its TTFT, their
  #    ITL while it prefills, and the step log's mixed steps;
  # the device memory (nvidia-smi every 200 ms): once the server is up, and the stage's peak.
  l31="$root/configs/llama-3.1-8b.json"
  lport=8091
  lens="${FDPP_LONGCTX_LENS:-32000 130000}"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/longctx_mem.log" &
  smi=$!
  "$B/fdpp" serve --load-format dummy --config "$l31" --dtype bf16 --port "$lport" \
    --step-log "$OUT/longctx_steps.jsonl" >"$OUT/longctx_serve.log" 2>&1 &
  srv=$!
  up=0
  for _ in $(seq 1 600); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$lport/v1/models', timeout=2)" \
      >/dev/null 2>&1 && { up=1; break; }
    kill -0 $srv 2>/dev/null || break
    sleep 1
  done
  if [[ $up == 1 ]]; then
    mem_up=$(tail -1 "$OUT/longctx_mem.log")
    bench_one() {  # NAME INPUT_LEN OUTPUT_LEN PROMPTS WARMUP
      python3 "$root/bench/serve_bench.py" --base-url "http://127.0.0.1:$lport" --num-prompts "$4" --warmup "$5" \
        --input-len "$2" --output-len "$3" --vocab-size 128256 --seed 7 --result-json "$OUT/longctx_$1.json" \
        >"$OUT/longctx_$1.log" 2>&1 || log "longctx $1 failed: $(tail -1 "$OUT/longctx_$1.log")"
    }
    for len in $lens; do bench_one "alone_$len" "$len" 16 1 2; done
    first=${lens%% *}
    # The chats decode for about 8 s (1,000 tokens each), so the long prompt arrives in the middle.
    bench_one chat 264 1000 64 0 &
    chat=$!
    sleep 2
    bench_one "mixed_$first" "$first" 16 1 0
    wait $chat
    python3 - "$OUT" "$mem_up" "$first" $lens <<'PY' | tee -a "$summary"
import json, sys, os
out, mem_up, first, lens = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def run(name):
    try:
        return json.load(open(os.path.join(out, f"longctx_{name}.json")))["runs"][0]
    except Exception as e:
        return None
print("\n### long prompts, Llama-3.1-8B bf16 (dummy weights), fdpp serve defaults")
print("| request | prompt tokens | TTFT ms | TPOT p50 ms | ITL p99 ms | ITL max ms |\n| --- | ---: | ---: | ---: | ---: | ---: |")
for name, n in [(f"alone_{l}", l) for l in lens] + [(f"mixed_{first}", first), ("chat", "64 x 264")]:
    r = run(name)
    if r is None:
        print(f"| {name} | {n} | failed | | | |"); continue
    itl = r.get("itl_ms") or {}
    print(f"| {name} | {n} | {r['ttft_ms']['p50']:.0f} | {r['tpot_ms']['p50'] or float('nan'):.1f} | "
          f"{itl.get('p99') or float('nan'):.1f} | {itl.get('max') or float('nan'):.1f} |")
mem = [int(x) for x in open(os.path.join(out, "longctx_mem.log")).read().split() if x.isdigit()]
print(f"device memory: {mem_up} MiB once the server was up, at most {max(mem) if mem else '?'} MiB in the stage")
steps = [json.loads(l) for l in open(os.path.join(out, "longctx_steps.jsonl"))]
mixed = [s for s in steps if s.get("prefill_tokens", 0) > 0 and s.get("decode_rows", 0) > 0]
print(f"steps: {len(steps)}, {len(mixed)} with prefill tokens and decode rows together")
PY
  else
    log "longctx: fdpp serve did not come up: $(tail -1 "$OUT/longctx_serve.log")"
  fi
  kill $srv 2>/dev/null; wait $srv 2>/dev/null
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
fi

if stage linear; then
  # Issue 6: every [N, K] of the five presets, GEMV / flat GEMM / cuBLAS side by side.
  "$B/fdpp" bench-linear --preset "${presets// /,}" -M 1,2,4,8,16,32,64 >"$OUT/linear.md" 2>"$OUT/linear.err" \
    || log "bench-linear failed: $(tail -1 "$OUT/linear.err")"
  { echo; echo "### linear layers, layer sums (full table: linear.md)"; grep -E "^\| (model|---)|layer" "$OUT/linear.md" | grep -E "\| (best|model|---)|---"; } | tee -a "$summary"
fi

if stage tune; then
  # Issue 7: the dispatch tables (ship them: copy $OUT_TOP/dispatch-*.json to configs/dispatch/).
  for dt in f16 bf16; do
    for p in $presets; do
      "$B/fdpp" tune --preset $p --dtype $dt --out "$OUT_TOP/dispatch-h200-$dt.json" >>"$OUT/tune.log" 2>&1 || log "tune $p $dt failed: $(tail -1 "$OUT/tune.log")"
    done
  done
  { echo; echo "### fdpp tune (last summary)"; tail -30 "$OUT/tune.log"; } | tee -a "$summary"
fi

# Tables tuned in this call serve the measurements after it (they are what gets shipped).
if [[ -s $OUT_TOP/dispatch-h200-f16.json ]]; then export FDPP_DISPATCH_TABLE="$OUT_TOP/dispatch-h200-f16.json"; fi

if stage dataflow; then
  # Issue 7: end-to-end decode with the tuned table (auto) against each static choice.
  for mode in auto gemv flat cublas; do
    "$B/fdpp" bench --load-format dummy --config "$root/configs/llama-2-7b.json" -b 1,2,4,8,16,32,64 -c 1024 -p 1024 \
      --linear $mode --json >"$OUT/dataflow_$mode.json" 2>"$OUT/dataflow_$mode.err" || log "bench --linear $mode failed: $(tail -1 "$OUT/dataflow_$mode.err")"
  done
  python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys, os
d = sys.argv[1]
runs = {m: json.load(open(f"{d}/dataflow_{m}.json")) for m in ("auto", "gemv", "flat", "cublas") if os.path.getsize(f"{d}/dataflow_{m}.json") > 0}
print("\n### end-to-end decode, Llama-2-7B fp16, ctx 1024: ms/token by linear dispatch (loss vs auto)")
print("| batch | " + " | ".join(runs) + " |\n| ---: | " + " | ".join("---:" for _ in runs) + " |")
rows = {m: {x["batch"]: x for x in r["results"] if "ms_per_step" in x} for m, r in runs.items()}
for b in sorted(rows.get("auto", {})):
    a = rows["auto"][b]["ms_per_step"]
    cells = []
    for m in runs:
        t = rows[m].get(b, {}).get("ms_per_step")
        cells.append("-" if t is None else (f"{t:.3f}" if m == "auto" else f"{t:.3f} ({100*(t/a-1):+.1f}%)"))
    print(f"| {b} | " + " | ".join(cells) + " |")
PY
fi

run_bench() {  # run_bench NAME ARGS... (fdpp bench ARGS --json, its table into the summary)
  local name=$1
  shift
  "${bench_bin:-$B/fdpp}" bench "$@" --json >"$OUT/bench_$name.json" 2>"$OUT/bench_$name.err" || { log "bench $name failed: $(tail -1 "$OUT/bench_$name.err")"; return; }
  python3 - "$OUT/bench_$name.json" "$name" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1])); m = r["memory"]
print(f"\n### fdpp {sys.argv[2]} ({r['dtype']}, attention {r.get('attention', '?')}, {r['gpu']}, read BW measured {r['read_bandwidth_measured']/1e12:.2f} TB/s)")
print(f"memory: accounted {m['accounted']/2**30:.2f} GiB (weights {m['weights']/2**30:.2f}, KV {m['kv_cache']/2**30:.2f}), device used {m['device_used_by_engine']/2**30:.2f} GiB ({100*(m['device_used_by_engine']-m['accounted'])/m['accounted']:+.1f}%)")
print("| test | ms/step | tokens/s | % roofline (measured) | % (4.46 TB/s) | attention fallback rows |\n| --- | ---: | ---: | ---: | ---: | ---: |")
for x in r["results"]:
    if "decode_only_ms" in x:
        print(f"| {x['test']} | {x['ms_per_step']:.3f} | {x['tokens_per_second']:.1f} | decode alone {x['decode_only_ms']:.3f} + chunk alone {x['chunk_only_ms']:.3f} | mixing adds {x['overhead_ms']:+.3f} ms | - |")
        continue
    ms = x.get("ms_per_step", x.get("seconds", 0) * 1e3)
    fb = f"{x['attention_fallback_rows']}/{x['attention_rows']}" if "attention_rows" in x else "-"
    print(f"| {x['test']} | {ms:.3f} | {x['tokens_per_second']:.1f} | {100*x['roofline_measured']:.1f} | {100*x['roofline_design']:.1f} | {fb} |")
PY
}
bench() {  # bench NAME ARGS...: random weights (--load-format dummy)
  local name=$1
  shift
  run_bench "$name" --load-format dummy "$@"
}

if stage bench; then
  bench llama-2-7b --config "$root/configs/llama-2-7b.json" -b 1,8,32 -c 1024 -p 1024
  # Another build's fdpp on the same job, right after (FDPP_BENCH_BASE=PATH, e.g. the commit before a
  # change that should not move the speed), then ours again: noise shows as the two runs of ours differ.
  if [[ -n ${FDPP_BENCH_BASE:-} ]]; then
    bench_bin=$FDPP_BENCH_BASE bench llama-2-7b-base --config "$root/configs/llama-2-7b.json" -b 1,8,32 -c 1024 -p 1024
    bench llama-2-7b-again --config "$root/configs/llama-2-7b.json" -b 1,8,32 -c 1024 -p 1024
  fi
  # End to end, asynchronized (default, above) against synchronized softmax (issue 5).
  [[ ${FDPP_BENCH_ABLATIONS:-1} == 1 ]] && bench llama-2-7b-sync-attention --config "$root/configs/llama-2-7b.json" -b 1,8,32 -c 1024,4000 -p 1024 --attention sync
  [[ ${FDPP_BENCH_ABLATIONS:-1} == 1 ]] && bench llama-2-7b-async-4k --config "$root/configs/llama-2-7b.json" -b 1,8,32 -c 4000 -p 1024
  # Linear-layer implementations side by side on the same model (FDPP_BENCH_LINEAR_COMPARE=1).
  if [[ ${FDPP_BENCH_LINEAR_COMPARE:-0} == 1 ]]; then
    FDPP_LINEAR=cublas bench llama-2-7b-cublas-only --config "$root/configs/llama-2-7b.json" -b 1,2,4,8 -c 1024 -p 1024
    FDPP_GEMV_MAX_M=8 bench llama-2-7b-gemv-to-8 --config "$root/configs/llama-2-7b.json" -b 1,2,4,8 -c 1024 -p 1024
  fi
  # Issue 13 end to end: GQA models at 8K context, the query group on tensor cores (default)
  # against CUDA cores (FDPP_DECODE_PATH=core), same run.
  if [[ ${FDPP_BENCH_ATTN_E2E:-1} == 1 ]]; then
    # FDPP_E2E_VARIANTS: NAME=ENV pairs run beside the default (e.g. "w4=FDPP_DECODE_WARPS=4").
    for m in llama-3-8b chatglm2-6b; do
      bench $m-8k --config "$root/configs/$m.json" -b 8,32 -c 8000 -p 1024 --mixed-chunk 0
      for v in ${FDPP_E2E_VARIANTS:-core=FDPP_DECODE_PATH=core}; do
        (export "${v#*=}"; bench $m-8k-${v%%=*} --config "$root/configs/$m.json" -b 8,32 -c 8000 -p 1024 --mixed-chunk 0)
      done
    done
  fi
  for m in ${FDPP_BENCH_MORE_MODELS-llama-2-13b llama-3-8b opt-6.7b chatglm2-6b}; do
    bench $m --config "$root/configs/$m.json" -b 1 -c 1024 -p 1024
  done
fi

# GGUF blocks on the GPU (docs/kernels/gguf_blocks.md): random Llama-2-7B files of llama.cpp's mixes
# (bench/make_random_llama_gguf.py, which needs the gguf package: carried as a wheel in
# .ref/wheels when the machine lacks it) against the f16 model, same call.
if stage gguf; then
  python3 -c "import gguf" 2>/dev/null || pip install --no-deps --target /tmp/gguf_py "$root"/.ref/wheels/gguf-*.whl >/dev/null 2>&1
  bench llama-2-7b-f16 --config "$root/configs/llama-2-7b.json" --dtype f16 -b 1,8,16,64 -c 1024 -p 512
  # The other weight formats of issue 42 on the same shapes (FDPP_GGUF_INT4=0 leaves both out: short
  # calls); FP8 also at 64 rows, where the issue compares it with f16.
  if [[ ${FDPP_GGUF_INT4:-1} == 1 ]]; then
    bench llama-2-7b-int4 --config "$root/configs/llama-2-7b.json" --dtype f16 --quantization int4 -b 1,8 -c 1024 -p 512
    bench llama-2-7b-fp8 --config "$root/configs/llama-2-7b.json" --dtype f16 --quantization fp8 -b 1,8,64 -c 1024 -p 512
  fi
  # The f16 model's decode steps kernel by kernel beside the mixes' (FDPP_GGUF_TRACE=1, below): what a
  # step costs besides reading the weights, whatever their format.
  if [[ ${FDPP_GGUF_TRACE:-0} == 1 && -f $B/libfdpp_gpu_trace.so ]]; then
    FDPP_PDL=0 CUDA_INJECTION64_PATH="$B/libfdpp_gpu_trace.so" FDPP_GPU_TRACE_OUT=/tmp/f16.gputrace \
      "$B/fdpp" bench --load-format dummy --config "$root/configs/llama-2-7b.json" --dtype f16 -b 1 -c 1024 -r 3 >/dev/null 2>&1
    python3 "$root/bench/gpu_busy.py" /tmp/f16.gputrace --graphs-only --top 40 >"$OUT/trace_f16_decode.txt" 2>&1
  fi
  for mix in ${FDPP_GGUF_MIXES:-q4_k_m q4_0 q8_0}; do
    if PYTHONPATH=/tmp/gguf_py python3 "$root/bench/make_random_llama_gguf.py" /tmp/llama7b-$mix.gguf --mix $mix >"$OUT/make_$mix.txt" 2>&1; then
      run_bench llama-2-7b-$mix -m /tmp/llama7b-$mix.gguf --dtype f16 -b 1,8,16,64 -c 1024 -p 512
      # The same file with the linear kernels forced (FDPP_GGUF_LINEAR="gemv flat": the block GEMV
      # at every batch, the flat GEMM over the blocks), beside the dispatcher's own choice, at
      # FDPP_GGUF_LINEAR_BATCHES.
      for linear in ${FDPP_GGUF_LINEAR:-}; do
        run_bench llama-2-7b-$mix-$linear -m /tmp/llama7b-$mix.gguf --dtype f16 -b "${FDPP_GGUF_LINEAR_BATCHES:-1,4,8,16,64}" -c 1024 -p 512 --linear $linear
      done
      # Host memory and time of the load (the loader's own line: peak RSS, weights streamed), twice:
      # the first read from disk, the second from the page cache.
      for pass in 1 2; do
        "$B/fdpp" logits -m /tmp/llama7b-$mix.gguf --token-ids 1,2,3 --out /tmp/gguf_logits.npy --device cuda \
          2>&1 >/dev/null | grep -E "^load:|error" | sed "s/^/gguf $mix load $pass: /" | tee -a "$summary"
      done
      # Kernel time per step at batch 1 (FDPP_GGUF_TRACE=1; the tracer is tools/gpu_trace).
      if [[ ${FDPP_GGUF_TRACE:-0} == 1 && -f $B/libfdpp_gpu_trace.so ]]; then
        FDPP_PDL=0 CUDA_INJECTION64_PATH="$B/libfdpp_gpu_trace.so" FDPP_GPU_TRACE_OUT=/tmp/gguf_$mix.gputrace \
          "$B/fdpp" bench -m /tmp/llama7b-$mix.gguf --dtype f16 -b 1 -c 1024 -r 3 >/dev/null 2>&1
        python3 "$root/bench/gpu_busy.py" /tmp/gguf_$mix.gputrace >"$OUT/trace_$mix.txt" 2>&1
        head -8 "$OUT/trace_$mix.txt" | cut -c1-150 | tee -a "$summary"
        # The decode steps alone (the kernels of CUDA graphs), every kernel listed.
        python3 "$root/bench/gpu_busy.py" /tmp/gguf_$mix.gputrace --graphs-only --top 40 >"$OUT/trace_${mix}_decode.txt" 2>&1
      fi
      # llama.cpp's CUDA build on the same file: FDPP_LLAMA_BENCH=PATH, or .ref/llama.tar.xz (its
      # llama-bench, and lib/ with what it links that the GPU machine may lack, tried last).
      if [[ -z ${FDPP_LLAMA_BENCH:-} && -f $root/.ref/llama.tar.xz && ! -x /tmp/llama/llama-bench ]]; then
        mkdir -p /tmp/llama && tar xJf "$root/.ref/llama.tar.xz" -C /tmp/llama
      fi
      lb="${FDPP_LLAMA_BENCH:-/tmp/llama/llama-bench}"
      if [[ -x $lb ]]; then
        # Its tg128 from depth 0 averages 64 tokens of context: fdpp's batch 1 at 64 beside it.
        run_bench llama-2-7b-$mix-c64 -m /tmp/llama7b-$mix.gguf --dtype f16 -b 1 -c 64 -p 16
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$lb")/lib" "$lb" -m /tmp/llama7b-$mix.gguf -ngl 99 -p 512 -n 128 -d 0,1024 -r 3 -o md >"$OUT/llama_bench_$mix.md" 2>"$OUT/llama_bench_$mix.err" \
          || log "llama-bench $mix failed: $(tail -2 "$OUT/llama_bench_$mix.err")"
        { echo; echo "### llama.cpp llama-bench, $mix"; cat "$OUT/llama_bench_$mix.md"; } | tee -a "$summary"
      fi
    else
      log "gguf $mix: could not write the file: $(tail -1 "$OUT/make_$mix.txt")"
    fi
    rm -f /tmp/llama7b-$mix.gguf
  done
fi

# Issue 45: the expert models at full size with random weights (fdpp bench counts the bytes a step
# reads: the attention weights and the chosen experts), then HF transformers' own MoE forward on
# the same config (bench/peers/moe_peers.py). Mixtral in bf16 (93 GB) needs the H200's memory: on a
# smaller card its bench fails with the engine's out-of-memory message, logged.
if stage moe; then
  for m in ${FDPP_MOE_MODELS:-qwen3-30b-a3b mixtral-8x7b}; do
    bench $m --config "$root/configs/$m.json" --dtype bf16 -b 1,8,64 -c 1024 -p 512
    # The same model with switches (FDPP_MOE_VARIANT="FDPP_FOLD_NORMS=0 ...") right after, then the
    # default again: noise shows as the two default runs differ.
    if [[ -n ${FDPP_MOE_VARIANT:-} ]]; then
      (export $FDPP_MOE_VARIANT; bench $m-variant --config "$root/configs/$m.json" --dtype bf16 -b 1,8,64 -c 1024 -p 512)
      bench $m-again --config "$root/configs/$m.json" --dtype bf16 -b 1,8,64 -c 1024 -p 512
    fi
    if [[ ${FDPP_MOE_PEERS:-1} == 1 ]]; then
      python3 "$root/bench/peers/moe_peers.py" "$root/configs/$m.json" -p 512 -b 1,64 -c 1024 --backends grouped_mm \
        --json "$OUT/hf_$m.json" >"$OUT/hf_$m.txt" 2>&1 || log "moe_peers $m failed: $(tail -1 "$OUT/hf_$m.txt")"
      { echo; grep -E "^\|" "$OUT/hf_$m.txt"; } | tee -a "$summary"
    fi
    # One-token steps kernel by kernel (FDPP_MOE_TRACE=1; FDPP_PDL=0 so that each kernel's time is
    # its own): what a layer costs besides reading its experts.
    if [[ ${FDPP_MOE_TRACE:-0} == 1 && -f $B/libfdpp_gpu_trace.so ]]; then
      FDPP_PDL=0 CUDA_INJECTION64_PATH="$B/libfdpp_gpu_trace.so" FDPP_GPU_TRACE_OUT=/tmp/moe_$m.gputrace \
        "$B/fdpp" bench --load-format dummy --config "$root/configs/$m.json" --dtype bf16 -b 1 -c 1024 -r 3 >/dev/null 2>&1
      python3 "$root/bench/gpu_busy.py" /tmp/moe_$m.gputrace --graphs-only --top 40 >"$OUT/trace_${m}_decode.txt" 2>&1
      head -24 "$OUT/trace_${m}_decode.txt" | cut -c1-150 | tee -a "$summary"
    fi
  done
fi

if stage throughput; then
  # Issue 40: the workloads offline and served, with step timelines (bench/throughput_h200.sh).
  OUT="$OUT" FDPP_BUILD_DIR="$B" bash "$root/bench/throughput_h200.sh" 2>&1 | tee -a "$summary"
fi

if stage tp; then
  # Issue 15: tensor parallelism on two GPUs (the tests ran in the tests stage). Llama-2-13B on one
  # and two GPUs, Llama-2-70B on two; each row has the collectives' time per step, timed alone.
  { echo; echo "### tensor parallelism (NCCL $(python3 -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null), NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset})"; } | tee -a "$summary"
  nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
  tp_bench() {  # tp_bench NAME ARGS...
    local name=$1
    shift
    "$B/fdpp" bench --load-format dummy "$@" -p 1024 -r 2 --mixed-chunk 0 --json >"$OUT/tp_$name.json" 2>"$OUT/tp_$name.err" \
      || { log "tp bench $name failed: $(tail -2 "$OUT/tp_$name.err")"; return; }
    python3 - "$OUT/tp_$name.json" "$name" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1])); m = r["memory"]
print(f"{sys.argv[2]}: GPUs {r.get('tensor_parallel', 1)}, per GPU: weights {m['weights']/2**30:.2f} GiB, KV {m['kv_cache']/2**30:.2f} GiB")
for x in r["results"]:
    if "ms_per_step" in x:
        print(f"| {sys.argv[2]} | {x['test']} | {x['ms_per_step']:.3f} ms | {x['tokens_per_second']:.1f} tok/s | per-GPU roofline {100*x['roofline_design']:.1f}% of 4.46 TB/s | collectives {x.get('collective_ms', 0):.3f} ms |")
    elif "n_tokens" in x:
        print(f"| {sys.argv[2]} | pp{x['n_tokens']} | {x['seconds']*1e3:.1f} ms | {x['tokens_per_second']:.0f} tok/s | | |")
PY
  }
  tp_bench llama-2-13b-tp1 --config "$root/configs/llama-2-13b.json" -b 1,8,32 -c 1024
  tp_bench llama-2-13b-tp2 --config "$root/configs/llama-2-13b.json" -b 1,8,32 -c 1024 -tp 2
  tp_bench llama-2-70b-tp2 --config "$root/configs/llama-2-70b.json" -b 1,8,32 -c 1024 -tp 2
  # The front ends with -tp 2 on a checkpoint made here (HF fixture): greedy ids and logits equal
  # to one GPU's.
  fx="$root/tests/fixtures/hf/llama_gqa_hd128_f16"
  for n in 1 2; do
    "$B/fdpp" generate -m "$fx" --token-ids 1,2,3,4,5 -n 16 --temperature 0 --ignore-eos --json -tp $n >"$OUT/tp_generate_$n.json" 2>"$OUT/tp_generate_$n.err"
    "$B/fdpp" logits -m "$fx" --token-ids 1,2,3,4,5,6,7,8 -o "$OUT/tp_logits_$n.npy" -tp $n --quiet 2>>"$OUT/tp_generate_$n.err"
  done
  python3 - "$OUT" <<'PY' | tee -a "$summary"
import json, sys, numpy as np
o = sys.argv[1]
try:
    a, b = (json.load(open(f"{o}/tp_generate_{n}.json")) for n in (1, 2))
    print(f"generate -tp 2 vs -tp 1 (fixture llama_gqa_hd128_f16, 16 greedy tokens): {'IDENTICAL' if a['token_ids'] == b['token_ids'] else 'DIFFERENT'}")
    x, y = (np.load(f"{o}/tp_logits_{n}.npy") for n in (1, 2))
    print(f"logits -tp 2 vs -tp 1: NMSE {float(((x - y) ** 2).sum() / (x ** 2).sum()):.2e}")
except Exception as e:
    print(f"tp front ends: no result ({e}); see tp_generate_*.err")
PY
  # The server on two GPUs (random weights), one completion and /health.
  "$B/fdpp" serve --load-format dummy --config "$root/configs/llama-2-7b.json" -tp 2 --port 8199 --max-num-seqs 8 \
    >"$OUT/tp_serve.log" 2>&1 &
  sp=$!
  for _ in $(seq 1 120); do curl -sf localhost:8199/health >/dev/null 2>&1 && break; sleep 1; done
  curl -s localhost:8199/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "t5 t6 t7", "max_tokens": 8, "temperature": 0}' >"$OUT/tp_serve_completion.json" 2>&1
  kill -TERM $sp; wait $sp
  log "serve -tp 2: exit $?, completion: $(head -c 300 "$OUT/tp_serve_completion.json")"
fi

if stage peers; then
  # FDPP_PEER_COMPILED=1,8: also the torch.compile'd static-cache decoder at those batch sizes
  # (a minute or two of compiling each).
  PYTHONUNBUFFERED=1 python3 "$root/bench/peers/peers.py" "$root/configs/llama-2-7b.json" --batches "${FDPP_PEER_BATCHES:-1,8,32}" --context 1024 \
    --compiled "${FDPP_PEER_COMPILED:-}" --json "$OUT/peers_llama-2-7b.json" >"$OUT/peers.log" 2>&1 || log "peers failed: $(tail -2 "$OUT/peers.log")"
  { echo; grep -E '^\|' "$OUT/peers.log"; } | tee -a "$summary"
fi

if stage rss; then
  # Issue 39: fdpp serve and fdpp.LLM open a 7B checkpoint as the CLI does (streamed to the GPU):
  # peak host RSS of each (bench/load_rss.py). The random checkpoint gets Llama-2's tokenizer.model
  # from the test fixtures (serve takes text). The Python package travels as build-gpu/python.
  { echo; echo "### host memory of serve and Python on a 7B checkpoint (bench/load_rss.py)"; } | tee -a "$summary"
  d=/tmp/fdpp_load_bench/llama-2-7b-random-bf16
  python3 "$root/bench/load_bench.py" make "$d" --size 7b 2>&1 | tail -2
  cp "$root"/tests/fixtures/hf/tokenizers/spm_llama/tokenizer.model "$root"/tests/fixtures/hf/tokenizers/spm_llama/tokenizer_config.json "$d/"
  if [[ ! -d $B/python && -f $B/python.tar.xz ]]; then tar xJf "$B/python.tar.xz" -C "$B"; fi
  rss_args=()
  [[ -d $B/python ]] || rss_args=(--skip-python)
  PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/bench/load_rss.py" "$d" --fdpp "$B/fdpp" \
    --json "$OUT/load_rss.json" "${rss_args[@]}" 2>&1 | tee -a "$summary"
fi
if stage load; then
  # Issue 14: full-size checkpoints through the streaming loader vs cat and transformers. The 7B
  # checkpoint is kept for the python stage.
  { echo; echo "### checkpoint load (bench/load_bench.sh)"; } | tee -a "$summary"
  FDPP="$B/fdpp" LOAD_BENCH_SIZES="${FDPP_LOAD_SIZES:-7b}" LOAD_BENCH_KEEP=1 OUT="$OUT" bash "$root/bench/load_bench.sh" 2>&1 \
    | tail -25 | tee -a "$summary"
  cp "$OUT"/load_bench_generate_*.json "$OUT_TOP/" 2>/dev/null
fi

if stage python; then
  # Issue 16: the package on the GPU (built here by scripts/build-python-gpu.sh, carried as
  # .ref/python.tar.xz): the HF fixtures and GPU tests, then llm.generate over 256 prompts against
  # fdpp bench at the same batch, on the 7B checkpoint of the load stage with Llama 2's tokenizer.
  if [[ -f $root/.ref/python.tar.xz ]]; then tar xJf "$root/.ref/python.tar.xz" -C "$B"; fi
  export PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}" FDPP_BIN="$B/fdpp"
  d="${LOAD_BENCH_DIR:-/tmp/fdpp_load_bench}/llama-2-7b-random-bf16"
  [[ -d $d ]] && cp "$root"/tests/fixtures/hf/tokenizers/spm_llama/tokenizer* "$d/"
  (cd "$root/tests/python" && FDPP_TEST_DEVICE=cuda FDPP_TEST_INSTALL=0 CI= timeout 150 python3 -m pytest -q -rs -p no:cacheprovider \
     test_logits.py test_gpu.py 2>&1 | tail -15) | tee "$OUT/pytest-gpu.txt" | tee -a "$summary"
  { echo; echo "### llm.generate vs fdpp bench (bench/python_generate_bench.py)"; } | tee -a "$summary"
  timeout 200 python3 "$root/bench/python_generate_bench.py" --model "$d" --fdpp "$B/fdpp" --batch 64 \
    --json "$OUT/python_generate_bench.json" 2>&1 | tail -12 | tee -a "$summary"
fi

stage_done
tar czf "$OUT_TOP/full.tar.gz" -C "$OUT_TOP" full && rm -rf "$OUT"
echo
echo "==== summary ===="
cat "$summary"
