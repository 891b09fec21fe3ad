#!/usr/bin/env bash
# Configures and builds fdpp into ${FDPP_BUILD_DIR:-build} (Release). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DFDPP_CUDA=OFF. Incremental: safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FDPP_BUILD_DIR:-$root/build}"
generator=()
command -v ninja >/dev/null && [[ ! -f "$build/CMakeCache.txt" ]] && generator=(-G Ninja)
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
