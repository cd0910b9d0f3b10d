"""The range bookkeeping of the Hub reads (safetensors_io/remote.py): ranges added to what a
sparse copy holds, and the parts of a read still missing, against a set of byte offsets."""
import random

import pytest

from gptqfmt.safetensors_io.remote import GAP, _add, coalesce, missing


def runs(offsets: set[int]) -> list[tuple[int, int]]:
    """The sorted, disjoint [start, stop) runs of a set of offsets."""
    out: list[tuple[int, int]] = []
    for x in sorted(offsets):
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0], x + 1)
        else:
            out.append((x, x + 1))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_added_and_missing_ranges_are_those_of_the_bytes(seed):
    rnd = random.Random(seed)
    have: list[tuple[int, int]] = []
    held: set[int] = set()
    for _ in range(rnd.randint(1, 30)):
        a = rnd.randint(0, 300)
        b = a + rnd.randint(1, 40)
        have = _add(have, a, b)
        held.update(range(a, b))
        assert have == runs(held)   # merged: touching ranges are one
        x = rnd.randint(0, 320)
        y = x + rnd.randint(0, 60)
        assert missing(have, x, y) == runs(set(range(x, y)) - held)


def test_ranges_less_than_the_gap_apart_are_one_request():
    assert coalesce([(0, 10), (9 + GAP, 20 + GAP)]) == [(0, 20 + GAP)]
    assert coalesce([(0, 10), (10 + GAP, 20 + GAP)]) == [(0, 10), (10 + GAP, 20 + GAP)]
