#!/usr/bin/env python3
"""`verify` throughput on real data: GB of qweight checked per second.

Builds (in a temporary directory) LAYERS decoder layers of a 70B Llama (hidden 8192,
intermediate 28672, 8 KV heads), 4-bit, group 128, asymmetric zero points, codes spread around
their zero point the way real weights are, labelled correctly. Then runs the full `verify`
(every check, every qweight word) and, in the same process, two baselines over the same qweight
bytes: a plain read (os.preadv of each tensor's byte range into one reused buffer, warm page
cache), and the official safetensors library's get_tensor followed by a sum. verify runs with
the compiled loops (gptqfmt.bits._native, where the install built them) and with the numpy
loops (GPTQFMT_NATIVE=0). Goals: >= 2 GB/s
of qweight, >= 1 GB/s with act-order (g_idx a permutation of channels, as desc_act leaves it).

    python bench/verify_bench.py [--layers 4] [--act-order]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth import build  # noqa: E402

from gptqfmt.bits import native  # noqa: E402
from gptqfmt.ops.verify import validate  # noqa: E402


def plain_read(root: Path) -> float:
    """Seconds to read every qweight's bytes once, into one reused buffer."""
    from gptqfmt.safetensors_io.reader import SafetensorsFile
    buf = memoryview(bytearray(64 << 20))
    t = time.perf_counter()
    for p in sorted(root.glob("*.safetensors")):
        f = SafetensorsFile(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            for name, info in f.tensors.items():
                if not name.endswith(".qweight"):
                    continue
                pos, end = f.header.data_start + info.begin, f.header.data_start + info.end
                while pos < end:
                    pos += os.preadv(fd, [buf[:min(len(buf), end - pos)]], pos)
        finally:
            os.close(fd)
    return time.perf_counter() - t


def baseline(root: Path) -> float:
    from safetensors import safe_open
    t = time.perf_counter()
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            for k in h.keys():
                if k.endswith(".qweight"):
                    h.get_tensor(k).sum()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--act-order", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        qbytes = build(root, args.layers, act_order=args.act_order)
        validate(root)  # warm the page cache
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            report = validate(root)
            runs.append(time.perf_counter() - t)
        best = min(runs)
        # the same checks with the numpy loops, as an install without a C compiler runs them
        os.environ["GPTQFMT_NATIVE"] = "0"
        try:
            plain = []
            for _ in range(3):
                t = time.perf_counter()
                validate(root)
                plain.append(time.perf_counter() - t)
        finally:
            del os.environ["GPTQFMT_NATIVE"]
        read = min(plain_read(root) for _ in range(3))
        base = min(baseline(root) for _ in range(2))
        det = report.detection
        assert det.verdict == "gptq_v2", det.evidence
        assert not report.failed(), [f.one_line() for f in report.findings]
        goal = 1 if args.act_order else 2
        print(f"{args.layers} layers x 7 linears of a 70B Llama, 4-bit, group 128, "
              f"{'act-order' if args.act_order else 'no act-order'}: "
              f"{qbytes / 1e9:.2f} GB of qweight")
        print(f"verify (all checks, all data), warm, best of 3: {best:.2f} s = "
              f"{qbytes / best / 1e9:.2f} GB/s of qweight   goal >= {goal} GB/s: "
              f"{'met' if qbytes / best >= goal * 1e9 else 'NOT met'}")
        print(f"  with the compiled loops {'on' if native.available() else 'NOT BUILT'}; "
              f"the numpy loops (GPTQFMT_NATIVE=0), best of 3: {min(plain):.2f} s = "
              f"{qbytes / min(plain) / 1e9:.2f} GB/s")
        print(f"plain read of the same bytes (preadv, warm), best of 3: {read:.2f} s = "
              f"{qbytes / read / 1e9:.2f} GB/s; verify / plain read: {best / read:.2f}")
        print(f"safetensors get_tensor + sum of every qweight: {base:.2f} s = "
              f"{qbytes / base / 1e9:.2f} GB/s")
        print(f"ratio verify / baseline: {best / base:.2f}; detected {det.verdict} "
              f"(confidence {det.confidence:.4f})")


if __name__ == "__main__":
    main()
