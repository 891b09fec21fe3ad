#!/usr/bin/env bash
# The test suite on a fresh machine: installs what is missing, builds fdpp (with CUDA sources when
# nvcc is present), fetches the default model, and runs every test with ctest. GPU tests (label
# "gpu") report as skipped where there is no GPU; on the H200 they run through scripts/gpu-check.sh.
#   bash scripts/test.sh              all tests
#   bash scripts/test.sh -R Gguf      extra arguments go to ctest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/setup-venv.sh"  # the server tests' Python packages (openai, pytest, httpx)
bash "$root/scripts/build.sh"
ctest --test-dir "${FDPP_BUILD_DIR:-$root/build}" --output-on-failure -j "$(nproc)" "$@"
