"""The survey of many small tensors (safetensors_io/survey.py over the compiled loops of
kernels/safetensors_native.c) against a slow reading of the same bytes: which tensors hold
the bytes of the first of their dtype and shape in their file, and which begin with zero
bytes; what it cannot read it leaves unsaid; the store's readers that use it give what they
give without it, and read only one tensor of each alike group."""
import random
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from gptqfmt.checks.modules import probed
from gptqfmt.errors import FindingError
from gptqfmt.formats.gptq.checkpoint import SMALL, open_checkpoint
from gptqfmt.safetensors_io import compiled
from gptqfmt.safetensors_io.index import open_store
from gptqfmt.safetensors_io.reader import CHECK_EVERY, HINT_BYTES, SafetensorsFile
from gptqfmt.safetensors_io.writer import save_file
from tests.support import loops

ROOT = Path(__file__).resolve().parents[2]
needs_build = pytest.mark.skipif(not compiled.available(),
                                 reason="gptqfmt.safetensors_io._native was not built")
ALIKE, HEADS = ("g_idx", "qzeros"), ("qweight", "scales")


def reference(path: Path, alike, heads, n: int, most: int):
    """(rep, zero) as survey defines them, from the file's bytes read whole."""
    f = SafetensorsFile(path)
    blob = path.read_bytes()
    start = f.header.data_start
    first: dict = {}
    rep, zero = {}, {}
    for info in sorted(f.header.tensors.values(), key=lambda i: i.begin):
        prefix, dot, role = info.name.rpartition(".")
        if not (dot and prefix):
            continue
        raw = blob[start + info.begin:start + info.end]
        if role in alike:
            if not 0 < len(raw) <= most:
                continue
            key = (info.dtype, tuple(info.shape))
            if key not in first:
                first[key] = (info.name, raw)
            if raw == first[key][1]:
                rep[info.name] = first[key][0]
        elif role in heads and raw:
            zero[info.name] = not any(raw[:n])
    return rep, zero


def surveyed(path: Path, alike=ALIKE, heads=HEADS, n=64, most=SMALL, cold=False):
    f = SafetensorsFile(path)
    [found] = compiled.survey([(str(path), list(f.header.tensors.values()),
                                f.header.data_start)], tuple(alike), tuple(heads), n, most,
                              HINT_BYTES, CHECK_EVERY, cold)
    return found


def random_file(path: Path, rng: random.Random, count: int = 60) -> None:
    """Tensors named for the roles surveyed and others, of a few dtypes and shapes: copies of
    an earlier one of their kind, random, all zero, zero for a while and then not."""
    kinds = [(np.int32, (rng.randint(1, 4), rng.randint(1, 6))) for _ in range(3)] + \
        [(np.float16, (rng.randint(1, 9),)), (np.uint8, (rng.randint(1, 200),))]
    made: dict = {}
    tensors = {}
    roles = list(ALIKE + HEADS) + ["weight", "bias", "g_idx_x"]
    for i in range(count):
        dtype, shape = rng.choice(kinds)
        role = rng.choice(roles)
        name = rng.choice([f"m{i}.{role}", f"a.b{i}.{role}", f"{role}{i}", f"x{i}..{role}"])
        how = rng.random()
        earlier = made.get((dtype, shape))
        if earlier is not None and how < 0.45:
            a = earlier.copy()
        elif how < 0.6:
            a = np.zeros(shape, dtype)
        elif how < 0.7 and int(np.prod(shape)) > 1:
            a = np.zeros(shape, dtype)
            a.reshape(-1)[-1] = 1
        else:
            a = np.frombuffer(rng.randbytes(int(np.prod(shape)) * np.dtype(dtype).itemsize),
                              dtype).reshape(shape).copy()
        made.setdefault((dtype, shape), a)
        tensors[name] = a
    tensors[f"z{count}.qweight"] = np.zeros((0,), np.int32)   # empty: said of by neither
    save_file(tensors, path)


@needs_build
@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_survey_says_what_the_bytes_say(tmp_path, seed):
    rng = random.Random(seed)
    p = tmp_path / "x.safetensors"
    random_file(p, rng)
    n, most = rng.choice([1, 4, 64, 4096]), rng.choice([8, 64, SMALL])
    want = reference(p, ALIKE, HEADS, n, most)
    assert surveyed(p, n=n, most=most) == want
    # told ahead from the first range (a cold page cache): the same answers
    assert surveyed(p, n=n, most=most, cold=True) == want


