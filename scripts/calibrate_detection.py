#!/usr/bin/env python3
"""Calibrate zero-point detection on synthetic whole models (fixtures/make_calibration.py).

For every checkpoint of the corpus (200 to 600 modules, realistic weights), the detector runs
the way verify runs it (every code) and the way inspect runs it (a sample of rows that grows
while the pooled evidence does not decide), through the same functions the tool uses
(zero_stats, decide, combine, detect_sequential); only the file I/O is left out. It counts:

- false alarms on clean checkpoints (written by a correct writer): a wrong or undecided
  checkpoint verdict, modules disagreeing, a module called a misfit (GQ412 error, GQ414
  warning), or a writer-bug signature (GQ405);
- detections: a mislabelled checkpoint is caught when the verdict is the data's convention
  (then GQ401 follows from the label); a checkpoint written by AutoGPTQ 0.7.1 or GPTQModel with
  zero points of 0 is caught by GQ405; one module with every zero point shifted by 3, or with
  random zero points, is caught by GQ412 (or GQ414).

    python3 scripts/calibrate_detection.py                 # 1,024 clean checkpoints + attacks
    python3 scripts/calibrate_detection.py --clean 64 --jobs 2   # a quick look
    python3 scripts/calibrate_detection.py --residuals     # the largest standardised residual
                                                             # per bits, to choose detect.TAU

The README's detection section quotes this script's output.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))
sys.path.insert(0, str(ROOT))

import make_calibration as mc  # noqa: E402

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2, symmetric_pattern  # noqa: E402
from gptqfmt.bits.packing import block  # noqa: E402
from gptqfmt.detection import codestats  # noqa: E402
from gptqfmt.detection.decide import AMBIGUOUS, decide, effective_se  # noqa: E402
from gptqfmt.detection.read import detect_sequential  # noqa: E402
from gptqfmt.detection.stats import zero_stats  # noqa: E402

BITS = (2, 3, 4, 8)


class PerModule:
    """Module reads for detect_sequential from plain functions, one module at a time (the data
    are in memory here): `read(i, sample_bytes)` gives module i's verdict, `chance(i)` its runs
    by chance."""

    def __init__(self, read, chance=None):
        self.read, self.chance = read, chance

    def verdicts(self, indices: list[int], sample: int) -> list:
        return [self.read(i, sample) for i in indices]

    def chances(self, indices: list[int]) -> list:
        if self.chance is None:
            raise ValueError("the pooled runs test needs each module's runs by chance")
        return [self.chance(i) for i in indices]


def verdict(m: mc.ModuleData, sample: int | None):
    """The module's verdict from all of its codes (sample None) or from `sample` bytes of its
    packed qweight, chosen as inspect chooses them."""
    pattern = symmetric_pattern(m.qzeros, m.bits)
    rows, complete = None, True
    if sample is not None:
        vpb, wpb = block(m.bits, m.word_bits)
        total = len(m.g_idx) // vpb
        blocks = codestats.sample_blocks(total, m.codes.shape[1], wpb, sample, 4)
        if len(blocks) < total:
            rows = (blocks[:, None] * vpb + np.arange(vpb)).reshape(-1)
            complete = False
    st = None
    if pattern is None or sample is None:
        sums, counts = mc.cell_sums(m, rows)
        st = zero_stats(m.stored, sums, counts, m.bits, m.word_bits)
    else:
        complete = True
    return replace(decide(m.name, m.bits, pattern, st), complete=complete)


def detect(mods: list[mc.ModuleData], full: bool):
    return detect_sequential(PerModule(lambda i, s: verdict(mods[i], None if full else s)),
                             len(mods), lambda i: mods[i].codes.size * mods[i].bits // 8, full)


def alarms(det, truth: str) -> list[str]:
    out = []
    if det.verdict != truth:
        out.append("disagree" if any(e.endswith("modules disagree") for e in det.evidence)
                   else f"verdict {det.verdict}")
    out += [f"GQ412 {v.name}" for v in det.modules if v.inconsistent]
    out += [f"GQ414 {v.name}" for v in det.modules if v.outlier]
    out += [f"GQ405 {v.name} {v.signatures}" for v in det.modules if v.signatures]
    return out


def clean_case(args):
    seed, bits, act, conv = args
    mods = mc.model(seed, bits, False, act, conv)
    res = {}
    for mode, full in (("verify", True), ("inspect", False)):
        det = detect(mods, full)
        res[mode] = alarms(det, conv)
    return (bits, act, conv, len(mods), res)


def residual_case(args):
    seed, bits, act, conv = args
    mods = mc.model(seed, bits, False, act, conv)
    worst = spread = 0.0
    for m in mods:
        sums, counts = mc.cell_sums(m)
        st = zero_stats(m.stored, sums, counts, m.bits, m.word_bits)
        if st.cells:
            mu = 1.0 if conv == GPTQ else 0.0
            worst = max(worst, abs(st.median - mu) / effective_se(st.se, bits))
            spread = max(spread, st.spread / ((1 << bits) - 1))
    return bits, worst, spread


def attack_case(args):
    """(kind, caught by verify, caught by inspect) for one corrupted or mislabelled model."""
    seed, bits, kind = args
    rng = np.random.default_rng([seed, bits, 7])
    if kind in ("autogptq", "gptqmodel"):
        mods = mc.model(seed, bits, False, bool(seed % 2), GPTQ, writer=kind, one_signed=True)
        return kind, bits, [any(v.signatures for v in detect(mods, f).modules)
                            for f in (True, False)]
    conv = GPTQ if seed % 2 else GPTQ_V2
    mods = mc.model(seed, bits, False, bool(seed % 3 == 0), conv)
    if kind == "mislabel":  # the label is not read by detection: caught = the data's verdict
        return kind, bits, [detect(mods, f).verdict == conv for f in (True, False)]
    i = int(rng.integers(len(mods)))
    m = mods[i]
    maxq = (1 << bits) - 1
    stored = m.stored.astype(np.int64)
    stored = (np.clip(stored + 3, 0, maxq) if kind == "shift+3"
              else rng.integers(0, maxq + 1, size=stored.shape))
    from gptqfmt.bits.packing import pack
    mods[i] = replace(m, qzeros=pack(stored.astype(np.uint8), bits, 32, axis=1))
    caught = []
    for f in (True, False):
        det = detect(mods, f)
        v = det.modules[i]
        caught.append(bool(v.inconsistent or v.outlier or det.verdict == AMBIGUOUS))
    return kind, bits, caught


def run(fn, cases, jobs):
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            yield from pool.map(fn, cases, chunksize=1)
    else:
        yield from map(fn, cases)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clean", type=int, default=1024, help="clean checkpoints (asymmetric)")
    ap.add_argument("--attacks", type=int, default=16, help="per kind and bits")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--residuals", action="store_true")
    ap.add_argument("--bits", type=int, nargs="*", default=list(BITS),
                    help="only these bits (a quick check of one rule)")
    a = ap.parse_args(argv)
    t0 = time.time()
    combos = list(itertools.product(a.bits, (False, True), (GPTQ, GPTQ_V2)))
    cases = [(seed, *combos[seed % len(combos)]) for seed in range(a.clean)]
    if a.residuals:
        worst = {b: 0.0 for b in a.bits}
        spread = {b: 0.0 for b in a.bits}
        for bits, w, sp in run(residual_case, cases, a.jobs):
            worst[bits] = max(worst[bits], w)
            spread[bits] = max(spread[bits], sp)
        print("largest |median - convention| / effective SE per bits:",
              {b: round(w, 2) for b, w in worst.items()})
        print("largest spread of mean(code) - stored, as a fraction of maxq, per bits:",
              {b: round(w, 3) for b, w in spread.items()})
        return 0
    n_mod = 0
    false = {"verify": [], "inspect": []}
    per = {}
    for done, (bits, act, conv, n, res) in enumerate(run(clean_case, cases, a.jobs), 1):
        if done % 64 == 0:
            print(f"  ... {done} of {a.clean} clean checkpoints ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
        n_mod += n
        key = (bits, act)
        per.setdefault(key, [0, 0, 0])
        per[key][0] += 1
        for j, mode in enumerate(("verify", "inspect")):
            if res[mode]:
                false[mode].append((bits, act, conv, res[mode][:3]))
                per[key][j + 1] += 1
    print(f"clean checkpoints: {a.clean} ({n_mod} modules; bits 2/3/4/8, asymmetric, act-order "
          f"on and off, gptq and gptq_v2, seeds 0..{a.clean - 1})")
    print("  bits act   checkpoints  false alarms (verify)  false alarms (inspect)")
    for (bits, act), (n, fv, fi) in sorted(per.items()):
        print(f"  {bits:>4} {'yes' if act else 'no ':<5} {n:>11}  {fv:>21}  {fi:>22}")
    for mode in ("verify", "inspect"):
        print(f"  {mode}: {len(false[mode])} of {a.clean} clean checkpoints with any alarm")
        for item in false[mode][:10]:
            print("    ", item)
    sys.stdout.flush()
    kinds = ["mislabel", "autogptq", "gptqmodel", "shift+3", "random"]
    attacks = [(seed, bits, kind) for kind in kinds for bits in a.bits
               for seed in range(a.attacks)
               if not (kind in ("autogptq", "gptqmodel") and bits == 3)]
    caught = {}
    for kind, bits, (cv, ci) in run(attack_case, attacks, a.jobs):
        c = caught.setdefault((kind, bits), [0, 0, 0])
        c[0] += 1
        c[1] += cv
        c[2] += ci
    print("detections (caught / tried):")
    print("  kind       bits  verify   inspect")
    for (kind, bits), (n, cv, ci) in caught.items():
        print(f"  {kind:<10} {bits:>4}  {cv:>2}/{n:<4} {ci:>2}/{n:<4}")
    print(f"({time.time() - t0:.0f} s)")
    return 1 if false["verify"] or false["inspect"] else 0


if __name__ == "__main__":
    sys.exit(main())
