#!/bin/bash
# Call 2 (session 16): main (split plan at the head dim's slots and loop) against the wide-tile D64
# variant over the D64 grid (32/32, 32/8, 32/2) with cuDNN; wide2's D64 tests; the plan's 4 new points.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R /root/x
here=$PWD
cd /root/x
for f in main_fdpp wide2_fdpp wide2_tests; do xz -dc $here/.ref/$f.xz > $f; chmod +x $f; done
tar xJf $here/.ref/lib.tar.xz
cd $here
export LD_LIBRARY_PATH=/root/x/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FDPP_TEST_DIR_OVERRIDE=$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
timeout 200 /root/x/wide2_tests --gtest_filter='*Decode*:*TensorCore*:*Mha64*:*AllHeadDims*:CudaSplitPlan.*:PrefillAndDecodeLogitsMatchCpu/*hd64*' --gtest_color=no > $R/wide2_tests.log 2>&1
echo "wide2 tests rc $? $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $R/wide2_tests.log | head -3 | tr '\n' ' ')"
G="-b 1,8,32,64 -c 512,1024,4096,16384,65536"
t0=$(date +%s)
for r in 1 2; do for kvh in 32 8 2; do
  /root/x/main_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 64 $G --json > $R/d64_main_${kvh}_$r.json 2>>$R/err.log
  /root/x/wide2_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 64 $G --json > $R/d64_wide_${kvh}_$r.json 2>>$R/err.log
done; done
echo "d64 ours $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for kvh in 32 8 2; do
  timeout 150 python3 bench/peers/attention_peers.py --heads 32 --kv-heads $kvh --head-dim 64 $G --json $R/d64_peers_$kvh.json > $R/d64_peers_$kvh.log 2>&1
done
echo "d64 peers $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
while read -r D H KVH Bt L S O N; do
  /root/x/main_fdpp bench-attention --heads $H --kv-heads $KVH --head-dim $D -b $Bt -c $L --splits $S --json \
    > $R/sweep_${D}_${H}_${KVH}_${Bt}_${L}.json 2>>$R/err.log
done < .ref/points2.txt
echo "sweep $(( $(date +%s) - t0 )) s"
tar czf $OUT/r.tar.gz -C /tmp r
