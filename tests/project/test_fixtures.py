"""The committed fixtures are exactly what the seeded generators write."""
from __future__ import annotations

import filecmp
import json

from tests.support import (
    FIXTURES,
    FORMATS,
    GEN,
    MANIFEST,
    digest,
    load_generator,
)


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_regenerated_fixtures_are_byte_identical(tmp_path):
    GEN.generate(tmp_path)
    load_generator("make_invalid").generate_invalid(tmp_path)
    load_generator("make_hostile").generate_hostile(tmp_path)
    for sub in ("ckpt", "invalid", "hostile"):
        new, old = tmp_path / sub, FIXTURES / sub
        assert tree(new) == tree(old), sub
        files = [p for p in tree(new) if (new / p).is_file()]
        _, mismatch, errors = filecmp.cmpfiles(new, old, files, shallow=False)
        assert not mismatch and not errors, (mismatch, errors)
    assert (tmp_path / "manifest.json").read_bytes() == (FIXTURES / "manifest.json").read_bytes()


def test_committed_fixtures_stay_small():
    # 6.25 MiB: the 117 checkpoints of fixtures/ckpt (the runtime-condition cases among them
    # take about 0.6 MiB, auto-round's own format, at hidden 32, under 0.1 MiB), the format
    # fixtures and the invalid and hostile cases
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 6.25 * 1024 * 1024, total


def test_fixtures_contain_the_edge_cases_they_promise():
    asym = [v for v in MANIFEST.values() if not v["params"]["sym"]]
    assert all(any(t["zero_fields"] for t in v["modules"].values()) for v in asym)
    assert all(any(t["maxq_fields"] for t in v["modules"].values()) for v in asym)


FMANIFEST = json.loads((FORMATS / "manifest.json").read_text())


FGEN = load_generator("make_formats")


def test_regenerated_format_fixtures_are_byte_identical(tmp_path):
    FGEN.generate_formats(tmp_path)
    for name in FMANIFEST:
        assert digest(tmp_path / "formats" / name) == digest(FORMATS / name), name
    assert (tmp_path / "formats" / "manifest.json").read_bytes() == \
        (FORMATS / "manifest.json").read_bytes()
