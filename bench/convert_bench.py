#!/usr/bin/env python3
"""convert on a >= 2 GB checkpoint of real data, against `cp -r` and a plain safetensors script.

Builds 5 layers of a 70B Llama (4-bit, group 128, gptq, asymmetric, 2.1 GB of qweight) in a
temporary directory, then times, each in its own process with its peak RSS:
  - `cp -r SRC DST` alone, and followed by `sync` (convert fsyncs what it writes);
  - `gptqfmt convert SRC DST` (gptq -> gptq_v2: stream, verify gate, fsync, atomic rename);
  - a plain script: safetensors load_file, convert qzeros, save_file, per shard.
Each runs once in each of 3 rounds, the commands in turn; the best time of each is kept, and
convert's ratio to `cp -r; sync` of the same round is printed for every round (the page cache
holds the source for all; `--warmup` copies come first, untimed). The Python children run
from compiled bytecode, as an installed package does (a pycache beside the checkpoint, warmed
once before timing): compiling gptqfmt's modules on every start is not what users pay.

Disk space: the source plus one output at a time, 2x the checkpoint (5 layers: 4.5 GB; the
>= 8 GB run, `--layers 20`: 8.9 GB of checkpoint, 18 GB of disk); checked before building.

With `--to compressed-tensors` the source is gptq_v2 and convert re-lays out every qweight
(transposed into weight_packed), scales and qzeros, writes new headers and an index, and its gate
compares every module in the one model; the plain script has no counterpart there and is left out.

    python bench/convert_bench.py [--layers 5|20] [--to gptq_v2|compressed-tensors] [--from awq]
                                   [--warmup N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth import build, build_awq  # noqa: E402

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec.
RSS = ("import runpy, sys, time\n"
       "t = time.perf_counter()\n"
       "sys.argv = {argv!r}\n"
       "code = 0\n"
       "try:\n    runpy.run_module({mod!r}, run_name='__main__')\n"
       "except SystemExit as e:\n    code = e.code or 0\n"
       "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
       "import resource\n"  # the largest of its own children (worker processes), KiB
       "workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
       "print(time.perf_counter() - t, hwm, code, workers)\n")

PLAIN = '''
import shutil, sys
from pathlib import Path
from safetensors.numpy import load_file, save_file
from gptqfmt import convert_qzeros
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir()
for p in sorted(src.iterdir()):
    if p.suffix != ".safetensors":
        shutil.copyfile(p, dst / p.name)
        continue
    t = load_file(str(p))
    for k in t:
        if k.endswith(".qzeros"):
            t[k] = convert_qzeros(t[k], 4, "gptq", "gptq_v2")
    save_file(t, str(dst / p.name), metadata={"format": "pt"})
'''


ROUNDS = 3
LAYER_BYTES = 445_000_000  # one 70B layer, 4-bit, as bench/synth.py writes it


def child_env(tmp: Path) -> dict:
    """The children's environment: gptqfmt from this tree, bytecode kept in `tmp`. `python -c`
    and `-m` put the working directory first on sys.path, ahead of PYTHONPATH: run from
    another checkout, the children would time that one (PYTHONSAFEPATH leaves it out)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(tmp / "pycache"),
            "PYTHONSAFEPATH": "1"}


def compile_tree(env: dict) -> None:
    """Writes the bytecode of every gptqfmt module into the children's cache, untimed, as
    `pip install` compiles a package: a command's first run would otherwise compile the
    modules it imports and `--version` does not."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gptqfmt")],
                   check=True, env=env, capture_output=True)


def fastest(best: dict, name: str, r: tuple) -> None:
    """Keeps in `best[name]` whichever of it and the new measurement `r` took less time."""
    if name not in best or r[0] < best[name][0]:
        best[name] = r


def timed(cmd, env: dict) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of a child process running RSS."""
    return measured(cmd, env)[:2]


