#!/usr/bin/env bash
# Fuzzes fdpp's GGUF reader with libFuzzer (ASan + UBSan) for SECONDS (default 60):
#   bash scripts/fuzz.sh [SECONDS]
# Configures and builds build-fuzz/ (clang, -DFDPP_FUZZ=ON, CPU only, no tests), writes a seed
# corpus of small valid GGUF files (the target's own seed mode), then runs gguf_fuzz on inputs of
# up to 64 KiB with a 64 MB cap on any single allocation (a reader that sized a buffer by an
# unchecked count would hit it). New coverage accumulates in build-fuzz/gguf_corpus/ across runs;
# a crashing input is saved under build-fuzz/gguf_crashes/ and the script exits non-zero.
# Reproduce one with: build-fuzz/gguf_fuzz build-fuzz/gguf_crashes/crash-...
set -euo pipefail
secs="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="$(nproc 2>/dev/null || echo 2)"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFDPP_FUZZ=ON -DFDPP_CUDA=OFF -DFDPP_TESTS=OFF >/dev/null
fi
cmake --build "$build" --target gguf_fuzz -j"$jobs"

seeds="$build/gguf_seeds"
corpus="$build/gguf_corpus"
crashes="$build/gguf_crashes"
rm -rf "$seeds"
mkdir -p "$corpus" "$crashes"
FDPP_GGUF_FUZZ_SEEDS="$seeds" "$build/gguf_fuzz"
echo "fuzz.sh: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus inputs, ${secs}s"

# ASan: report leaks too; UBSan: print a stack and abort on the first finding.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
"$build/gguf_fuzz" "$corpus" "$seeds" \
  -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 \
  -dict="$root/fuzz/gguf.dict" -artifact_prefix="$crashes/" -print_final_stats=1