@needs_build
def test_a_file_cut_short_after_its_header_was_read_leaves_the_rest_unsaid(tmp_path):
    p = tmp_path / "x.safetensors"
    a = np.arange(64, dtype=np.int32)
    save_file({f"m{i}.g_idx": a for i in range(8)} | {f"m{i}.qweight": np.zeros(64, np.int32)
                                                        for i in range(8)}, p)
    f = SafetensorsFile(p)
    infos = list(f.header.tensors.values())
    cut = infos[len(infos) // 2]
    with open(p, "r+b") as fh:   # the file shrinks in the middle of a tensor
        fh.truncate(f.header.data_start + cut.begin + 3)
    [(rep, zero)] = compiled.survey([(str(p), infos, f.header.data_start)], ALIKE, HEADS, 64,
                                    SMALL, HINT_BYTES, CHECK_EVERY, False)
    read = {i.name for i in infos if i.end <= cut.begin}
    assert set(rep) | set(zero) == read
    assert all(zero[t] for t in zero)


@needs_build
def test_a_group_whose_first_tensor_cannot_be_read_says_nothing(tmp_path):
    """The first of a group past the end of the file: the others of that group are not
    compared with anything."""
    p = tmp_path / "x.safetensors"
    save_file({"a.g_idx": np.arange(8, dtype=np.int32),
               "b.g_idx": np.arange(8, dtype=np.int32)}, p)
    f = SafetensorsFile(p)
    infos = sorted(f.header.tensors.values(), key=lambda i: i.begin)
    late = infos[0]._replace(begin=10_000, end=10_032)
    # the second read first, then the first from past the end of the file
    [(rep, zero)] = compiled.survey([(str(p), [infos[1], late], f.header.data_start)], ALIKE,
                                    HEADS, 64, SMALL, HINT_BYTES, CHECK_EVERY, False)
    assert rep == {infos[1].name: infos[1].name} and zero == {}


@needs_build
def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="every >= 1"):
        compiled.survey([], ALIKE, HEADS, 64, 8, HINT_BYTES, 0, False)
    with pytest.raises(TypeError, match="tuples"):
        compiled.survey([("x", [("a.g_idx",)], 0)], ALIKE, HEADS, 64, 8, HINT_BYTES, 1, False)
    with pytest.raises(TypeError, match="files must be"):
        compiled.survey([("x", ())], ALIKE, HEADS, 64, 8, HINT_BYTES, 1, False)
    with pytest.raises(ValueError, match="data_start"):
        compiled.survey([("x", [], -1)], ALIKE, HEADS, 64, 8, HINT_BYTES, 1, False)


@needs_build
def test_files_are_surveyed_each_on_their_own_and_one_that_cannot_be_opened_says_nothing(
        tmp_path):
    """Groups are per file (a tensor alike one of another file is compared with its own
    file's first); a file gone since its header was read is in neither answer."""
    a, b, gone = (tmp_path / f"{x}.safetensors" for x in "abc")
    save_file({"m0.g_idx": np.arange(4, dtype=np.int32),
               "m1.g_idx": np.arange(4, dtype=np.int32)}, a)
    save_file({"m2.g_idx": np.arange(4, dtype=np.int32), "m2.qweight": np.zeros(4, np.int32)},
              b)
    save_file({"m3.g_idx": np.arange(4, dtype=np.int32)}, gone)
    files = [(str(p), list((h := SafetensorsFile(p).header).tensors.values()), h.data_start)
             for p in (a, b, gone)]
    gone.unlink()
    assert compiled.survey(files, ALIKE, HEADS, 64, 8 << 10, HINT_BYTES, CHECK_EVERY,
                           False) == [({"m0.g_idx": "m0.g_idx", "m1.g_idx": "m0.g_idx"}, {}),
                                      ({"m2.g_idx": "m2.g_idx"}, {"m2.qweight": True}),
                                      ({}, {})]


def shards(tmp_path: Path, rng: random.Random, files: int = 3) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for i in range(files):
        random_file(d / f"model-{i:05d}-of-{files:05d}.safetensors", rng, 40)
    return d


