#!/usr/bin/env bash
# Builds fdpp for the H200 (sm_90a) into build-gpu/, with the shared libraries the GPU machine
# lacks copied into build-gpu/lib, ready to travel with a device call (scripts/gpu-check.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FDPP_BUILD_DIR="$root/build-gpu"
bash "$root/scripts/build.sh" -DFDPP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
mkdir -p "$FDPP_BUILD_DIR/lib"
# Debian libraries that Ubuntu's image may not have (fmt, cpp-httplib for fdpp serve, and brotli which
# it links) or may have in another version. OpenSSL 3 and zlib are the same soname there.
for exe in fdpp fdpp_gpu_tests; do
  [[ -x "$FDPP_BUILD_DIR/$exe" ]] || continue
  ldd "$FDPP_BUILD_DIR/$exe" | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2|libgomp|libsentencepiece|libcpp-httplib|libbrotli' | while read -r lib; do
    cp -Lu "$lib" "$FDPP_BUILD_DIR/lib/"
  done
done
# CUPTI for the GPU tracer (libfdpp_gpu_trace.so looks in lib/ first): the toolkit's own, of the
# version the tracer was built against, whatever the GPU machine has installed (4 MB).
if [[ -f $FDPP_BUILD_DIR/libfdpp_gpu_trace.so ]]; then
  cupti=$(sed -n 's/^CUDA_cupti_LIBRARY:FILEPATH=//p' "$FDPP_BUILD_DIR/CMakeCache.txt")
  soname=$(objdump -p "$cupti" | awk '/SONAME/ {print $2}')
  cp -Lu "$cupti" "$FDPP_BUILD_DIR/lib/$soname"
fi
# Keep only what runs: the travelling folder must stay far below 64 MiB.
du -sh "$FDPP_BUILD_DIR"/{fdpp,fdpp_gpu_tests,libfdpp_gpu_trace.so,fdpp_gpu_trace_probe,lib} 2>/dev/null || true
