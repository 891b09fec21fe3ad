#!/usr/bin/env bash
# Fuzzes fdpp's file parsers with libFuzzer (ASan + UBSan) for SECONDS in all (default 60), split
# evenly between the targets:
#   bash scripts/fuzz.sh [SECONDS]
#   gguf_fuzz         the GGUF reader (src/io/gguf.h)
#   safetensors_fuzz  the safetensors reader (src/io/safetensors.h)
#   unpickler_fuzz    the restricted state-dict unpickler of PyTorch .bin files (src/io/unpickler.h)
#   api_request_fuzz  fdpp serve's request parsing (src/server/api.h)
# Configures and builds build-fuzz/ (or $FDPP_FUZZ_BUILD_DIR; clang, -DFDPP_FUZZ=ON, CPU only, no tests), writes each
# target's seed corpus (its own seed mode, plus fixture files where there are some), then runs it
# on inputs of up to 64 KiB with a 64 MB cap on any single allocation (a reader that sized a buffer
# by an unchecked count would hit it). New coverage accumulates in build-fuzz/NAME_corpus/ across
# runs; a crashing input is saved under build-fuzz/NAME_crashes/ and the script exits non-zero.
# Reproduce one with: build-fuzz/NAME_fuzz build-fuzz/NAME_crashes/crash-...
set -euo pipefail
secs="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FDPP_FUZZ_BUILD_DIR:-$root/build-fuzz}"  # FDPP_FUZZ_BUILD_DIR: another build folder
jobs="$(nproc 2>/dev/null || echo 2)"
targets=(gguf safetensors unpickler api_request)

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFDPP_FUZZ=ON -DFDPP_CUDA=OFF -DFDPP_TESTS=OFF >/dev/null
fi
cmake --build "$build" --target "${targets[@]/%/_fuzz}" -j"$jobs"

# ASan: report leaks too; UBSan: print a stack and abort on the first finding.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

per=$((secs / ${#targets[@]}))
((per < 1)) && per=1
for t in "${targets[@]}"; do
  seeds="$build/${t}_seeds"
  corpus="$build/${t}_corpus"
  crashes="$build/${t}_crashes"
  rm -rf "$seeds"
  mkdir -p "$corpus" "$crashes"
  seed_var="FDPP_${t^^}_FUZZ_SEEDS"
  env "$seed_var=$seeds" "$build/${t}_fuzz"
  extra=()  # read-only seed directories of fixture files
  [[ $t == unpickler ]] && extra+=("$root/tests/fixtures/torch_bin/pkl")
  options=()
  [[ -f "$root/fuzz/$t.dict" ]] && options+=(-dict="$root/fuzz/$t.dict")
  echo "fuzz.sh: $t: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus inputs, ${per}s"
  "$build/${t}_fuzz" "$corpus" "$seeds" "${extra[@]}" "${options[@]}" \
    -max_total_time="$per" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 \
    -artifact_prefix="$crashes/" -print_final_stats=1
done
