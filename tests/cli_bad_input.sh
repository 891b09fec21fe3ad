#!/usr/bin/env bash
# The fdpp binary on bad input: one line naming the file and the problem, a non-zero exit, no
# crash (exit codes >= 128 are signals), no output file left behind. Run by ctest (FDPP_BIN set).
set -u
BIN="${FDPP_BIN:?set FDPP_BIN to the fdpp binary}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# The rule (README, "Errors"): a bad command line exits 2 and the message names the flag;
# anything found later (files, models, the run, writing the output) exits 1. One line each.
# expect_exit CODE NAME PATTERN CMD...: exit CODE, stderr one line matching PATTERN.
expect_exit() {
  local code="$1" name="$2" pattern="$3"
  shift 3
  # Bounded: a command that takes the bad value (a server that starts) fails here instead of hanging.
  timeout 120 "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -ne $code ]] || [[ $lines -ne 1 ]] || ! grep -qE -- "$pattern" "$TMP/err"; then
    echo "FAIL $name: rc=$rc (want $code), stderr ($lines lines):"
    sed 's/^/    /' "$TMP/err" | head -5
    fail=$((fail + 1))
  else
    echo "ok   $name: $(cat "$TMP/err")"
    pass=$((pass + 1))
  fi
}
usage() { expect_exit 2 "$@"; }
runtime() { expect_exit 1 "$@"; }

expect_ok() {
  local name="$1"
  shift
  if "$@" >"$TMP/out" 2>"$TMP/err"; then
    echo "ok   $name"
    pass=$((pass + 1))
  else
    echo "FAIL $name: rc=$?"
    head -5 "$TMP/err"
    fail=$((fail + 1))
  fi
}

# Minimal GGUF v3 files written with struct: header, metadata, no tensors.
make_gguf() {  # make_gguf PATH VERSION ARCH
  python3 - "$@" <<'PY'
import struct, sys
path, version, arch = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def s(x):
    b = x.encode(); return struct.pack("<Q", len(b)) + b
kv = s("general.architecture") + struct.pack("<I", 8) + s(arch)
with open(path, "wb") as f:
    f.write(b"GGUF" + struct.pack("<IQQ", version, 0, 1) + kv)
PY
}

: >"$TMP/empty.gguf"
echo "hello, I am not a model" >"$TMP/text.gguf"
make_gguf "$TMP/v99.gguf" 99 llama
make_gguf "$TMP/gpt2.gguf" 3 gpt2
make_gguf "$TMP/notensors.gguf" 3 llama
printf 'GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00\x00\x00' >"$TMP/absurd.gguf"

