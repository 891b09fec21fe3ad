#!/usr/bin/env bash
# The Python package's tests (tests/python) in the project's virtual environment: scripts/setup-venv.sh
# makes .venv with tests/requirements.txt, then the package is installed from this checkout
# (`pip install .`) and pytest runs against the CLI in ${FDPP_BUILD_DIR:-build} (scripts/test.sh
# builds it). CI runs it from .ci/run after scripts/test.sh.
#   FDPP_PYTHON_CUDA=ON   build the extension with CUDA (default OFF here: the CUDA build of the
#                         whole engine takes ~8 min on 2 cores, and CI has no GPU to run it)
#   FDPP_TEST_DEVICE=cuda run the tests on the GPU (skipped where there is none)
#   extra arguments go to pytest, e.g. bash scripts/test-python.sh -k logits
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${FDPP_VENV:-$root/.venv}"
# The project's .venv with tests/requirements.txt (pytest, numpy, the build backend).
bash "$root/scripts/setup-venv.sh"
py="$venv/bin/python"
# Compiler cache for the extension's build when one is installed (CMake reads these variables).
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
"$py" -m pip install -q "$root" "--config-settings=cmake.define.FDPP_CUDA=${FDPP_PYTHON_CUDA:-OFF}"
echo "test-python: pip install . took $((SECONDS - start)) s"
export FDPP_BIN="${FDPP_BIN:-${FDPP_BUILD_DIR:-$root/build}/fdpp}"
# From tests/python, not the root: `import fdpp` must find the installed package, not python/fdpp.
set +e
(cd "$root/tests/python" && "$py" -m pytest -q -rs "$@" .)
rc=$?
set -e
# pytest exits 5 when it collected no tests: with tests/python in the tree that means they were not
# found (a moved folder, an import error at collection counts as 2), never a pass.
if [[ $rc == 5 ]]; then
  echo "test-python: pytest collected no tests" >&2
  exit 1
fi
exit $rc
