#!/bin/bash
# Call 5 (session 16): the final build (slots below 128 counted at 128): the plan's tests and the
# decode tests that run planned splits, then the changed points.
set -u
B=$PWD/build-gpu; mkdir -p $B && tar xJf .ref/bin.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FDPP_TEST_DIR_OVERRIDE=$PWD/tests
timeout 200 $B/fdpp_gpu_tests --gtest_color=no --gtest_filter='CudaSplitPlan.*:*PlannedSplits*:*Mha64LoopRule*:*WideTiles*:*TensorCoreSmallCases*:CudaEngine.*' > /tmp/t.log 2>&1
echo "tests rc $?: $(grep -E '^\[  (PASSED|FAILED) ' /tmp/t.log | head -3 | tr '\n' ' ')"
$B/fdpp bench-attention --heads 32 --kv-heads 8 --head-dim 64 -b 32 -c 1024,16384,65536 --splits 0,2 2>&1 | tail -14
