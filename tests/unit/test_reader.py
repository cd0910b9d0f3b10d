"""The safetensors reader (gptqfmt/safetensors_io/reader.py): the same tensors and metadata as
the reference library on the shipped fixtures."""
import json
import mmap
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file as torch_load_file

from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import SafetensorsFile, save_file
from gptqfmt.safetensors_io.index import INDEX_NAME, open_store
from tests.support import CKPT

FILES = sorted(CKPT.glob("*/*.safetensors"))


@pytest.mark.parametrize("path", FILES[::7], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reader_equals_reference_on_fixtures(path):
    ref = torch_load_file(str(path))
    f = SafetensorsFile(path)
    assert list(f.tensors) and sorted(f.tensors) == sorted(ref)
    for name, t in ref.items():
        v = f.view(name)
        if t.dtype == torch.bfloat16:
            assert np.array_equal(v, t.view(torch.int16).numpy().view(np.uint16))
        else:
            assert np.array_equal(v, t.numpy()) and v.dtype == t.numpy().dtype


def test_header_metadata_kept():
    f = SafetensorsFile(CKPT / "autogptq-b4-asym-gptq" / "model.safetensors")
    assert f.metadata["format"] == "pt" and f.metadata["gptq_bits"] == "4"
    assert json.loads(json.dumps(f.metadata)) == f.metadata


# -- reads without mapping: heads and zero_heads ------------------------------------------------
def _small(tmp_path):
    """A sharded store of a few tensors: one empty, one all zero, one zero for its first 8
    bytes only, one nonzero from its first byte."""
    a = {"e": np.zeros(0, np.int32), "z": np.zeros(16, np.int32),
         "late": np.concatenate([np.zeros(2, np.int32), np.arange(1, 15, dtype=np.int32)])}
    b = {"n": np.arange(1, 9, dtype=np.int16)}
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {
        **{k: "a.safetensors" for k in a}, **{k: "b.safetensors" for k in b}}}))
    return open_store(tmp_path), {**a, **b}


def test_heads_are_the_tensors_first_bytes_grouped_by_file(tmp_path):
    store, arrays = _small(tmp_path)
    whole = dict(store.heads(["n", "late", "e", "z"]))
    assert whole == {k: arrays[k].tobytes() for k in ("n", "late", "e", "z")}
    def by_data(names):   # the empty tensor begins where the next one does: asked order
        return sorted(names, key=lambda t: store.info(t).begin)
    order = [t for t, _ in store.heads(["n", "z", "late", "e"])]
    assert order == ["n"] + by_data(["z", "late", "e"])   # b's first, then a's, by offset
    assert by_data(["z", "late", "e"]) != ["z", "late", "e"]
    order = [t for t, _ in store.heads(["late", "n", "e"])]
    assert order == by_data(["late", "e"]) + ["n"]
    assert dict(store.heads(["late", "n"], 8)) == {"late": arrays["late"].tobytes()[:8],
                                                  "n": arrays["n"].tobytes()[:8]}


@pytest.mark.parametrize("n, zero", [(8, {"z", "late"}), (9, {"z"}), (64, {"z"}),
                                     (4096, {"z"})])
def test_zero_heads_names_zero_heads_and_never_an_empty_tensor(tmp_path, n, zero):
    store, arrays = _small(tmp_path)
    assert store.zero_heads(arrays, n) == zero


def test_a_file_cut_short_after_opening_is_a_finding_not_a_short_read(tmp_path):
    store, _ = _small(tmp_path)
    p = tmp_path / "a.safetensors"
    last = max(store.files["a.safetensors"].tensors.values(), key=lambda i: i.end).name
    os.truncate(p, p.stat().st_size - 8)
    with pytest.raises(FindingError) as e:
        list(store.heads(["e", "z", "late"]))
    f = e.value.finding
    assert (f.code, f.file, f.tensor) == ("GQ118", "a.safetensors", last)
    assert "changed while being read" in f.message


def test_a_file_gone_after_opening_is_a_finding(tmp_path):
    store, _ = _small(tmp_path)
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(FindingError) as e:
        store.zero_heads(["n"], 4096)
    assert (e.value.finding.code, e.value.finding.file) == ("GQ118", "b.safetensors")


# -- release: the whole file's pages dropped where a view was made since -------------------------
def test_release_drops_pages_only_where_a_view_was_made_since(tmp_path, monkeypatch):
    advised = []

    class Spy(mmap.mmap):
        def madvise(self, *a):
            advised.append(a)
            return super().madvise(*a)
    monkeypatch.setattr(mmap, "mmap", Spy)
    store, _ = _small(tmp_path)
    store.view("z")                  # the file is mapped
    store.release(["z"])
    store.release(["z"])             # nothing viewed since: no madvise
    store.release(["late"])
    assert len(advised) == 1
    store.view("late")
    store.release(["late", "z"])     # one file, one madvise
    store.release()
    assert len(advised) == 2
    store.files["a.safetensors"].release(0, 4)   # a range: always dropped
    assert len(advised) == 3