expect_ok "help" "$BIN" --help
expect_ok "generate --help" "$BIN" generate --help
expect_ok "logits --help" "$BIN" logits --help
expect_ok "info --help" "$BIN" info --help
usage "no subcommand" "a subcommand is required: generate, logits, tokenize" "$BIN"
usage "unknown subcommand" "'run' is not a subcommand; the subcommands are generate, logits, tokenize, info" "$BIN" run
runtime "missing file" "$TMP/nope.gguf.*no such file" "$BIN" info --model "$TMP/nope.gguf"
runtime "directory" "$TMP" "$BIN" info --model "$TMP"
runtime "empty file" "empty.gguf.*empty" "$BIN" info --model "$TMP/empty.gguf"
runtime "bad magic" "text.gguf.*(magic|not a GGUF)" "$BIN" info --model "$TMP/text.gguf"
runtime "unknown version" "v99.gguf.*version" "$BIN" info --model "$TMP/v99.gguf"
runtime "unsupported architecture" "gpt2.gguf.*architecture 'gpt2'" "$BIN" info --model "$TMP/gpt2.gguf"
runtime "metadata missing" "notensors.gguf.*(block_count|missing)" "$BIN" info --model "$TMP/notensors.gguf"
runtime "absurd tensor count" "absurd.gguf" "$BIN" info --model "$TMP/absurd.gguf"
runtime "generate on a bad file" "text.gguf" "$BIN" generate --model "$TMP/text.gguf" --prompt hi
usage "no prompt" "generate needs --prompt TEXT, --token-ids 1,2,3, --file FILE, or -cnv for a chat" "$BIN" generate --model "$TMP/text.gguf"
usage "negative max tokens" "^fdpp: error: --max-tokens: -2 must be in" "$BIN" generate --prompt hi --max-tokens -2
usage "top-p above 1" "^fdpp: error: --top-p: 1.5 must be in \(0, 1\]" "$BIN" generate --prompt hi --top-p 1.5
usage "top-p 0" "^fdpp: error: --top-p: 0 must be in \(0, 1\]" "$BIN" generate --prompt hi --top-p 0
usage "temperature nan" "^fdpp: error: --temperature: nan must be in \[0, 100\]" "$BIN" generate --prompt hi --temperature nan
usage "temperature inf" "^fdpp: error: --temperature: inf must be in" "$BIN" generate --prompt hi --temperature inf
usage "temperature not a number" "^fdpp: error: --temperature: 'warm' is not a number" "$BIN" generate --prompt hi --temp warm
usage "min-p out of range" "^fdpp: error: --min-p: 2 must be in" "$BIN" generate --prompt hi --min-p 2
usage "top-k negative" "^fdpp: error: --top-k: -3 must be in" "$BIN" generate --prompt hi --top-k -3
usage "repeat-penalty 0" "^fdpp: error: --repeat-penalty: 0 must be in" "$BIN" generate --prompt hi --repeat-penalty 0
usage "presence-penalty 3" "^fdpp: error: --presence-penalty: 3 must be in \[-2, 2\]" "$BIN" generate --prompt hi --presence-penalty 3
usage "frequency-penalty -2.5" "^fdpp: error: --frequency-penalty: -2.5 must be in \[-2, 2\]" "$BIN" generate --prompt hi --frequency-penalty -2.5
usage "seed -2" "^fdpp: error: --seed: -2 must be in \[-1" "$BIN" generate --prompt hi --seed -2
usage "seed not a number" "^fdpp: error: --seed: 'x' is not an integer" "$BIN" generate --prompt hi -s x
usage "threads negative" "^fdpp: error: --threads: -1 must be in" "$BIN" generate --prompt hi -t -1
usage "ctx-size not a number" "^fdpp: error: --ctx-size: 'big' is not an integer" "$BIN" generate --prompt hi -c big
usage "-ngl not a number" "^fdpp: error: --n-gpu-layers: 'many' is not an integer" "$BIN" generate --prompt hi -ngl many
usage "-ngl 0 with --device cuda" "-ngl/--n-gpu-layers 0 .*--device cuda" "$BIN" generate --prompt hi -ngl 0 --device cuda
usage "device tpu" "^fdpp: error: --device: 'tpu' is not one of auto, cpu, cuda" "$BIN" generate --prompt hi --device tpu
usage "-tp 0" "^fdpp: error: --tensor-parallel: .*0" "$BIN" generate --prompt hi -tp 0
usage "-tp 2 with --device cpu" "--tensor-parallel 2 splits a model over GPUs; .*--device cpu" "$BIN" generate --prompt hi -tp 2 --device cpu
usage "dtype garbage (also on the CPU)" "^fdpp: error: --dtype: 'garbage' is not one of" "$BIN" generate --prompt hi --dtype garbage --device cpu
usage "quantization garbage" "^fdpp: error: --quantization: 'int3' is not one of none, fp8, int4, awq, gptq, gguf, awq_marlin, gptq_marlin \(see --help\)$" "$BIN" generate --prompt hi --quantization int3
usage "fp8 on the CPU" "^fdpp: error: --quantization fp8 runs on the CUDA backend; it cannot be combined with --device cpu" "$BIN" generate --prompt hi --quantization fp8 --device cpu
usage "fp8 KV cache on the CPU" "^fdpp: error: --kv-cache-dtype fp8 \(an e4m3 KV cache\) runs on the CUDA backend; it cannot be combined with --device cpu" "$BIN" generate --prompt hi --kv-cache-dtype fp8_e4m3 --device cpu
usage "fp8_e5m2 KV cache" "^fdpp: error: --kv-cache-dtype: fp8_e5m2 is not supported: the fp8 KV cache is e4m3" "$BIN" generate --prompt hi --kv-cache-dtype fp8_e5m2
usage "attention garbage" "^fdpp: error: --attention: 'x' is not one of" "$BIN" generate --prompt hi --attention x
# serve takes the engine options from the same table: the same ranges and words.
usage "serve max-num-seqs 5000" "^fdpp: error: --max-num-seqs: 5000 must be in \[0, 4096\]" "$BIN" serve --max-num-seqs 5000
usage "serve seqs over the step" "--max-num-seqs 512 with --max-batched-tokens 256: max-batched-tokens" "$BIN" serve --max-num-seqs 512 --max-batched-tokens 256
usage "serve dtype garbage" "^fdpp: error: --dtype: 'fp8' is not one of" "$BIN" serve --dtype fp8
usage "serve origin with a path" "^fdpp: error: --allowed-origins: 'http://a.example/' is not an origin" "$BIN" serve --allowed-origins http://a.example/
usage "serve origin garbage" "^fdpp: error: --allowed-origins: 'foo' is not an origin" "$BIN" serve --allowed-origins 'http://a.example,foo'
usage "empty prompt" "^fdpp: error: --prompt: the prompt is empty$" "$BIN" generate --prompt ""
usage "empty prompt on stdin" "^fdpp: error: --prompt - \(standard input\): the prompt is empty$" "$BIN" generate --prompt -
usage "non-UTF-8 prompt" "^fdpp: error: --prompt: byte 0xff at offset 2 is not valid UTF-8$" "$BIN" generate --prompt $'hi\xff'
usage "non-UTF-8 prompt on stdin" "--prompt - \(standard input\): byte 0xc3 at offset 1" \
  bash -c 'printf "a\xc3(" | "$0" generate --prompt -' "$BIN"
