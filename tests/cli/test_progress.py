"""Progress that tells the truth: the library reports its work in named phases, each started
(with its unit and total) before its first update, its updates adding up to its total; convert's
write phase counts the bytes of the output as they are written, many times per shard; and the
CLI's bars (cli/progress.py) measure rate and ETA from the start of the phase they show, appear
only for a person at a terminal, and never before the work they count has started."""
from __future__ import annotations

import io
import json
import shutil
import struct
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import pytest
import tqdm as tqdm_package
import tqdm.std as tqdm_std

from gptqfmt.cli.progress import Progress
from gptqfmt.conversion import convert
from gptqfmt.ops.reports import BYTES, GATE, MODULES, WRITE, Phase
from gptqfmt.ops.verify import validate
from tests.support import CKPT

SINGLE = CKPT / "b4-asym-noact-gptq-single"     # one shard
SHARDED = CKPT / "b4-asym-noact-gptq-sharded"   # the same modules in 3 shards


@dataclass
class Seen:
    """One phase as a callback heard it."""
    callback: str
    name: str
    unit: str
    total: int
    updates: list[int] = field(default_factory=list)


class Recorder:
    """Progress callbacks writing one shared log, so that the order across them shows."""

    def __init__(self):
        self.log: list[tuple[str, int, int, Phase | None]] = []

    def on(self, callback: str):
        def record(done: int, total: int, phase: Phase | None = None) -> None:
            self.log.append((callback, done, total, phase))
        return record

    def phases(self) -> list[Seen]:
        """The phases in the order they started, each with its updates; fails on an update
        that comes before its callback started a phase, or that names another total."""
        out: list[Seen] = []
        current: dict[str, Seen] = {}
        for callback, done, total, phase in self.log:
            if phase is not None:
                assert done == 0, f"{phase.name} starts at {done}, not 0"
                current[callback] = Seen(callback, phase.name, phase.unit, total)
                out.append(current[callback])
                continue
            assert callback in current, f"an update on {callback} before any phase started"
            seen = current[callback]
            assert total == seen.total, f"{seen.name}: total {total}, started with {seen.total}"
            seen.updates.append(done)
        for seen in out:
            assert sum(seen.updates) == seen.total, (seen.name, seen.updates, seen.total)
        return out