@needs_build
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_store_reads_the_same_with_and_without_a_survey(tmp_path, seed, streamed,
                                                            monkeypatch):
    """heads_grouped gives every tensor its own bytes, reading one tensor of each group the
    survey found; zero_heads names the same tensors. A survey started on an open store, or
    fed each file as the store opens it (`streamed`); the shards name some tensors twice
    (a finding), each read from the file the store takes it from."""
    d = shards(tmp_path, random.Random(seed))
    plan = ([(("g_idx",), ()), (("qzeros",), HEADS)], 64, SMALL)
    plain = open_store(d)
    if streamed:
        st = open_store(d, survey=plan)
    else:
        st = open_store(d)
        st.start_survey(*plan)
    assert st.survey is not None
    names = sorted(plain.locations)
    whole = [t for t in names if t.rpartition(".")[2] in ALIKE]
    probed = [t for t in names if t.rpartition(".")[2] in HEADS]
    want, want_zero = dict(plain.heads(whole)), plain.zero_heads(probed, 64)
    read: list[str] = []
    heads = SafetensorsFile.heads

    def counted(self, ts, n=None):
        read.extend(ts)
        return heads(self, ts, n)
    monkeypatch.setattr(SafetensorsFile, "heads", counted)
    got = {t: raw for raw, ts in st.heads_grouped(whole) for t in ts}
    assert got == want
    reps = set(st.survey.rep.values())
    grouped = [t for t in whole if t in st.survey.rep]
    assert grouped and set(read) <= reps | (set(whole) - set(grouped))
    assert len(read) == len(set(st.survey.rep[t] for t in grouped)) + \
        len(set(whole) - set(grouped))
    read.clear()
    assert st.zero_heads(probed, 64) == want_zero
    # every probe answered by the survey but the empty one, which it leaves to the reads
    assert read == [t for t in probed if not plain.info(t).nbytes]
    assert st.zero_heads(probed, 65) == plain.zero_heads(probed, 65)   # another n: read
    st.close()
    plain.close()


def test_without_the_compiled_loops_nothing_is_surveyed(tmp_path):
    d = shards(tmp_path, random.Random(0), 1)
    with loops(compiled=False):
        st = open_store(d)
        st.start_survey([(ALIKE, HEADS)], 64, SMALL)
    assert st.survey is None
    st.close()


def gptq_fixtures():
    return sorted(p for p in (ROOT / "fixtures" / "ckpt").iterdir() if p.is_dir())


def modelled(path: Path, survey_on: bool):
    ck = open_checkpoint(path, survey=survey_on)
    try:
        mods = [(m.name, m.valid, getattr(m, "group_size", None), getattr(m, "act_order", None),
                 getattr(m, "in_features", None)) for m in ck.modules]
        valid = ck.valid_modules
        patterns = {valid[i].name: p for i, p in ck.small_patterns(valid, SMALL).items()}
        return mods, [f.to_json() for f in ck.findings], patterns
    finally:
        ck.store.close()


@needs_build
def test_a_surveyed_checkpoint_is_modelled_and_read_as_an_unsurveyed_one(tmp_path):
    """Every GPTQ fixture: the same modules, findings and symmetric patterns; and one whose
    g_idx and qzeros were edited among alike modules (a permuted g_idx, one qzeros word)."""
    for p in gptq_fixtures():
        assert modelled(p, True) == modelled(p, False), p.name
    src = next(p for p in gptq_fixtures() if p.name == "b4-sym-noact-gptq-sharded")
    d = tmp_path / "edited"
    shutil.copytree(src, d)
    st = open_store(d)
    g = sorted(t for t in st.locations if t.endswith(".g_idx"))
    z = sorted(t for t in st.locations if t.endswith(".qzeros"))
    edits = [(g[-1], 0, 4), (z[1], 8, 1)]   # (tensor, byte, xor)
    places = [(st.files[st.locations[t]].path,
               st.files[st.locations[t]].header.data_start + st.info(t).begin + at, x)
              for t, at, x in edits]
    st.close()
    for path, at, x in places:
        with open(path, "r+b") as fh:
            fh.seek(at)
            b = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([b ^ x]))
    on, off = modelled(d, True), modelled(d, False)
    assert on == off
    # and the edits are seen, not taken for their alike neighbours' bytes: the permuted g_idx
    # makes its module invalid (GQ309 there), the qzeros edited no longer symmetric
    (mods, findings, patterns), (mods0, _, patterns0) = on, modelled(src, True)
    g_mod = g[-1].rpartition(".")[0]
    assert [m for m in mods if m not in mods0] == [(g_mod, False, None, None, 64)]
    assert [(f["code"], f["tensor"]) for f in findings] == [("GQ309", g[-1])]
    z_mod = z[1].rpartition(".")[0]
    assert set(patterns0) - set(patterns) == {g_mod}
    assert {n for n, p in patterns.items() if p != patterns0[n]} == {z_mod}
    assert patterns[z_mod] is None and patterns0[z_mod] is not None


