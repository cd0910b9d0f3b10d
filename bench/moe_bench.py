#!/usr/bin/env python3
"""Peak memory of inspect, verify and convert on a checkpoint of many modules: the shape of
Qwen3-235B-A22B (94 layers; per layer 128 experts x gate/up/down and q/k/v/o: 36,472
quantized modules in 94 shards; hidden 4096, moe_intermediate 1536, 64 q heads and 4 kv heads
of 128; 4-bit, group 128, gptq, symmetric zeros).

Built as inspect_bench.py builds its checkpoint (module_tensors): qweight past its first page,
and every unquantized tensor, are holes in sparse files; qzeros, g_idx and the scales (a
constant, so that verify and convert pass) are real data, some 50 MB a layer. Each command runs
in a fresh child process, which reports its peak resident memory (VmHWM) and that of its
worker processes, and its wall time: at 1/4 and 1/2 of the layers, then at all of them, so that
the growth per module shows (MiB per 1000 modules, from the smallest size to the largest). In
the same run, the baseline: a child that opens every shard with the safetensors library and
reads every qzeros and g_idx (the least any reader must); and the floor, `gptqfmt --version`
(the interpreter and gptqfmt's imports). Times are reported, never judged.

verify reads every qweight byte (holes read as zeros: about 1.2 GB of page cache a layer, 113
GB in all) and takes minutes. convert writes the copy beside the source: its holes stay holes
(write.copy_range), so it needs about the source's disk space; --in-place converts the
source gptq -> gptq_v2.

    python bench/moe_bench.py [--layers 94] [--experts 128] [--asym] [--sizes 0.25,0.5,1]
                              [--commands inspect,verify,convert,convert-in-place] [--dir DIR]
                              [--rounds N]

--asym: asymmetric zero points (inspect's detection then samples qweight, and the zeros fit
no convention over qweight of holes: inspect and verify end with findings; convert refuses, so
only inspect and verify run by default).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from convert_bench import RSS, child_env, compile_tree, fastest, measured  # noqa: E402
from inspect_bench import module_tensors, write_checkpoint  # noqa: E402

HIDDEN, MOE_INTER, HEAD, Q_HEADS, KV_HEADS, VOCAB = 4096, 1536, 128, 64, 4, 151936
ATTENTION = [("self_attn.q_proj", HIDDEN, Q_HEADS * HEAD),
             ("self_attn.k_proj", HIDDEN, KV_HEADS * HEAD),
             ("self_attn.v_proj", HIDDEN, KV_HEADS * HEAD),
             ("self_attn.o_proj", Q_HEADS * HEAD, HIDDEN)]
EXPERT = [("gate_proj", HIDDEN, MOE_INTER), ("up_proj", HIDDEN, MOE_INTER),
          ("down_proj", MOE_INTER, HIDDEN)]
SCALE = 0.01
BASELINE = '''
import sys
from pathlib import Path
from safetensors import safe_open
for f in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(str(f), "np") as h:
        for k in h.keys():
            if k.endswith((".qzeros", ".g_idx")):
                h.get_tensor(k)
'''


def layer_tensors(i: int, experts: int, asym: bool):
    """(name, dtype, shape, data-or-None) of decoder layer `i`; None = a hole."""
    rng = np.random.default_rng(i)
    p = f"model.layers.{i}"
    out = []
    for lin, k, n in ATTENTION:
        out += module_tensors(f"{p}.{lin}", k, n, rng, asym, SCALE)
    for e in range(experts):
        for lin, k, n in EXPERT:
            out += module_tensors(f"{p}.mlp.experts.{e}.{lin}", k, n, rng, asym, SCALE)
    out += [(f"{p}.mlp.gate.weight", "F16", (experts, HIDDEN), None),  # the router, unquantized
            (f"{p}.self_attn.q_norm.weight", "F16", (HEAD,), None),
            (f"{p}.self_attn.k_norm.weight", "F16", (HEAD,), None),
            (f"{p}.input_layernorm.weight", "F16", (HIDDEN,), None),
            (f"{p}.post_attention_layernorm.weight", "F16", (HIDDEN,), None)]
    return out


def build(root: Path, layers: int, experts: int, asym: bool) -> int:
    """One shard a layer, with index and configs; returns the number of quantized modules."""
    write_checkpoint(root, layers, lambda i: layer_tensors(i, experts, asym), asym, VOCAB,
                     HIDDEN, "qwen3_moe", num_hidden_layers=layers, num_experts=experts)
    return layers * (len(ATTENTION) + experts * len(EXPERT))


def disk(root: Path) -> tuple[int, int]:
    """(apparent bytes, bytes on disk) of the files under `root`."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return (sum(p.stat().st_size for p in files),
            sum(p.stat().st_blocks * 512 for p in files))


def run_commands(root: Path, tmp: Path, commands: list[str], asym: bool, env: dict,
                 rounds: int = 1) -> dict[str, tuple[float, int, int]]:
    """convert_bench.measured of the floor, the baseline and each command on `root`, in
    `rounds` rounds of all of them in turn; each one's fastest run is kept."""
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(rounds):
        for name, r in one_round(root, tmp, commands, asym, env).items():
            fastest(best, name, r)
    return best


