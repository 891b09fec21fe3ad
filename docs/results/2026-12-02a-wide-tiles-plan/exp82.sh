#!/bin/bash
# Call 3 (session 16): wide tiles (32 keys per iteration) at head_dim 64 and at 128 with 4 warps
# (wide3) against main (e0 plan) over the D128 grid, with cuDNN; wide3's decode tests.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R /root/x
here=$PWD
cd /root/x
for f in main_fdpp wide3_fdpp wide3_tests; do xz -dc $here/.ref/$f.xz > $f; chmod +x $f; done
tar xJf $here/.ref/lib.tar.xz
cd $here
export LD_LIBRARY_PATH=/root/x/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FDPP_TEST_DIR_OVERRIDE=$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
timeout 220 /root/x/wide3_tests --gtest_filter='*Decode*:*TensorCore*:*Mha64*:*AllHeadDims*:CudaSplitPlan.*:PrefillAndDecodeLogitsMatchCpu/*:CudaRecipes.*' --gtest_color=no > $R/wide3_tests.log 2>&1
echo "wide3 tests rc $? $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $R/wide3_tests.log | head -3 | tr '\n' ' ')"
G="-b 1,8,32,64 -c 512,1024,4096,16384,65536"
t0=$(date +%s)
for r in 1 2; do for kvh in 32 8 2; do
  /root/x/main_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 128 $G --json > $R/d128_main_${kvh}_$r.json 2>>$R/err.log
  /root/x/main_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 128 $G --decode-warps 4 --json > $R/d128_main4_${kvh}_$r.json 2>>$R/err.log
  /root/x/wide3_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 128 $G --json > $R/d128_wide_${kvh}_$r.json 2>>$R/err.log
  /root/x/wide3_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 128 $G --decode-warps 4 --json > $R/d128_wide4_${kvh}_$r.json 2>>$R/err.log
done; done
echo "d128 ours $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for kvh in 32 8 2; do
  timeout 150 python3 bench/peers/attention_peers.py --heads 32 --kv-heads $kvh --head-dim 128 $G --json $R/d128_peers_$kvh.json > $R/d128_peers_$kvh.log 2>&1
done
echo "d128 peers $(( $(date +%s) - t0 )) s"
tar czf $OUT/r.tar.gz -C /tmp r