@needs_build
def test_inspect_reports_the_same_with_and_without_the_survey():
    """inspect's whole document on every GPTQ fixture, the compiled survey on and off (the
    loops off leave nothing surveyed)."""
    from gptqfmt.ops.inspect import inspect_checkpoint
    for p in gptq_fixtures():
        with loops(compiled=True):
            a = inspect_checkpoint(p).to_json()
        with loops(compiled=False):
            b = inspect_checkpoint(p).to_json()
        a["tool"] = b["tool"] = None
        assert a == b, p.name


def test_a_survey_that_fails_leaves_everything_to_the_reads(tmp_path, monkeypatch):
    """A survey whose reads raise says nothing; the store reads everything itself."""
    d = shards(tmp_path, random.Random(3), 1)

    def broken(*a, **k):
        raise OSError("no")
    monkeypatch.setattr(compiled, "survey", broken)
    plain = open_store(d)
    st = open_store(d)
    st.start_survey([(ALIKE, HEADS)], 64, SMALL)
    assert st.survey is not None
    names = [t for t in sorted(st.locations) if t.rpartition(".")[2] in ALIKE]
    assert {t: raw for raw, ts in st.heads_grouped(names) for t in ts} == \
        dict(plain.heads(names))
    st.close()
    plain.close()


@needs_build
def test_the_survey_thread_has_ended_before_detection_forks(monkeypatch):
    """inspect's detection forks worker processes; the survey's thread is gone by then (a
    child of a process with a thread running may inherit a lock held). The survey's last pass
    is held until the store is told to settle (or, were it never told, until detection asks
    whether it may fork, so that the test ends)."""
    from gptqfmt.detection import read as detection_read
    from gptqfmt.ops.inspect import inspect_checkpoint
    from gptqfmt.safetensors_io.index import TensorStore
    seen: list[list[str]] = []
    gate = threading.Event()
    real_forks, real_survey, real_settle = (detection_read.forks_safely, compiled.survey,
                                            TensorStore.settle)

    def held(files, alike, *rest):
        if alike == ("qzeros",):
            gate.wait()
        return real_survey(files, alike, *rest)

    settled = []

    def settle(self):
        settled.append(self.survey)
        gate.set()
        real_settle(self)

    def forks_safely():
        seen.append([t.name for t in threading.enumerate()])
        gate.set()
        return real_forks()
    monkeypatch.setattr(compiled, "survey", held)
    monkeypatch.setattr(TensorStore, "settle", settle)
    monkeypatch.setattr(detection_read, "forks_safely", forks_safely)
    monkeypatch.setattr(detection_read, "PROCESS_MIN_MODULES", 1)
    monkeypatch.setattr(detection_read, "cpus", lambda: 2)
    monkeypatch.setattr(detection_read, "SMALL", 0)   # every module to the workers
    r = inspect_checkpoint(ROOT / "fixtures" / "ckpt" / "b4-asym-noact-gptq-sharded")
    r.source.close()
    sv = settled[0]
    assert sv is not None
    assert seen and not any("gptqfmt-survey" in names for names in seen)
    # waited for, not stopped: the held pass was read whole (every probe the survey's)
    assert set(sv.zero) == {t for m in r.source.modules for t in probed(m)}


@needs_build
def test_a_set_stop_byte_reads_nothing(tmp_path):
    p = tmp_path / "x.safetensors"
    random_file(p, random.Random(7))
    f = SafetensorsFile(p)
    files = [(str(p), list(f.header.tensors.values()), f.header.data_start)]
    assert compiled.survey(files, ALIKE, HEADS, 64, SMALL, HINT_BYTES, CHECK_EVERY,
                           False, bytearray(b"\x01")) == [({}, {})]
    assert compiled.survey(files, ALIKE, HEADS, 64, SMALL, HINT_BYTES, CHECK_EVERY,
                           False, bytearray(1)) == [reference(p, ALIKE, HEADS, 64, SMALL)]
    with pytest.raises(TypeError):   # the stop byte is written by another thread: writable
        compiled.survey(files, ALIKE, HEADS, 64, 8, HINT_BYTES, CHECK_EVERY, False, b"\x00")


