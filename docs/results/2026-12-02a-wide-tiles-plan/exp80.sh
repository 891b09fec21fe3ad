#!/bin/bash
# Call 1 (session 16): the wide-tile D64 variant's tests and times against main and cuDNN; then the
# head-dim-aware split plan's sweep (points.txt: D H KVH B L SPLITS OLD NEW).
set -u
R=$OUT/r; mkdir -p $R /root/x
cd /root/x
for f in fdpp_main wide_fdpp wide_tests; do [[ -x $f ]] || { xz -dc $OLDPWD/.ref/$f.xz > $f; chmod +x $f; }; done
tar xJf $OLDPWD/.ref/lib.tar.xz
cd $OLDPWD
export LD_LIBRARY_PATH=/root/x/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FDPP_TEST_DIR_OVERRIDE=$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
timeout 200 /root/x/wide_tests --gtest_filter='*Decode*:*TensorCore*:*Mha64*:*AllHeadDims*:PrefillAndDecodeLogitsMatchCpu/*hd64*' --gtest_color=no > $R/wide_tests.log 2>&1
echo "wide tests rc $? $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $R/wide_tests.log | head -3 | tr '\n' ' ')"
B="-b 1,8,32,64 -c 4096,16384,65536"
t0=$(date +%s)
for r in 1 2; do
  /root/x/fdpp_main bench-attention --heads 32 --kv-heads 32 --head-dim 64 $B --json > $R/d64_main_$r.json 2>>$R/err.log
  /root/x/wide_fdpp bench-attention --heads 32 --kv-heads 32 --head-dim 64 $B --json > $R/d64_wide_$r.json 2>>$R/err.log
  /root/x/wide_fdpp bench-attention --heads 32 --kv-heads 32 --head-dim 64 $B --decode-warps 4 --json > $R/d64_wide4_$r.json 2>>$R/err.log
done
echo "d64 ours $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 120 python3 bench/peers/attention_peers.py --heads 32 --kv-heads 32 --head-dim 64 $B --json $R/d64_peers.json > $R/d64_peers.log 2>&1
echo "d64 peers rc $? $(( $(date +%s) - t0 )) s"
python3 - $R <<'PY'
import json, sys, glob, collections
R = sys.argv[1]
t = collections.defaultdict(dict)
for f in glob.glob(R + "/d64_*_?.json"):
    v = f.split("d64_")[1].rsplit("_", 1)[0]
    for r in json.load(open(f))["results"]:
        k = (r["batch"], r["context"], r["mode"])
        t[k][v] = min(t[k].get(v, 1e18), r["us"])
        t[k][v + "_cfg"] = f'{"tc" if r["tensor_cores"] else "core"}{r["warps"]}s{r["splits"]}'
try:
    for r in json.load(open(R + "/d64_peers.json"))["rows"]:
        if r.get("peer") == "sdpa-cudnn" and "us" in r:
            for m in ("async", "sync"): t[(r["B"], r["L"], m)]["cudnn"] = r["us"]
except Exception as e: print("peers:", e)
print("| B | L | mode | main | wide | wide w4 | cuDNN | cfg main / wide / w4 |")
for k in sorted(t):
    x = t[k]
    print(f'| {k[0]} | {k[1]} | {k[2]} | {x.get("main",0):.1f} | {x.get("wide",0):.1f} | {x.get("wide4",0):.1f} | {x.get("cudnn",0):.1f} | {x.get("main_cfg")} / {x.get("wide_cfg")} / {x.get("wide4_cfg")} |')
PY
t0=$(date +%s)
while read -r D H KVH Bt L S O N; do
  (( $(date +%s) - t0 > 250 )) && { echo "sweep stopped at D$D $H/$KVH B$Bt L$L"; break; }
  /root/x/fdpp_main bench-attention --heads $H --kv-heads $KVH --head-dim $D -b $Bt -c $L --splits $S --json \
    > $R/sweep_${D}_${H}_${KVH}_${Bt}_${L}.json 2>>$R/err.log
done < .ref/points.txt
echo "sweep $(( $(date +%s) - t0 )) s"
tar czf $OUT/r.tar.gz -C $OUT r