def header(path: Path) -> tuple[int, dict]:
    """(where the data start, the header) of a safetensors file, read here byte by byte."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    doc = json.loads(raw[8:8 + n])
    doc.pop("__metadata__", None)
    return 8 + n, doc


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def module_count(path: Path) -> int:
    """The quantized modules of a checkpoint: its qweight tensors."""
    return sum(n.endswith(".qweight") for p in shards(path) for n in header(p)[1])


def qzeros_ranges(shard: Path) -> list[tuple[int, int]]:
    start, doc = header(shard)
    return sorted((start + t["data_offsets"][0], start + t["data_offsets"][1])
                  for name, t in doc.items() if name.endswith(".qzeros"))


def expected_writes(shard: Path) -> list[int]:
    """The stretches of a shard's copy as write.py writes it, in bytes: each stretch of the
    source up to a qzeros tensor (the header in the first), each qzeros tensor, the stretch
    after the last."""
    out, pos = [], 0
    for begin, end in qzeros_ranges(shard):
        out += [begin - pos, end - begin]
        pos = end
    out.append(shard.stat().st_size - pos)
    return [n for n in out if n]


def converted(src: Path, dst: Path, **options) -> list[Seen]:
    rec = Recorder()
    report = convert(src, dst, to="gptq_v2", allow_lossy=True, progress=rec.on("progress"),
                     on_module=rec.on("on_module"), **options)
    assert report.written
    return rec.phases()


def named(seen: list[Seen]) -> list[tuple[str, str, str]]:
    """(callback, name, unit) of each phase, without the wait for fsyncs (there only when a
    shard is still on its way to the disk)."""
    return [(s.callback, s.name, s.unit) for s in seen if s.name != "sync"]


@pytest.mark.parametrize("src", [SINGLE, SHARDED])
def test_convert_reports_every_phase_and_writes_byte_by_byte(src, tmp_path):
    dst = tmp_path / "out"
    seen = converted(src, dst)
    assert named(seen) == [("progress", "detect", MODULES), ("progress", "check", MODULES),
                           ("progress", "plan", MODULES), ("progress", "write", BYTES),
                           ("on_module", "verify", MODULES)]
    by_name = {s.name: s for s in seen}
    modules = module_count(src)
    for name in ("detect", "check", "plan", "verify"):
        assert by_name[name].total == modules and by_name[name].updates == [1] * modules
    write = by_name["write"]
    # the total is the output's bytes, and the count reaches the end of every stretch of the
    # copy and of every qzeros tensor as it is written (a kernel copy cut short adds steps)
    assert write.total == sum(p.stat().st_size for p in shards(dst))
    assert write.total == sum(p.stat().st_size for p in shards(src))
    steps = [n for p in shards(src) for n in expected_writes(p)]
    assert set(accumulate(steps)) <= set(accumulate(write.updates))
    assert len(write.updates) > 2 * len(shards(src))   # many updates per shard, not one


def test_the_write_phase_moves_with_the_bytes_of_worker_processes_too(tmp_path):
    seen = converted(SHARDED, tmp_path / "out", jobs=2)
    [write] = [s for s in seen if s.name == "write"]
    assert write.total == sum(p.stat().st_size for p in shards(tmp_path / "out"))
    # the workers' counts, relayed as they come, in whatever order the shards interleave
    steps = [n for p in shards(SHARDED) for n in expected_writes(p)]
    assert len(write.updates) >= len(steps) > 2 * len(shards(SHARDED))


def test_in_place_reports_its_proof_then_the_qzeros_it_rewrites(tmp_path):
    src = tmp_path / "m"
    shutil.copytree(SINGLE, src)
    before = {b: src.joinpath("model.safetensors").read_bytes()[b:e]
              for b, e in qzeros_ranges(src / "model.safetensors")}
    rec = Recorder()
    convert(src, None, to="gptq_v2", allow_lossy=True, in_place=True,
            progress=rec.on("progress"), on_module=rec.on("on_module"))
    seen = rec.phases()
    assert named(seen) == [("progress", "detect", MODULES), ("progress", "check", MODULES),
                           ("progress", "plan", MODULES), ("on_module", "verify", MODULES),
                           ("progress", "write", BYTES)]
    after = src.joinpath("model.safetensors").read_bytes()
    rewritten = [e - b for b, e in qzeros_ranges(src / "model.safetensors")
                 if after[b:e] != before[b]]
    [write] = [s for s in seen if s.name == "write"]
    assert rewritten and write.total == sum(rewritten) and write.updates == rewritten
    # then the shard, as its fsync returns
    [sync] = [s for s in seen if s.name == "sync"]
    assert sync.total == len(after) and sync.updates == [len(after)]


def test_between_formats_the_write_phase_counts_the_output_and_the_gate_its_phases(tmp_path):
    rec = Recorder()
    dst = tmp_path / "ct"
    convert(CKPT / "b4-asym-noact-gptq_v2-sharded", dst, to="compressed-tensors",
            progress=rec.on("progress"), on_module=rec.on("on_module"))
    seen = rec.phases()
    assert [(s.callback, s.name) for s in seen if s.name != "sync"] == [
        ("progress", "detect"), ("progress", "check"), ("progress", "plan"),
        ("progress", "write"), ("on_module", "check"), ("on_module", "verify"),
        ("on_module", "compare")]
    write = next(s for s in seen if s.name == "write")
    assert write.total == sum(p.stat().st_size for p in shards(dst))
    assert len(write.updates) > 2 * len(shards(dst))
    # compare: the bytes of the source's tensors outside the modules that the output holds
    outside = {n: t["data_offsets"][1] - t["data_offsets"][0]
               for p in shards(CKPT / "b4-asym-noact-gptq_v2-sharded")
               for n, t in header(p)[1].items()
               if not n.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    kept = {n for p in shards(dst) for n in header(p)[1]}
    compare = next(s for s in seen if s.name == "compare")
    assert outside and compare.total == sum(v for n, v in outside.items() if n in kept)


def test_verify_reads_every_qweight_byte_then_checks_every_module_then_judges_runtimes():
    rec = Recorder()
    report = validate(SHARDED, progress=rec.on("progress"))
    seen = rec.phases()
    assert [(s.name, s.unit) for s in seen] == [("verify", BYTES), ("check", MODULES),
                                                ("runtimes", MODULES)]
    qweight = sum(t["data_offsets"][1] - t["data_offsets"][0] for p in shards(SHARDED)
                  for n, t in header(p)[1].items() if n.endswith(".qweight"))
    modules = module_count(SHARDED)
    assert seen[0].total == qweight == report.qweight_bytes and len(seen[0].updates) == modules
    assert seen[1].total == modules and seen[1].updates == [1] * modules
    # each runtime's reading of every module, a phase of its own (a second on a 70B model)
    assert seen[2].total == modules and seen[2].updates == [1] * modules


def test_doctor_reports_verify_the_plan_the_fix_and_verify_again_each_from_its_start(tmp_path):
    """Humming reads gptq data one off: the fix is convert --in-place, between two verifies
    on one callback; each phase starts afresh (a second verify does not run past its total)."""
    from gptqfmt.doctor import doctor

    work = tmp_path / "ck"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", work)
    rec = Recorder()
    diagnosis = doctor(work, "vllm-humming", fix=True, in_place=True,
                       progress=rec.on("progress"))
    assert diagnosis.fixed is not None and diagnosis.fixed.ok
    seen = rec.phases()   # every update inside a started phase, each adding up to its total
    names = [s.name for s in seen]
    verify = ["verify", "check", "runtimes"]
    assert names[:3] == verify and names[-3:] == verify
    assert ["detect", "check", "plan", "verify", "write"] == [
        n for n in names[names.index("detect"):-3] if n != "sync"]
    assert seen[0].total == seen[-3].total   # the same qweight bytes, read twice


# -- the bars -------------------------------------------------------------------------------
class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """tqdm's clock, moved by the test."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def terminal(monkeypatch) -> tuple[Terminal, Clock]:
    """stderr a terminal, and tqdm's clock the test's. Called in the test itself: pytest sets
    its own stderr again between a fixture and the test."""
    err = Terminal()
    clock = Clock()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(tqdm_std, "time", clock)
    monkeypatch.setattr(tqdm_package.tqdm, "monitor_interval", 0)  # no thread redrawing
    return err, clock