usage "non-UTF-8 system message" "^fdpp: error: --system: byte 0xfe" "$BIN" generate --prompt hi --system $'\xfe'
usage "17 stop strings" "^fdpp: error: --stop: given 17 times; at most 16" "$BIN" generate --prompt hi $(printf -- '--stop s%d ' $(seq 17))
usage "stop string too long" "^fdpp: error: --stop: '.*' is 300 bytes long; at most 256" "$BIN" generate --prompt hi --stop "$(printf 'x%.0s' $(seq 300))"
usage "empty stop string" "^fdpp: error: --stop: '' is empty" "$BIN" generate --prompt hi --stop ""
usage "prompt and file" "--file excludes --prompt|--prompt excludes --file" "$BIN" generate --prompt hi --file x.txt
usage "--file with -n 0" "^fdpp: error: --max-tokens 0: each request of a prompts file" "$BIN" generate --file x.txt -n 0
usage "--unordered without --file" "^fdpp: error: --unordered: only with --file$" "$BIN" generate --prompt hi --unordered
usage "bad token ids (generate)" "^fdpp: error: --token-ids: 'abc' is not a non-negative token id" "$BIN" generate --token-ids 1,abc
usage "bad token ids (logits)" "^fdpp: error: --token-ids: 'x' is not a non-negative token id" "$BIN" logits --model "$TMP/text.gguf" --token-ids 1,x,3 --out "$TMP/o.npy"
usage "logits without input" "logits needs --token-ids 1,2,3 or --prompt TEXT" "$BIN" logits --out "$TMP/o.npy"
usage "logits empty prompt" "^fdpp: error: --prompt: the prompt is empty$" "$BIN" logits --prompt "" --out "$TMP/o.npy"
usage "tokenize without input" "tokenize needs --prompt TEXT or --ids 1,2,3" "$BIN" tokenize
usage "tokenize bad ids" "^fdpp: error: --ids: '-4' is not a non-negative token id" "$BIN" tokenize --ids 3,-4
usage "unknown flag" "--bogus" "$BIN" generate --bogus
[[ -e "$TMP/o.npy" ]] && { echo "FAIL: output written despite the error"; fail=$((fail + 1)); }

