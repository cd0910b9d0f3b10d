#!/usr/bin/env python3
"""Long mutation-fuzzing run of inspect and verify: python scripts/fuzz.py [N] [SEED].

Prints how many inputs ran, how they ended, and every crash (an exception other than gptqfmt's
own refusals) with the seed that reproduces it; exit 1 if any crashed.
"""
import random
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import mutated_copy, run_one  # noqa: E402

BASES = ["b4-asym-act-gptq-sharded", "b3-asym-noact-gptq_v2-single", "int8-b4-asym-gptq_v2",
         "b8-sym-act-gptq_v2-sharded", "dynamic-b4-asym-gptq_v2", "autogptq-b4-asym-gptq"]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    counts = {"clean": 0, "refused": 0, "crash": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            rnd = random.Random(seed * 1_000_003 + i)
            d = Path(tmp) / f"c{i}"
            target = mutated_copy(ROOT / "fixtures" / "ckpt" / rnd.choice(BASES), d, rnd)
            try:
                counts[run_one(d, Path(tmp) / f"o{i}")] += 1
            except Exception:  # noqa: BLE001 - what we are hunting
                counts["crash"] += 1
                print(f"CRASH seed={seed} i={i} file={target.name}", file=sys.stderr)
                traceback.print_exc()
            shutil.rmtree(d)
            shutil.rmtree(Path(tmp) / f"o{i}", ignore_errors=True)
    print(f"ran {n} mutated checkpoints (seed {seed}): {counts['clean']} inspected and verified, "
          f"{counts['refused']} refused with a clean error, {counts['crash']} crashed")
    sys.exit(1 if counts["crash"] else 0)


if __name__ == "__main__":
    main()
