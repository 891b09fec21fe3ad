#!/bin/bash
# Call 4 (session 16): the GPU suite and compute-sanitizer on the new build (wide tiles at head_dim 64
# with 8 warps, the split plan at the head dim's slots and tiles), then the head_dim-64 grid against
# the session's starting kernel and plan (3e1b132: old_fdpp) with cuDNN, and D128 spot checks.
set -u
here=$PWD
FDPP_GPU_STAGES="tests sanitizer" bash scripts/gpu-check.sh > /tmp/gpucheck.log 2>&1
tail -8 $OUT/summary.md
R=/tmp/r; rm -rf $R; mkdir -p $R /root/x
xz -dc .ref/old_fdpp.xz > /root/x/old_fdpp; chmod +x /root/x/old_fdpp
export LD_LIBRARY_PATH=$here/build-gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NEW=$here/build-gpu/fdpp
G="-b 1,8,32,64 -c 512,1024,4096,16384,65536"
t0=$(date +%s)
for r in 1 2; do for kvh in 32 8 2; do
  /root/x/old_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 64 $G --json > $R/d64_main_${kvh}_$r.json 2>>$R/err.log
  $NEW bench-attention --heads 32 --kv-heads $kvh --head-dim 64 $G --json > $R/d64_wide_${kvh}_$r.json 2>>$R/err.log
done; done
echo "d64 ours $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for kvh in 32 8 2; do
  timeout 100 python3 bench/peers/attention_peers.py --heads 32 --kv-heads $kvh --head-dim 64 $G --json $R/d64_peers_$kvh.json > $R/d64_peers_$kvh.log 2>&1
done
echo "d64 peers $(( $(date +%s) - t0 )) s"
for kvh in 32 8 2; do
  /root/x/old_fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 128 -b 1,32 -c 1024,16384 --json > $R/d128_old_$kvh.json 2>>$R/err.log
  $NEW bench-attention --heads 32 --kv-heads $kvh --head-dim 128 -b 1,32 -c 1024,16384 --json > $R/d128_new_$kvh.json 2>>$R/err.log
done
cp /tmp/gpucheck.log $R/
tar czf $OUT/r.tar.gz -C /tmp r
