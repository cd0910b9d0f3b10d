"""Mutation fuzzing of whole checkpoints: the harness shared by the tests and scripts/fuzz.py.

A mutation takes one file of a small checkpoint (a shard, the index or a config) and changes its
bytes: bit flips, truncation, insertions, or splices of hostile JSON tokens into headers and
configs. `run_one` then runs inspect and verify and classifies the outcome: a finding or usage
error is a clean refusal; any other exception is a crash.
"""
from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

from .errors import FindingError, OutputError, UsageError
from .inspection import inspect_checkpoint
from .validate import validate

TOKENS = [b"-1", b"-0", b"1e400", b"null", b"NaN", b"18446744073709551616", b"[]", b"{}",
          b'"\\ud800"', b'"F16"', b'"I32"', b'"BF16"', b"0", b"4294967296", b'"\\u001b[2J"',
          b"[[[[[[[[", b'"data_offsets"', b'"shape"', b'"__metadata__"', b",", b":"]


def mutate(blob: bytes, rnd: random.Random) -> bytes:
    b = bytearray(blob)
    header_end = 8 + struct.unpack("<Q", blob[:8])[0] if len(blob) >= 8 and \
        struct.unpack("<Q", blob[:8])[0] < len(blob) else len(blob)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.choice(["flip", "flip", "cut", "insert", "token", "token", "length", "data"])
        pos = rnd.randrange(max(1, min(len(b), header_end)))
        if op == "data" and len(b) > header_end:  # tensor values: scales, g_idx, qzeros, ...
            pos = rnd.randrange(header_end, len(b))
            b[pos:pos + 4] = bytes(rnd.choice([0x00, 0x7C, 0x7E, 0xFF, 0x80, rnd.randrange(256)])
                                   for _ in range(min(4, len(b) - pos)))
            continue
        if op == "flip" and b:
            b[pos] ^= 1 << rnd.randrange(8)
        elif op == "cut":
            end = pos + rnd.randint(1, 64) if rnd.random() < 0.7 else len(b)
            del b[pos:end]
        elif op == "insert":
            b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif op == "token":
            tok = rnd.choice(TOKENS)
            b[pos:pos + rnd.randint(0, len(tok))] = tok
        elif op == "length" and len(b) >= 8:
            b[:8] = struct.pack("<Q", rnd.choice([0, 1, len(b), len(b) - 8, 2**40, 2**64 - 1,
                                                  rnd.randrange(len(b) + 16)]))
    return bytes(b)


def mutated_copy(src: Path, dst: Path, rnd: random.Random) -> Path:
    shutil.copytree(src, dst)
    files = sorted(p for p in dst.iterdir() if p.suffix in (".safetensors", ".json"))
    target = rnd.choice(files)
    target.write_bytes(mutate(target.read_bytes(), rnd))
    return target


def run_one(path: Path, out: Path | None = None) -> str:
    """'clean' (ran, findings or not), 'refused' (a finding or usage error), or raises on a crash
    (any other exception, a bare internal GptqfmtError, or a report that is not valid JSON).
    With `out`, convert (and verify --against) run too."""
    try:
        json.dumps(inspect_checkpoint(path).to_json(), allow_nan=False)
        rep = validate(path, jobs=1)
        json.dumps(rep.to_json(), allow_nan=False)
        if out is not None:
            from .conversion import convert
            from .verify.equivalence import compare
            convert(path, out, allow_lossy=True)
            compare(path, out, backend="cpu")
        return "clean"
    except (FindingError, UsageError, OutputError):
        return "refused"