# Runtime errors (exit 1): files and models. Prompts files are read and checked before any model loads.
runtime "FDPP_MODEL names a missing file" "^fdpp: error: /nope.gguf: no such file or directory \(named by \\\$FDPP_MODEL\)$" \
  env FDPP_MODEL=/nope.gguf "$BIN" generate --prompt hi
if grep -q "fetch" "$TMP/err"; then echo "FAIL FDPP_MODEL: points to the fetch script"; fail=$((fail + 1)); fi
runtime "missing prompts file" "$TMP/nope.jsonl: cannot open the prompts file" "$BIN" generate --file "$TMP/nope.jsonl"
runtime "prompts file is a directory" "$TMP: is a directory, not the prompts file" "$BIN" generate --file "$TMP"
runtime "endless prompts file" "^fdpp: error: /dev/zero: longer than 256 MiB" "$BIN" generate --file /dev/zero
runtime "endless prompt on stdin" "^fdpp: error: --prompt - \(standard input\): longer than 64 MiB" \
  bash -c '"$0" generate --prompt - </dev/zero' "$BIN"
printf '{"prompt": "fine"}\n{"prompt": "a", "top_p": 0}\n' >"$TMP/bad_range.jsonl"
runtime "prompts file: value out of range" "bad_range.jsonl:2: \"top_p\" 0 must be in \(0, 1\]" "$BIN" generate -f "$TMP/bad_range.jsonl"
printf '{"prompt": "fine"}\n\n{"prompt": "a",}\n' >"$TMP/bad_json.jsonl"
runtime "prompts file: bad JSON" "bad_json.jsonl:3: not valid JSON" "$BIN" generate -f "$TMP/bad_json.jsonl"
printf '{"prompt": "a", "temprature": 0}\n' >"$TMP/typo.jsonl"
runtime "prompts file: unknown field" "typo.jsonl:1: unknown field \"temprature\"" "$BIN" generate -f "$TMP/typo.jsonl"
printf 'one\ntw\xffo\n' >"$TMP/bad_utf8.txt"
runtime "prompts file: non-UTF-8 line" "bad_utf8.txt:2: byte 0xff at offset 2 is not valid UTF-8" "$BIN" generate -f "$TMP/bad_utf8.txt"
printf '\n\n' >"$TMP/blank_prompts.txt"
runtime "prompts file: no prompts" "blank_prompts.txt: no prompts" "$BIN" generate -f "$TMP/blank_prompts.txt"

# fdpp devices says plainly what it will use when there is no GPU (or lists the GPUs).
if "$BIN" devices >"$TMP/out" 2>"$TMP/err" && grep -qE "^cuda(:0 |: .*; the CPU backend will be used$)" "$TMP/out" &&
   ! grep -q "insufficient" "$TMP/out"; then
  echo "ok   devices: $(grep '^cuda' "$TMP/out" | head -1)"
  pass=$((pass + 1))
else
  echo "FAIL devices:"; sed 's/^/    /' "$TMP/out" "$TMP/err"; fail=$((fail + 1))
fi
expect_ok "calibrate --help" "$BIN" calibrate --help
runtime "calibrate: missing prompts file" "$TMP/nope.txt" "$BIN" calibrate --model "$TMP/text.gguf" --prompts "$TMP/nope.txt"
printf '\n \n\n' >"$TMP/blank.txt"
runtime "calibrate: no prompts" "blank.txt.*no prompts" "$BIN" calibrate --model "$TMP/text.gguf" --prompts "$TMP/blank.txt"
usage "calibrate: percentile out of range" "^fdpp: error: --percentile" "$BIN" calibrate --percentile 150
runtime "calibrate on a bad file" "text.gguf" "$BIN" calibrate --model "$TMP/text.gguf" --out "$TMP/c.json"
[[ -e "$TMP/c.json" ]] && { echo "FAIL: calibration written despite the error"; fail=$((fail + 1)); }