def one_round(root: Path, tmp: Path, commands: list[str], asym: bool, env: dict
              ) -> dict[str, tuple[float, int, int]]:
    py = sys.executable
    script = tmp / "baseline.py"
    script.write_text(BASELINE)
    baseline = RSS.format(argv=[str(script), str(root)], mod="runpy").replace(
        "runpy.run_module('runpy', run_name='__main__')",
        f"runpy.run_path({str(script)!r}, run_name='__main__')")
    res = {"floor (--version)": measured(
               [py, "-c", RSS.format(argv=["gptqfmt", "--version"], mod="gptqfmt")], env),
           "baseline (safetensors)": measured([py, "-c", baseline], env)}
    findings_ok = (0, 1) if asym else (0,)  # asymmetric zeros over qweight of holes fit nothing
    for cmd in commands:
        dst = tmp / "converted"
        argv = {"inspect": ["gptqfmt", "inspect", str(root)],
                "verify": ["gptqfmt", "verify", str(root)],
                "convert": ["gptqfmt", "convert", str(root), str(dst), "--quiet"],
                "convert-in-place": ["gptqfmt", "convert", "--in-place", str(root), "--quiet"]
                }[cmd]
        res[cmd] = measured([py, "-c", RSS.format(argv=argv, mod="gptqfmt")], env,
                            findings_ok if cmd in ("inspect", "verify") else (0,))
        print(f"  {cmd}: {res[cmd][1] / 1024:.0f} MiB, {res[cmd][0]:.1f} s", flush=True)
        if cmd == "convert":
            apparent, used = disk(dst)
            print(f"    its copy: {apparent / 2**30:.1f} GiB apparent, "
                  f"{used / 2**30:.2f} GiB on disk", flush=True)
            shutil.rmtree(dst)
    return res


def report(results: dict[int, dict[str, tuple[float, int, int]]], what: str) -> None:
    """The table: per size and command, peak RSS (the process; its worker processes') and
    time; then the growth per 1000 modules and the ratios to the baseline at the largest."""
    print(f"\npeak RSS in MiB (the command's process / the largest of its worker processes, "
          f"forked from it) and wall time; {what}")
    sizes = sorted(results)
    names = list(results[sizes[0]])
    print(f"{'command':24s}" + "".join(f"{f'{m} modules':>27s}" for m in sizes)
          + f"{'MiB/1000 modules':>18s}{'RSS/baseline':>14s}{'time/baseline':>15s}")
    small, big = sizes[0], sizes[-1]
    base_s, base_rss, _ = results[big]["baseline (safetensors)"]
    for name in names:
        row = f"{name:24s}"
        for m in sizes:
            secs, rss, workers = results[m][name]
            row += f"{rss / 1024:8.0f} / {workers / 1024:5.0f} {secs:8.1f} s"
        growth = ((results[big][name][1] - results[small][name][1]) / 1024
                  / ((big - small) / 1000)) if big > small else float("nan")
        secs, rss, _ = results[big][name]
        print(row + f"{growth:18.2f}{rss / base_rss:14.2f}{secs / base_s:15.2f}")
    print(json.dumps({m: {k: {"seconds": round(v[0], 3), "peak_rss_kib": v[1],
                              "workers_peak_rss_kib": v[2]} for k, v in r.items()}
                      for m, r in results.items()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=94)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--asym", action="store_true")
    ap.add_argument("--sizes", default="0.25,0.5,1",
                    help="fractions of --layers to measure, comma-separated")
    ap.add_argument("--commands", default=None,
                    help="comma-separated, of inspect, verify, convert, convert-in-place "
                         "(default: all; with --asym inspect and verify)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of every command in turn, the fastest of each kept "
                         "(default 1: verify and convert take minutes at 94 layers)")
    ap.add_argument("--dir", type=Path, default=None, help="build under this directory")
    args = ap.parse_args()
    commands = (args.commands.split(",") if args.commands else
                ["inspect", "verify"] if args.asym else
                ["inspect", "verify", "convert", "convert-in-place"])
    sizes = sorted({max(1, round(args.layers * float(f))) for f in args.sizes.split(",")})
    results: dict[int, dict[str, tuple[float, int, int]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        env = child_env(tmp)
        compile_tree(env)
        for layers in sizes:
            root = tmp / "ckpt"
            root.mkdir()
            modules = build(root, layers, args.experts, args.asym)
            apparent, used = disk(root)
            print(f"{layers} layers, {modules} modules, {layers} shards: "
                  f"{apparent / 2**30:.1f} GiB apparent, {used / 2**30:.2f} GiB on disk",
                  flush=True)
            results[modules] = run_commands(root, tmp, commands, args.asym, env, args.rounds)
            shutil.rmtree(root)
    report(results, f"{'asymmetric' if args.asym else 'symmetric'} zeros, "
                    f"{args.experts} experts")

if __name__ == "__main__":
    main()
