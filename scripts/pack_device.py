#!/usr/bin/env python3
"""Packs the GPU build (and optionally llama.cpp's llama-bench) for a call on the GPU machine, which
takes the working tree plus .ref/ and at most 64 MiB in all.

    python3 scripts/pack_device.py                          # build-gpu -> .ref/bin.tar.xz
    python3 scripts/pack_device.py --no-tests               # fdpp alone (benchmark-only calls)
    python3 scripts/pack_device.py --llama-bench PATH       # also .ref/llama.tar.xz (the gguf stage's peer)

Binaries built for sm_90a carry PTX for compute_90a beside the sm_90a SASS; an H100 or H200 runs
the SASS and never compiles the PTX, which is a third of what the binaries compress to. Each PTX
entry of the copies' .nv_fatbin sections is replaced by an empty module of the same decompressed
size (a valid zstd frame, the rest of its bytes a zstd skippable frame), so that offsets, sizes
and headers stay as built, and `cuobjdump` still lists and extracts every entry. The build itself
is untouched. fdpp 43 -> 29 MB, llama-bench 41 -> 22 MB (2026-12-06).

At the end it prints what the call would carry (tracked and untracked files that git does not
ignore, plus .ref/) against the limit, and the largest folders when it does not fit; those have
to be moved out of the working tree for the call (scripts/gpu-check.sh unpacks .ref/ itself).
Needs binutils (strip, readelf), zstd and xz (Debian: binutils, zstd, xz-utils).
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

LIMIT = 64 << 20
FATBIN_MAGIC = 0xBA55ED50
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE = 0x184D2A50


def run(cmd, data=None):
    r = subprocess.run(cmd, input=data, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"pack_device: {' '.join(cmd[:2])}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def fatbin_section(path):
    """(file offset, size) of the .nv_fatbin section, or None."""
    for line in run(["readelf", "-SW", path]).decode().splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    return None


def empty_ptx_like(payload):
    """A zstd stream of exactly len(payload) bytes decompressing to a PTX module with the original's
    header (.version, .target, .address_size), padded with spaces to the original's size."""
    original = run(["zstd", "-q", "-d", "-c"], payload)
    head = original.split(b".address_size 64", 1)[0] + b".address_size 64\n"
    body = head + b" " * (len(original) - len(head) - 1) + original[-1:]
    frame = run(["zstd", "-q", "-19", "-c"], body)
    pad = len(payload) - len(frame)
    if pad != 0 and pad < 8:
        return None  # no room for a skippable frame: keep this entry as built
    out = frame + (struct.pack("<II", ZSTD_SKIPPABLE, pad - 8) + bytes(pad - 8) if pad else b"")
    assert run(["zstd", "-q", "-d", "-c"], out) == body
    return out


def drop_ptx(path):
    """Replaces the PTX entries of path's fatbins in place; returns how many."""
    section = fatbin_section(path)
    if section is None:
        return 0
    off, size = section
    data = bytearray(open(path, "rb").read())
    pos, end, replaced = off, off + size, 0
    while pos + 16 <= end:
        magic, _, header, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # padding between fatbins
            continue
        entry, stop = pos + header, pos + header + fat_size
        while entry < stop:
            kind, _, entry_header, padded = struct.unpack_from("<HHIQ", data, entry)
            payload_at = entry + entry_header
            stream = struct.unpack_from("<I", data, entry + 16)[0]  # the payload's own bytes
            if kind == 1 and data[payload_at:payload_at + 4] == ZSTD_MAGIC:
                new = empty_ptx_like(bytes(data[payload_at:payload_at + stream]))
                if new is not None:
                    data[payload_at:payload_at + stream] = new
                    replaced += 1
            entry = payload_at + padded
        pos = stop
    open(path, "wb").write(data)
    return replaced


def add_binary(src, dst):
    shutil.copy2(src, dst)
    run(["strip", dst])
    n = drop_ptx(dst)
    print(f"  {os.path.basename(dst)}: {os.path.getsize(dst) / 1e6:.1f} MB stripped, {n} PTX entries emptied")


def xz_tar(folder, out):
    tar = subprocess.Popen(["tar", "cf", "-", "-C", folder, "."], stdout=subprocess.PIPE)
    with open(out, "wb") as f:
        subprocess.run(["xz", "-9", "-T2", "-c"], stdin=tar.stdout, stdout=f, check=True)
    tar.wait()
    print(f"{out}: {os.path.getsize(out) / 1e6:.1f} MB")


def carried_bytes(root):
    """Bytes of the tracked and untracked non-ignored files, and of .ref/ (what a call carries)."""
    listed = run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    files = {f for f in listed.decode().split("\0") if f}
    ref = os.path.join(root, ".ref")
    for d, _, names in os.walk(ref):
        files.update(os.path.relpath(os.path.join(d, n), root) for n in names)
    sizes = {}
    for f in files:
        p = os.path.join(root, f)
        if os.path.isfile(p) and not os.path.islink(p):
            sizes[f] = os.path.getsize(p)
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--build", default=os.path.join(root, "build-gpu"))
    ap.add_argument("--no-tests", action="store_true", help="fdpp alone, without fdpp_gpu_tests and the tracer")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench to carry as .ref/llama.tar.xz")
    a = ap.parse_args()
    ref = os.path.join(root, ".ref")
    os.makedirs(ref, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pack = os.path.join(tmp, "bin")
        os.makedirs(os.path.join(pack, "lib"))
        names = ["fdpp"] if a.no_tests else ["fdpp", "fdpp_gpu_tests", "fdpp_gpu_trace_probe", "libfdpp_gpu_trace.so"]
        for n in names:
            src = os.path.join(a.build, n)
            if os.path.exists(src):
                add_binary(src, os.path.join(pack, n))
            elif n in ("fdpp", "fdpp_gpu_tests"):
                sys.exit(f"pack_device: {src} is missing: build it first (bash scripts/build-gpu.sh)")
        for lib in sorted(os.listdir(os.path.join(a.build, "lib"))):
            if a.no_tests and lib.startswith("libcupti"):
                continue  # the tracer's only
            shutil.copy(os.path.join(a.build, "lib", lib), os.path.join(pack, "lib", lib))  # follows links
        xz_tar(pack, os.path.join(ref, "bin.tar.xz"))
        if a.llama_bench:
            llama = os.path.join(tmp, "llama")
            os.makedirs(os.path.join(llama, "lib"))
            add_binary(a.llama_bench, os.path.join(llama, "llama-bench"))
            # What it links that the GPU machine may lack; gpu-check.sh puts these last on the path.
            for lib in ("libssl.so.3", "libcrypto.so.3"):
                for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"):
                    if os.path.exists(os.path.join(d, lib)):
                        shutil.copy(os.path.join(d, lib), os.path.join(llama, "lib", lib))
                        break
            xz_tar(llama, os.path.join(ref, "llama.tar.xz"))
    sizes = carried_bytes(root)
    total = sum(sizes.values())
    print(f"a call carries {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f}")
    if total > LIMIT:
        folders = {}
        for f, n in sizes.items():
            top = os.path.dirname(f)
            while top.count("/") > 2:
                top = os.path.dirname(top)
            folders[top] = folders.get(top, 0) + n
        print("too much: move some of these out of the working tree for the call:")
        for f, n in sorted(folders.items(), key=lambda x: -x[1])[:12]:
            print(f"  {n / 2**20:7.1f} MiB  {f or '.'}")
        sys.exit(1)


if __name__ == "__main__":
    main()