# bench-attention's cache options (CUDA builds only) are checked before any GPU is looked for.
if "$BIN" --help 2>/dev/null | grep -q bench-attention; then
  usage "bench-attention: block size not a power of two" "^fdpp: error: --block-size: 3 not in" "$BIN" bench-attention --block-size 3
  usage "bench-attention: unknown KV layout" "^fdpp: error: --kv-layout: nhd not in" "$BIN" bench-attention --kv-layout nhd
  usage "bench-attention: unknown block order" "^fdpp: error: --block-order: random not in" "$BIN" bench-attention --block-order random
  usage "bench-attention: split count out of range" "^fdpp: error: --splits: Value 2000 not in range" "$BIN" bench-attention --splits 2000
fi

# With the real model (when fetched): truncated copies, out-of-range ids, impossible lengths.
MODEL="${FDPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fdpp}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -s "$MODEL" ]]; then
  for n in 3 100 5000 1000000 60000000; do
    head -c "$n" "$MODEL" >"$TMP/trunc.gguf"
    runtime "truncated at $n bytes" "trunc.gguf" "$BIN" info --model "$TMP/trunc.gguf"
  done
  runtime "token id out of range" "49152" "$BIN" logits --model "$MODEL" --token-ids 1,49152 --out "$TMP/o.npy"
  [[ -e "$TMP/o.npy" ]] && { echo "FAIL: output written despite the error"; fail=$((fail + 1)); }
  runtime "context overflow" "context" "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 100000
  runtime "unwritable output" "/nonexistent/o.npy" "$BIN" logits --model "$MODEL" --token-ids 1,2 --out /nonexistent/o.npy
  expect_ok "info on the default model" "$BIN" info --model "$MODEL"

  # Write errors are errors: a full disk must not exit 0.
  runtime "stdout on a full disk (info)" "^fdpp: error: standard output: write failed \(No space left on device\)$" \
    bash -c '"$0" info --model "$1" >/dev/full' "$BIN" "$MODEL"
  runtime "stdout on a full disk (generate)" "^fdpp: error: standard output: write failed" \
    bash -c '"$0" generate --model "$1" --prompt hi -n 2 --temperature 0 >/dev/full' "$BIN" "$MODEL"
  runtime "stdout on a full disk (tokenize)" "^fdpp: error: standard output: write failed" \
    bash -c '"$0" tokenize --model "$1" --prompt hi >/dev/full' "$BIN" "$MODEL"

  # The stats line: on stderr, on a line of its own even when stdout and stderr share one pipe.
  if "$BIN" generate --model "$MODEL" --prompt "The capital of France" -n 6 --temperature 0 -s 9 >"$TMP/both" 2>&1 &&
     [[ $(grep -c '^prefill: .* | decode: .* | seed 9$' "$TMP/both") -eq 1 ]] && [[ $(tail -n 1 "$TMP/both") == prefill:* ]]; then
    echo "ok   stats line on its own line"; pass=$((pass + 1))
  else
    echo "FAIL stats line:"; sed 's/^/    /' "$TMP/both"; fail=$((fail + 1))
  fi

  # Seeds: random unless given (printed in --json), honoured when given, -1 means random.
  seed_of() { "$BIN" generate --model "$MODEL" --prompt "Once upon a time" -n 4 --json "$@" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["seed"], j["token_ids"])'; }
  s1=$(seed_of); s2=$(seed_of --seed -1); s3=$(seed_of -s 1234); s4=$(seed_of --seed 1234)
  if [[ -n $s1 && -n $s2 && ${s1%% *} != "${s2%% *}" && $s3 == "$s4" && ${s3%% *} == 1234 ]]; then
    echo "ok   seeds: random by default ($s1 / $s2), honoured when given ($s3)"; pass=$((pass + 1))
  else
    echo "FAIL seeds: default '$s1', -1 '$s2', 1234 '$s3' then '$s4'"; fail=$((fail + 1))
  fi

  # llama.cpp's flags: -ngl accepted with one line on stderr, -t, -c, -n, -s, -m, -p.
  if "$BIN" generate -m "$MODEL" -p hi -n 2 -c 64 -t 1 -s 3 -ngl 99 --temperature 0 >"$TMP/out" 2>"$TMP/err" &&
     [[ $(grep -c -- '-ngl 99' "$TMP/err") -eq 1 ]]; then
    echo "ok   llama.cpp flags: $(grep -- '-ngl' "$TMP/err")"; pass=$((pass + 1))
  else
    echo "FAIL llama.cpp flags:"; sed 's/^/    /' "$TMP/err"; fail=$((fail + 1))
  fi

  # --stop: the text ends right before the stop string (chosen from the greedy text itself).
  full=$("$BIN" generate --model "$MODEL" --prompt "The capital of France" -n 16 --temperature 0 --json)
  stop=$(python3 -c 'import json,sys; t=json.loads(sys.argv[1])["text"]; print(t[6:9])' "$full")
  cut=$("$BIN" generate --model "$MODEL" --prompt "The capital of France" -n 16 --temperature 0 --json --stop "$stop" --stop "never seen")
  if python3 -c '