def test_a_store_records_the_files_a_view_mapped_since_their_release(tmp_path, monkeypatch):
    """TensorStore.mapped holds exactly the files viewed since their last whole release: a
    module's release with none of them looks at no tensor's file (the lookups a mixture of
    experts makes tens of thousands of times)."""
    from gptqfmt.safetensors_io.reader import SafetensorsFile
    store, _ = _small(tmp_path)
    f = store.files["a.safetensors"]
    assert not store.mapped
    store.view("z")
    assert store.mapped == {f} and f.viewed
    store.release(["z"])
    assert not store.mapped and not f.viewed
    f.raw()                           # the whole file viewed: mapped too
    assert store.mapped == {f}
    store.release()
    assert not store.mapped

    def looked_up(*a):
        raise AssertionError("a file looked at with nothing mapped")
    monkeypatch.setattr(SafetensorsFile, "release", looked_up)
    monkeypatch.setattr(type(store), "files", property(looked_up), raising=False)
    store.release(["z", "late"])      # nothing mapped: returns at once


# -- a cold page cache: the small reads told ahead ------------------------------------------------
def test_cached_asks_without_waiting_and_says_true_where_it_cannot_tell(tmp_path, monkeypatch):
    """cached() is a read that does not wait: data just written are there; a read that would
    wait (EAGAIN) is a miss; a file system that refuses the flag, or a system without it,
    tells nothing (True: no hints)."""
    import errno

    from gptqfmt.safetensors_io import reader
    p = tmp_path / "f"
    p.write_bytes(os.urandom(3 * reader.PAGE))
    with open(p, "rb") as f:
        fd = f.fileno()
        assert reader.cached(fd, 0, 3 * reader.PAGE) and reader.cached(fd, 5, 0)

        def refuse(err):
            def preadv(*a):
                raise OSError(err, os.strerror(err))
            return preadv
        monkeypatch.setattr(os, "preadv", refuse(errno.EAGAIN), raising=False)
        assert not reader.cached(fd, 0, 10)
        monkeypatch.setattr(os, "preadv", refuse(errno.EOPNOTSUPP), raising=False)
        assert reader.cached(fd, 0, 10)
        monkeypatch.setattr(reader, "_NOWAIT", None)
        monkeypatch.setattr(os, "preadv", refuse(errno.EAGAIN), raising=False)
        assert reader.cached(fd, 0, 10)


@pytest.mark.parametrize("cold_from", [None, 0, 1, 64, 65, 130])
def test_read_ahead_tells_each_range_once_before_its_read_and_only_once_cold(
        monkeypatch, cold_from):
    """A file is asked whether it is cold at its first two ranges and every CHECK_EVERY-th;
    while the answer is no, nothing is told. From the first range found missing on, every
    range with bytes is told exactly once, before it is read, and never more than HINT_BYTES
    plus one range ahead of the one read."""
    from gptqfmt.safetensors_io import reader
    rng = np.random.default_rng(cold_from or 0)
    sizes = [int(x) for x in rng.choice([0, 1, 700, 5000, 40_000], 300)]
    spans = list(zip(np.cumsum([0] + sizes[:-1]).tolist(), sizes))
    monkeypatch.setattr(reader, "HINT_BYTES", 100_000)
    now = [0]   # the range about to be read
    asked: list[int] = []
    told: list[tuple[int, int]] = []

    def cached(fd, at, k):
        assert (at, k) == spans[now[0]]
        asked.append(now[0])
        return cold_from is None or now[0] < cold_from

    monkeypatch.setattr(reader, "cached", cached)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, k, advice: told.append((at, k)))
    checked = [j for j in range(len(spans)) if j % reader.CHECK_EVERY < 2]
    found = next((j for j in checked if cold_from is not None and j >= cold_from), len(spans))
    ahead = reader.ReadAhead(-1, spans)
    for j, (at, k) in enumerate(spans):
        now[0] = j
        ahead.before(j)
        if j < found:
            assert not told
        elif k:
            assert (at, k) in told   # told before its read
        assert sum(s for a, s in told if a > at) <= reader.HINT_BYTES + max(sizes)
    assert asked == [j for j in checked if j <= found]
    assert sorted(told) == [s for s in spans[found:] if s[1]]   # each once, from there on


def test_heads_from_a_cold_cache_are_the_same_bytes_told_ahead(tmp_path, monkeypatch):
    from gptqfmt.safetensors_io import reader
    store, arrays = _small(tmp_path)
    told: list[tuple[int, int]] = []
    monkeypatch.setattr(reader, "cached", lambda fd, at, k: False)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, k, advice: told.append((at, k)))
    monkeypatch.setattr(reader, "MANY", 3)
    assert dict(store.heads(["n", "late", "e", "z"])) == \
        {k: arrays[k].tobytes() for k in ("n", "late", "e", "z")}
    assert len(told) == 2   # a's two with bytes, each once; b's one range is too few to ask
    monkeypatch.setattr(reader, "MANY", 16)
    assert dict(store.heads(["late", "e", "z"])) == \
        {k: arrays[k].tobytes() for k in ("late", "e", "z")} and len(told) == 2


def test_read_ahead_leaves_a_few_ranges_alone(monkeypatch):
    from gptqfmt.safetensors_io import reader
    monkeypatch.setattr(reader, "cached", lambda *a: pytest.fail("asked"))
    ahead = reader.ReadAhead(-1, [(i * 10, 10) for i in range(reader.MANY - 1)])
    for j in range(reader.MANY - 1):
        ahead.before(j)