@needs_build
def test_closing_the_store_stops_the_reads_left(tmp_path, monkeypatch):
    """A store closed while its survey reads (an interrupted command) sets the stop byte and
    waits only for the reads under way: the pass under way says nothing more, the next is
    not begun. The second pass is held until close() has set the byte."""
    d = shards(tmp_path, random.Random(5), 2)
    entered, released = threading.Event(), threading.Event()
    real = compiled.survey

    def held(files, alike, heads, n, most, hint, every, cold, stop):
        if alike == ("qzeros",):
            entered.set()
            released.wait()
        return real(files, alike, heads, n, most, hint, every, cold, stop)
    monkeypatch.setattr(compiled, "survey", held)
    st = open_store(d)
    st.start_survey([(("g_idx",), ()), (("qzeros",), HEADS), (("weight",), ())], 64, SMALL)
    sv = st.survey
    assert sv is not None
    entered.wait()
    join = sv._thread.join

    def joined(*a):   # close() has set the byte by now: let the held pass go on
        assert sv._stop[0] == 1
        released.set()
        join(*a)
    monkeypatch.setattr(sv._thread, "join", joined)
    st.close()
    assert not sv._thread.is_alive()
    assert any(t.endswith(".g_idx") for t in sv.rep)          # the first pass, whole
    assert not any(t.endswith(".qzeros") for t in sv.rep) and not sv.zero   # stopped
    assert not any(t.endswith(".weight") for t in sv.rep)     # the third, never begun


@needs_build
def test_the_first_pass_reads_each_file_while_the_next_ones_are_opened(tmp_path,
                                                                      monkeypatch):
    """The store opens file i + 1 only once the survey's first pass has read file i (a hook
    holds it): the first pass reads the files as they come, before the store is complete;
    the later passes read them all in one call once it is. What it says is what a survey of
    the open store says."""
    from gptqfmt.safetensors_io import index
    d = shards(tmp_path, random.Random(11), 4)
    plan = ([(("g_idx",), ()), (("qzeros",), HEADS)], 64, SMALL)
    # ("open", file) as the store opens each; ("read", the pass's suffixes, the files) as the
    # compiled loops are called
    events: list[tuple] = []
    read: dict[str, threading.Event] = {}
    real_survey, real_open = compiled.survey, index._open_into

    def reading(files, alike, *rest):
        events.append(("read", alike, [Path(f[0]).name for f in files]))
        got = real_survey(files, alike, *rest)
        for f in files:
            read.setdefault(f[0], threading.Event()).set()
        return got

    def held(store, name, sv=None):
        if store.files:   # the file before this one read by the first pass first
            last = list(store.files.values())[-1].path
            assert read.setdefault(last, threading.Event()).wait(60)
        events.append(("open", name))
        return real_open(store, name, sv)
    monkeypatch.setattr(compiled, "survey", reading)
    monkeypatch.setattr(index, "_open_into", held)
    st = open_store(d, survey=plan)
    st.settle()
    names = sorted(p.name for p in d.iterdir())
    assert [e[1] for e in events if e[0] == "open"] == names
    first = [e for e in events if e[0] == "read" and e[1] == ("g_idx",)]
    assert [f for e in first for f in e[2]] == names and len(first) == len(names)
    later = [e for e in events if e[0] == "read" and e[1] != ("g_idx",)]
    assert later == [("read", ("qzeros",), names)]
    assert events.index(later[0]) > events.index(("open", names[-1]))
    monkeypatch.undo()
    other = open_store(d)
    other.start_survey(*plan)
    other.settle()
    assert (st.survey.rep, st.survey.zero) == (other.survey.rep, other.survey.zero)
    st.close()
    other.close()


@needs_build
def test_a_store_that_cannot_be_opened_leaves_no_survey_thread(tmp_path):
    """Every shard of the index unreadable: open_store raises (GQ128), and the survey it
    started for the files has ended."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model-00001-of-00001.safetensors").write_bytes(b"\x00" * 4)
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"m.qweight": "model-00001-of-00001.safetensors"}}')
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(FindingError):
        open_store(d, survey=([(("g_idx",), ())], 64, SMALL))
    assert not [t for t in threading.enumerate()
                if t.name == "gptqfmt-survey" and t.ident not in before]


@needs_build
@pytest.mark.parametrize("name", ["awq-b4-g32", "ct-b4-sym-g32-sharded"])
def test_a_checkpoint_of_another_format_ends_the_survey_it_was_opened_with(name):
    """open_source(survey=True) starts GPTQ's survey as the store opens; a checkpoint that
    sniffs as another format ends it: no survey, no thread."""
    from gptqfmt.formats.open import open_source
    src = open_source(ROOT / "fixtures" / "formats" / name, survey=True)
    assert src.store.survey is None
    assert not [t for t in threading.enumerate() if t.name == "gptqfmt-survey"]
    src.store.close()
    gptq = open_source(ROOT / "fixtures" / "ckpt" / "b4-sym-noact-gptq-sharded", survey=True)
    assert gptq.store.survey is not None
    gptq.store.close()
