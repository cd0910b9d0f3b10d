#!/usr/bin/env python3
"""convert --in-place against the copying convert, on the 2.2 GB real-data checkpoint of
convert_bench.py, and on a checkpoint of the 70B shape (80 layers, 560 modules, 37 GB).

In place, only the qzeros byte ranges and the configs are written (with their undo journal),
so the time is the planning (every qzeros, 64 KiB of qweight per module for detection, the
value checks over qzeros and scales), the conversion of every zero-point field, and megabytes
of writes; the copying convert writes the whole model again and fsyncs it.

The 70B-shaped checkpoint is real data (bench/synth.build) and needs about 40 GB of free disk
beside it; it is converted in place there and back (gptq -> gptq_v2 -> gptq), so no copy of it
is made. Its copying convert runs only with --copy-70b (40 GB more, and minutes). The small
checkpoint is copied fresh (cp -r; sync) before each in-place run; best of 2, warm cache.

    python bench/inplace_bench.py [--layers 5] [--big-layers 80] [--copy-70b]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert_bench import RSS, child_env, compile_tree, timed  # noqa: E402
from synth import build  # noqa: E402


def fresh_copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)


def best_of(n, run):
    return min((run(i) for i in range(n)), key=lambda r: r[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--big-layers", type=int, default=80)
    ap.add_argument("--copy-70b", action="store_true")
    args = ap.parse_args()
    py = sys.executable
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = child_env(tmp)  # compiled bytecode, as an installed gptqfmt runs
        compile_tree(env)
        cases = [("2.2 GB real data", args.layers, False, True),
                 ("70B shape", args.big_layers, True, args.copy_70b)]
        for label, layers, big, with_copy in cases:
            src = tmp / f"src-{layers}"
            src.mkdir()
            build(src, layers, convention="gptq")
            size = sum(p.stat().st_size for p in src.iterdir())
            subprocess.run(["sync"], check=True)
            res = {}

            def in_place(i, src=src, big=big):
                d = src if big else tmp / f"ip-{i}"
                if not big:
                    fresh_copy(src, d)
                # a fresh copy is gptq each time; the big one goes there and back
                frm, to = ("gptq", "gptq_v2") if i % 2 == 0 or not big else ("gptq_v2", "gptq")
                argv = ["gptqfmt", "convert", "--in-place", str(d), "--to", to, "--from", frm,
                        "--quiet"]
                r = timed([py, "-c", RSS.format(argv=argv, mod="gptqfmt")], env)
                if not big:
                    shutil.rmtree(d)
                return r

            def copying(i, src=src):
                d = tmp / f"cp-{i}"
                argv = ["gptqfmt", "convert", str(src), str(d), "--to", "gptq_v2", "--from",
                        "gptq", "--quiet"]
                r = timed([py, "-c", RSS.format(argv=argv, mod="gptqfmt")], env)
                shutil.rmtree(d)
                subprocess.run(["sync"], check=True)
                return r

            def cp_sync(i, src=src):
                d = tmp / f"cps-{i}"
                t = time.perf_counter()
                fresh_copy(src, d)
                r = (time.perf_counter() - t, 0)
                shutil.rmtree(d)
                return r

            # in place twice (there and back for the big one: its source ends as it began)
            res["convert --in-place"] = best_of(2, in_place)
            if with_copy:
                res["convert (copy)"] = best_of(2, copying)
                res["cp -r; sync"] = best_of(2, cp_sync)
            shutil.rmtree(src)
            print(f"{label}: {layers} shards, {size / 1e9:.2f} GB, gptq <-> gptq_v2, best of 2")
            for name, (secs, rss) in res.items():
                rss_s = f", peak RSS {rss / 1024:.0f} MiB" if rss else ""
                print(f"  {name:20s} {secs:7.2f} s{rss_s}")
            ip = res["convert --in-place"][0]
            if with_copy:
                print(f"  in place / copying convert: {ip / res['convert (copy)'][0]:.3f}")
            if big:
                print(f"  in place: {ip:.2f} s   (goal < 2 s for the 70B shape)")
            out[label] = {k: {"seconds": round(v[0], 3), "peak_rss_kib": v[1]}
                          for k, v in res.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