import json, sys
full, cut, stop = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
assert len(stop) == 3 and cut["finish_reason"] == "stop", cut
assert cut["text"] == full["text"][:full["text"].index(stop)], (cut["text"], full["text"], stop)' "$full" "$cut" "$stop"; then
    echo "ok   --stop '$stop'"; pass=$((pass + 1))
  else
    echo "FAIL --stop '$stop'"; fail=$((fail + 1))
  fi

  # --system implies the chat template; --prompt - reads stdin (one trailing newline dropped).
  a=$("$BIN" tokenize --model "$MODEL" --prompt "Hello world" --system "Be brief.")
  b=$(printf 'Hello world\n' | "$BIN" tokenize --model "$MODEL" --prompt - --chat --system "Be brief.")
  if [[ $a == "$b" && $a == 1,* && $a == *,19556,905,2,198,1,520,9531,198 ]]; then
    echo "ok   --system / --prompt -"; pass=$((pass + 1))
  else
    echo "FAIL --system / --prompt -: '$a' vs '$b'"; fail=$((fail + 1))
  fi

  # tokenize: text to ids and back; logits --prompt equals logits --token-ids of the same ids.
  ids=$("$BIN" tokenize --model "$MODEL" --prompt "Hello world")
  text=$("$BIN" tokenize --model "$MODEL" --ids "$ids")
  if [[ $ids == "19556,905" && $text == "Hello world" ]]; then
    echo "ok   tokenize round trip: $ids"; pass=$((pass + 1))
  else
    echo "FAIL tokenize: '$ids' -> '$text'"; fail=$((fail + 1))
  fi
  runtime "tokenize id out of range" "^fdpp: error: --ids: id 49152 is out of range" "$BIN" tokenize --model "$MODEL" --ids 1,49152
  if "$BIN" logits --model "$MODEL" --prompt "Hello world" --out "$TMP/p.npy" 2>/dev/null &&
     "$BIN" logits --model "$MODEL" --token-ids 19556,905 --out "$TMP/i.npy" 2>/dev/null && cmp -s "$TMP/p.npy" "$TMP/i.npy"; then
    echo "ok   logits --prompt = logits --token-ids"; pass=$((pass + 1))
  else
    echo "FAIL logits --prompt"; fail=$((fail + 1))
  fi
  # Calibration files beside a model (a link to it, so that the real model's folder is untouched).
  ln -s "$MODEL" "$TMP/link.gguf"
  echo '{' >"$TMP/link.gguf.fdpp-calib.json"
  runtime "malformed calibration file" "link.gguf.fdpp-calib.json.*bad calibration" "$BIN" info --model "$TMP/link.gguf"
  echo '{"format": "fdpp-calibration", "version": 1, "layers": []}' >"$TMP/link.gguf.fdpp-calib.json"
  runtime "calibration without layers" "link.gguf.fdpp-calib.json" "$BIN" info --model "$TMP/link.gguf"
  rm -f "$TMP/link.gguf.fdpp-calib.json"
  printf 'The cat sat on the mat.\n\nA second, different prompt about rivers.\n' >"$TMP/prompts.txt"
  runtime "unwritable calibration output" "text.gguf/c.json" "$BIN" calibrate --model "$TMP/link.gguf" \
    --prompts "$TMP/prompts.txt" --max-tokens 8 --out "$TMP/text.gguf/c.json"
  expect_ok "calibrate" "$BIN" calibrate --model "$TMP/link.gguf" --prompts "$TMP/prompts.txt" --max-tokens 16
  if "$BIN" info --model "$TMP/link.gguf" | grep -q "calibration: *$TMP/link.gguf.fdpp-calib.json (phi range"; then
    echo "ok   info shows the calibration"
    pass=$((pass + 1))
  else
    echo "FAIL info does not show the calibration"
    fail=$((fail + 1))
  fi
  # calibrate --out FILE can be loaded again with --calibration FILE; a wrong file is an error.
  expect_ok "calibrate --out" "$BIN" calibrate --model "$MODEL" --prompts "$TMP/prompts.txt" --max-tokens 8 --out "$TMP/cal.json"
  expect_ok "generate --calibration" "$BIN" generate --model "$MODEL" --calibration "$TMP/cal.json" --prompt hi -n 2
  runtime "--calibration missing" "^fdpp: error: --calibration $TMP/nope.json: no such file$" \
    "$BIN" generate --model "$MODEL" --calibration "$TMP/nope.json" --prompt hi -n 2
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["model"]["fingerprint"]="0123456789abcdef"; json.dump(j, open(sys.argv[2], "w"))' \
    "$TMP/cal.json" "$TMP/other.json"
  runtime "--calibration for another model" "other.json: calibration is for another model file" \
    "$BIN" logits --model "$MODEL" --calibration "$TMP/other.json" --token-ids 1,2 --out "$TMP/o2.npy"
