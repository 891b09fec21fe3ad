# The device call of run b, call 2 (from the repository root, with .ref/bin.tar.xz holding fdpp): head_dim 64 large points by KV layout, block size, block order, warps.
set -uo pipefail
export PYTHONUNBUFFERED=1
B=/tmp/b; mkdir -p $B && tar xJf .ref/bin.tar.xz -C $B
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
pts="-b 8,32,64 -c 16384,65536"
for round in 1 2; do
  for kvh in 32 8; do
    for v in "tm16=--kv-layout token-major --block-size 16" "hm16=--kv-layout head-major --block-size 16" \
             "tm64=--kv-layout token-major --block-size 64" "hm64=--kv-layout head-major --block-size 64" \
             "seq16=--block-order sequential" "hmseq64=--kv-layout head-major --block-size 64 --block-order sequential" \
             "w4=--decode-warps 4"; do
      $B/fdpp bench-attention --heads 32 --kv-heads $kvh --head-dim 64 $pts --modes async ${v#*=} --json > $OUT/r${round}_${v%%=*}_$kvh.json 2>>$OUT/err.log
    done
    python3 bench/peers/attention_peers.py --heads 32 --kv-heads $kvh --head-dim 64 $pts --json $OUT/r${round}_peers_$kvh.json > /dev/null 2>>$OUT/err.log
  done
done
python3 - <<'PY'
import json, glob, os, collections
out = os.environ["OUT"]
t = collections.defaultdict(dict)
for f in glob.glob(f"{out}/r*_*.json"):
    n = os.path.basename(f)[:-5]; r, name, kvh = n.split("_")
    d = json.load(open(f))
    for x in d.get("results", []):
        k = (int(kvh), x["batch"], x["context"]); t[k][name] = min(t[k].get(name, 1e18), x["us"])
    for x in d.get("rows", []):
        if x.get("peer") == "sdpa-cudnn" and "us" in x:
            k = (int(kvh), x["B"], x["L"]); t[k]["cudnn"] = min(t[k].get("cudnn", 1e18), x["us"])
names = ["cudnn", "tm16", "hm16", "tm64", "hm64", "seq16", "hmseq64", "w4"]
print("| kvh | B | L | " + " | ".join(names) + " |")
for k in sorted(t):
    print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(f"{t[k].get(n, float('nan')):.1f}" for n in names) + " |")
PY
