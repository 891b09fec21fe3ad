#!/usr/bin/env bash
# The fdpp binary on bad input: one line naming the file and the problem, a non-zero exit, no
# crash (exit codes >= 128 are signals), no output file left behind. Run by ctest (FDPP_BIN set).
set -u
BIN="${FDPP_BIN:?set FDPP_BIN to the fdpp binary}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# expect_error NAME PATTERN CMD...: exit 1 or 2, stderr one line matching PATTERN.
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -ne 1 && $rc -ne 2 ]] || [[ $lines -ne 1 ]] || ! grep -qE -- "$pattern" "$TMP/err"; then
    echo "FAIL $name: rc=$rc, stderr ($lines lines):"
    sed 's/^/    /' "$TMP/err" | head -5
    fail=$((fail + 1))
  else
    echo "ok   $name: $(cat "$TMP/err")"
    pass=$((pass + 1))
  fi
}

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
expect_error "no subcommand" "subcommand" "$BIN"
expect_error "missing file" "$TMP/nope.gguf.*no such file" "$BIN" info --model "$TMP/nope.gguf"
expect_error "directory" "$TMP" "$BIN" info --model "$TMP"
expect_error "empty file" "empty.gguf.*empty" "$BIN" info --model "$TMP/empty.gguf"
expect_error "bad magic" "text.gguf.*(magic|not a GGUF)" "$BIN" info --model "$TMP/text.gguf"
expect_error "unknown version" "v99.gguf.*version" "$BIN" info --model "$TMP/v99.gguf"
expect_error "unsupported architecture" "gpt2.gguf.*architecture 'gpt2'" "$BIN" info --model "$TMP/gpt2.gguf"
expect_error "metadata missing" "notensors.gguf.*(block_count|missing)" "$BIN" info --model "$TMP/notensors.gguf"
expect_error "absurd tensor count" "absurd.gguf" "$BIN" info --model "$TMP/absurd.gguf"
expect_error "generate on a bad file" "text.gguf" "$BIN" generate --model "$TMP/text.gguf" --prompt hi
expect_error "no prompt" "prompt" "$BIN" generate --model "$TMP/text.gguf"
expect_error "negative max tokens" "max-tokens" "$BIN" generate --prompt hi --max-tokens -1
expect_error "top-p out of range" "top-p" "$BIN" generate --prompt hi --top-p 1.5
expect_error "bad token ids" "token-ids.*'x'" "$BIN" logits --model "$TMP/text.gguf" --token-ids 1,x,3 --out "$TMP/o.npy"
expect_error "unknown flag" "--bogus" "$BIN" generate --bogus
expect_ok "calibrate --help" "$BIN" calibrate --help
expect_error "calibrate: missing prompts file" "$TMP/nope.txt" "$BIN" calibrate --model "$TMP/text.gguf" --prompts "$TMP/nope.txt"
printf '\n \n\n' >"$TMP/blank.txt"
expect_error "calibrate: no prompts" "blank.txt.*no prompts" "$BIN" calibrate --model "$TMP/text.gguf" --prompts "$TMP/blank.txt"
expect_error "calibrate: percentile out of range" "percentile" "$BIN" calibrate --percentile 150
expect_error "calibrate on a bad file" "text.gguf" "$BIN" calibrate --model "$TMP/text.gguf" --out "$TMP/c.json"
[[ -e "$TMP/c.json" ]] && { echo "FAIL: calibration written despite the error"; fail=$((fail + 1)); }

# With the real model (when fetched): truncated copies, out-of-range ids, impossible lengths.
MODEL="${FDPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fdpp}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -s "$MODEL" ]]; then
  for n in 3 100 5000 1000000 60000000; do
    head -c "$n" "$MODEL" >"$TMP/trunc.gguf"
    expect_error "truncated at $n bytes" "trunc.gguf" "$BIN" info --model "$TMP/trunc.gguf"
  done
  expect_error "token id out of range" "49152" "$BIN" logits --model "$MODEL" --token-ids 1,49152 --out "$TMP/o.npy"
  [[ -e "$TMP/o.npy" ]] && { echo "FAIL: output written despite the error"; fail=$((fail + 1)); }
  expect_error "context overflow" "context" "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 100000
  expect_error "unwritable output" "/nonexistent/o.npy" "$BIN" logits --model "$MODEL" --token-ids 1,2 --out /nonexistent/o.npy
  expect_ok "info on the default model" "$BIN" info --model "$MODEL"
  # Calibration files beside a model (a link to it, so that the real model's folder is untouched).
  ln -s "$MODEL" "$TMP/link.gguf"
  echo '{' >"$TMP/link.gguf.fdpp-calib.json"
  expect_error "malformed calibration file" "link.gguf.fdpp-calib.json.*bad calibration" "$BIN" info --model "$TMP/link.gguf"
  echo '{"format": "fdpp-calibration", "version": 1, "layers": []}' >"$TMP/link.gguf.fdpp-calib.json"
  expect_error "calibration without layers" "link.gguf.fdpp-calib.json" "$BIN" info --model "$TMP/link.gguf"
  rm -f "$TMP/link.gguf.fdpp-calib.json"
  printf 'The cat sat on the mat.\n\nA second, different prompt about rivers.\n' >"$TMP/prompts.txt"
  expect_error "unwritable calibration output" "text.gguf/c.json" "$BIN" calibrate --model "$TMP/link.gguf" \
    --prompts "$TMP/prompts.txt" --max-tokens 8 --out "$TMP/text.gguf/c.json"
  expect_ok "calibrate" "$BIN" calibrate --model "$TMP/link.gguf" --prompts "$TMP/prompts.txt" --max-tokens 16
  if "$BIN" info --model "$TMP/link.gguf" | grep -q "calibration: *$TMP/link.gguf.fdpp-calib.json (phi range"; then
    echo "ok   info shows the calibration"
    pass=$((pass + 1))
  else
    echo "FAIL info does not show the calibration"
    fail=$((fail + 1))
  fi
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

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