else
  echo "skip real-model cases: $MODEL not fetched"
fi

# A bare HF checkpoint (no tokenizer files): logits and generate by token ids work, a prompt does not.
HF="$(dirname "${BASH_SOURCE[0]}")/fixtures/hf/mistral_f16"
if [[ -d $HF ]]; then
  expect_error "generate --prompt without a tokenizer" "no tokenizer.*--token-ids" \
    "$BIN" generate --device cpu --model "$HF" --prompt "hello" -n 2
  expect_ok "generate --token-ids without a tokenizer" "$BIN" generate --device cpu --model "$HF" --token-ids 1,2,3 -n 3 \
    --temperature 0 --ignore-eos --json
  if grep -qE '"token_ids":\[[0-9]+,[0-9]+,[0-9]+\]' "$TMP/out" && grep -q '"note"' "$TMP/out"; then
    echo "ok   generate --token-ids --json gives the ids"
    pass=$((pass + 1))
  else
    echo "FAIL generate --token-ids --json: $(head -c 300 "$TMP/out")"
    fail=$((fail + 1))
  fi
  expect_ok "logits without a tokenizer" "$BIN" logits --device cpu --model "$HF" --token-ids 1,2,3 --out "$TMP/hf.npy"
fi

# vLLM's --quantization awq / gptq / gguf name the checkpoint's method: a model of another one is refused in
# one line naming both, and the right name runs (on the CPU, dequantized).
AWQ="$(dirname "${BASH_SOURCE[0]}")/fixtures/int4/llama_awq_g32"
if [[ -d $AWQ ]]; then
  runtime "--quantization gptq on an AWQ checkpoint" "^fdpp: error: --quantization gptq: .*llama_awq_g32 is not a GPTQ checkpoint \(awq \(4-bit, group 32\)\)$" \
    "$BIN" generate --device cpu --model "$AWQ" --quantization gptq -p hi -n 2
  expect_ok "--quantization awq_marlin on an AWQ checkpoint" "$BIN" generate --device cpu --model "$AWQ" \
    --quantization awq_marlin -p hi -n 2