def last_line(err: io.StringIO) -> str:
    """The bar as it was last drawn."""
    return [s for s in err.getvalue().split("\r") if s.strip()][-1]


def test_a_bar_appears_when_its_work_starts_and_measures_from_there(monkeypatch):
    err, clock = terminal(monkeypatch)
    with Progress(True, unit="module", desc="verify", position=0) as bar:
        clock.now += 60   # set-up before the work (opening, writing): no bar yet
        assert err.getvalue() == ""
        bar.update(0, 448, GATE)
        clock.now += 1
        bar.update(1, 448)
        # one module in the one second since the phase started: 447 s to go, not 447 minutes
        assert "1/448 [00:01<07:27" in last_line(err) and last_line(err).startswith("verify:")


def test_a_new_phase_resets_the_bar_its_unit_and_its_clock(monkeypatch):
    err, clock = terminal(monkeypatch)
    with Progress(True, unit="B", desc="write") as bar:
        bar.update(0, 7, Phase("plan", MODULES))
        for _ in range(7):
            clock.now += 10
            bar.update(1, 7)
        assert "7/7 [01:10<00:00" in last_line(err) and last_line(err).startswith("plan:")
        bar.update(0, 38_300, WRITE)
        clock.now += 1
        bar.update(11_600, 38_300)
        line = last_line(err)
        assert line.startswith("write:") and "11.6kB/38.3kB [00:01<00:02, 11.6kB/s]" in line


def test_a_phase_done_shows_as_done(monkeypatch):
    err, clock = terminal(monkeypatch)
    with Progress(True, unit="B", desc="write") as bar:
        bar.update(0, 3000, WRITE)
        for n in (2000, 999, 1):   # the last step too small for a redraw of its own
            clock.now += 1
            bar.update(n, 3000)
        assert "100%" in last_line(err) and "3.00kB/3.00kB" in last_line(err)


@pytest.mark.parametrize("enabled,tty", [(False, True), (True, False)])
def test_no_bar_when_quiet_or_not_a_terminal(monkeypatch, enabled, tty):
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress(enabled, unit="B", desc="write") as bar:
        bar.update(0, 10, WRITE)
        bar.update(10, 10)
    assert err.getvalue() == ""


def test_a_two_argument_callback_of_a_library_caller_still_works():
    """`progress(done, total)` as library callers wrote it before phases had names: each phase
    starts with (0, total), and the updates of each add up to it."""
    calls = []
    validate(SHARDED, progress=lambda done, total: calls.append((done, total)))
    starts = [i for i, (done, _) in enumerate(calls) if done == 0]
    assert len(starts) == 3 and starts[0] == 0
    for a, b in zip(starts, starts[1:] + [len(calls)]):
        assert sum(d for d, _ in calls[a:b]) == calls[a][1]
