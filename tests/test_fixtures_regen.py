"""The committed fixtures are exactly what the seeded generator writes."""
import filecmp

from tests.conftest import FIXTURES, GEN


def test_regenerated_fixtures_are_byte_identical(tmp_path):
    GEN.generate(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == (FIXTURES / "manifest.json").read_bytes()
    new, old = tmp_path / "ckpt", FIXTURES / "ckpt"
    assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in old.iterdir())
    for d in new.iterdir():
        names = sorted(p.name for p in d.iterdir())
        assert names == sorted(p.name for p in (old / d.name).iterdir()), d.name
        match, mismatch, errors = filecmp.cmpfiles(d, old / d.name, names, shallow=False)
        assert not mismatch and not errors, (d.name, mismatch, errors)


def test_committed_fixtures_stay_small():
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 5 * 1024 * 1024, total


def test_fixtures_contain_the_edge_cases_they_promise():
    m = GEN.specs and __import__("tests.conftest", fromlist=["MANIFEST"]).MANIFEST
    asym = [v for v in m.values() if not v["params"]["sym"]]
    assert all(any(t["zero_fields"] for t in v["modules"].values()) for v in asym)
    assert all(any(t["maxq_fields"] for t in v["modules"].values()) for v in asym)