fi
# --quantization gguf (vLLM's name for a GGUF file) likewise: refused for a checkpoint directory.
if [[ -d $AWQ ]]; then
  runtime "--quantization gguf on an AWQ checkpoint" "^fdpp: error: --quantization gguf: .*llama_awq_g32 is not a GGUF file \(awq \(4-bit, group 32\)\)$" \
    "$BIN" generate --device cpu --model "$AWQ" --quantization gguf -p hi -n 2
fi

# FP8 checkpoints as published (tests/fixtures/fp8): info names the format, the CPU runs them
# dequantized, and block-wise scales are refused in one line.
FP8="$(dirname "${BASH_SOURCE[0]}")/fixtures/fp8/llama_fp8_tensor"
if [[ -d $FP8 ]]; then
  expect_ok "info on an FP8 checkpoint" "$BIN" info --model "$FP8" --device cpu
  if grep -q '^quantized: *fp8 (quant_method fp8' "$TMP/out" && grep -q 'F8_E4M3 x14 -> f32 (dequantized)' "$TMP/out"; then
    echo "ok   info shows the FP8 format"
    pass=$((pass + 1))
  else
    echo "FAIL info on an FP8 checkpoint: $(head -c 600 "$TMP/out")"
    fail=$((fail + 1))
  fi
  expect_ok "logits of an FP8 checkpoint on the CPU" "$BIN" logits --device cpu --model "$FP8" --token-ids 1,2,3 \
    --out "$TMP/fp8.npy"
  cp -r "$FP8" "$TMP/fp8_block"
  sed -i 's/"quant_method": "fp8",/"quant_method": "fp8", "weight_block_size": [128, 128],/' "$TMP/fp8_block/config.json"
  runtime "FP8 checkpoint with block-wise scales" "weight_block_size = \[128,128\] \(block-wise FP8 scales\) is not supported" \
    "$BIN" logits --device cpu --model "$TMP/fp8_block" --token-ids 1,2,3 --out "$TMP/fp8_block.npy"
fi

# --chat-template-kwargs: a JSON object of the template's variables (enable_thinking), refused by name
# otherwise; Qwen3's template writes the empty think block for enable_thinking false.
Q3="$(dirname "$0")/fixtures/hf/qwen3_tied_gqa_bf16"
if [[ -d "$Q3" ]]; then
  usage "--chat-template-kwargs unknown key" "--chat-template-kwargs: .*'foo' is not supported" \
    "$BIN" tokenize --model "$Q3" -p hi --chat --chat-template-kwargs '{"foo": 1}'
  usage "--chat-template-kwargs not JSON" "--chat-template-kwargs: .*expected a JSON object" \
    "$BIN" tokenize --model "$Q3" -p hi --chat --chat-template-kwargs 'nope'
  usage "--chat-template-kwargs wrong type" "enable_thinking must be true or false" \
    "$BIN" generate --device cpu --model "$Q3" -p hi --chat --chat-template-kwargs '{"enable_thinking": 0}'
  expect_ok "tokenize --chat-template-kwargs" "$BIN" tokenize --model "$Q3" -p hi --chat --json \
    --chat-template-kwargs '{"enable_thinking": false}'
  if grep -q '"<think>","\\n","\\n","</think>","\\n","\\n"\]' "$TMP/out"; then
    echo "ok   enable_thinking false ends the prompt with the empty think block"
    pass=$((pass + 1))
  else
    echo "FAIL enable_thinking false: $(head -c 400 "$TMP/out")"
    fail=$((fail + 1))
  fi
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