def measured(cmd, env: dict, exits: tuple[int, ...] = (0,)) -> tuple[float, int, int]:
    """(seconds, peak RSS in KiB, the largest peak RSS of its own worker processes in KiB) of a
    child process running RSS, which must end with one of `exits` (the command's exit code)."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    last = r.stdout.strip().splitlines()[-1:] if not r.returncode else []
    if not last or int(last[0].split()[2]) not in exits:
        raise SystemExit(f"{cmd[-1][:200]}...: exit {r.returncode}\n{r.stdout}{r.stderr}")
    secs, rss, _, workers = last[0].split()
    return float(secs), int(rss), int(workers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--to", choices=("gptq_v2", "compressed-tensors"), default="gptq_v2")
    ap.add_argument("--from", dest="src", choices=("gptq", "awq"), default="gptq",
                    help="awq: the source is AutoAWQ GEMM (synth.build_awq), converted to "
                         "--to compressed-tensors")
    ap.add_argument("--warmup", type=int, default=2, metavar="N",
                    help="untimed copies of the source before the rounds (default 2)")
    args = ap.parse_args()
    formats = args.to != "gptq_v2"
    if args.src == "awq" and not formats:
        raise SystemExit("--from awq converts --to compressed-tensors")
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        need = 2 * args.layers * LAYER_BYTES
        free = shutil.disk_usage(tmp).free
        if free < need * 1.1:
            raise SystemExit(f"{tmp}: {free / 1e9:.1f} GB free; {args.layers} layers need "
                             f"{need / 1e9:.1f} GB (the source and one output)")
        env = child_env(tmp)
        compile_tree(env)
        src = tmp / "src"
        src.mkdir()
        qbytes = build_awq(src, args.layers) if args.src == "awq" else \
            build(src, args.layers, convention="gptq_v2" if formats else "gptq")
        size = sum(p.stat().st_size for p in src.iterdir())
        subprocess.run(["sync"], check=True)
        # untimed copies first: on this virtual machine free memory the host has taken back
        # (the guest reports free 2 MiB blocks, and a pageout scheme frees cold page cache
        # into them) is slow to touch again, so the first 2 GB written after a quiet spell
        # ran 10 to 40x slower than the next (`cp` of 2.2 GB: 22 s, then 1.4, 1.1, 0.7)
        for _ in range(args.warmup):
            subprocess.run(["cp", "-r", str(src), str(tmp / "warmup")], check=True)
            shutil.rmtree(tmp / "warmup")
            subprocess.run(["sync"], check=True)
        res: dict[str, tuple[float, int]] = {}
        rounds: list[dict[str, float]] = []
        names = ("cp", "cp+sync", "convert") + (() if formats else ("plain",))
        # rounds of every command in turn: a machine that speeds up or slows down between
        # minutes (this one's disk and memory do) weighs on each of them alike
        for run in range(ROUNDS):
            rounds.append({})
            for name in names:
                dst = tmp / f"{name}-{run}"
                if name == "cp":
                    t = time.perf_counter()
                    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
                    r = (time.perf_counter() - t, 0)
                elif name == "cp+sync":
                    t = time.perf_counter()
                    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
                    subprocess.run(["sync"], check=True)
                    r = (time.perf_counter() - t, 0)
                elif name == "convert":
                    argv = ["gptqfmt", "convert", str(src), str(dst), "--quiet", "--to", args.to]
                    r = timed([py, "-c", RSS.format(argv=argv, mod="gptqfmt")], env)
                else:
                    script = tmp / "plain.py"
                    script.write_text(PLAIN)
                    argv = [str(script), str(src), str(dst)]
                    r = timed([py, "-c", RSS.format(argv=argv, mod="runpy").replace(
                        "runpy.run_module('runpy', run_name='__main__')",
                        f"runpy.run_path({str(script)!r}, run_name='__main__')")], env)
                rounds[-1][name] = r[0]
                fastest(res, name, r)
                shutil.rmtree(dst)
                subprocess.run(["sync"], check=True)
        how = ("AutoAWQ GEMM" if args.src == "awq" else "gptq_v2") + " -> compressed-tensors" \
            if formats else "gptq -> gptq_v2"
        print(f"checkpoint: {args.layers} shards, {size / 1e9:.2f} GB ({qbytes / 1e9:.2f} GB of "
              f"qweight), {how}, warm page cache, best of {ROUNDS} interleaved rounds")
        for name, (secs, rss) in res.items():
            rss_s = f", peak RSS {rss / 1024:.0f} MiB" if rss else ""
            print(f"  {name:8s} {secs:6.2f} s{rss_s}")
        c = res["convert"]
        print(f"convert / cp -r:        {c[0] / res['cp'][0]:.2f}   (goal <= 1.1)")
        print(f"convert / (cp -r; sync): {c[0] / res['cp+sync'][0]:.2f}   (convert fsyncs its "
              "output" + ("; goal <= 1.5 between formats)" if formats else ")"))
        if not formats:
            p = res["plain"]
            print(f"convert vs plain safetensors script: {p[0] / c[0]:.2f}x faster, "
                  f"{p[1] / c[1]:.1f}x less peak memory   (goal: faster, >= 10x less)")
        # a best of each can pair a baseline on warm memory with a convert on cold (above):
        # the ratio within each round, run back to back, is printed too
        per_round = [r["convert"] / r["cp+sync"] for r in rounds]
        print("convert / (cp -r; sync) in each round: "
              + ", ".join(f"{x:.2f}" for x in per_round)
              + f"   (median {statistics.median(per_round):.2f})")
        print(f"convert peak RSS: {c[1] / 1024:.0f} MiB   (goal < 512 MiB)")
        print(json.dumps({**{k: {"seconds": round(v[0], 3), "peak_rss_kib": v[1]}
                             for k, v in res.items()},
                          "rounds": [{k: round(v, 3) for k, v in r.items()} for r in rounds]}))


if __name__ == "__main__":
    main()
