"""inspect's module checks in a forked child beside the runtimes' pass (ops/inspect.py,
parallel.in_child): the same result, findings in the same order, as in one process, on every
labelled fixture that inspect reads, valid or not."""
import os
import sys

import pytest

from gptqfmt.errors import GptqfmtError
from gptqfmt.ops import inspect as oi
from gptqfmt.parallel import forks_safely
from tests.support import ROOT


def labelled_fixtures():
    for group in ("ckpt", "invalid", "hostile"):
        for d in sorted((ROOT / "fixtures" / group).iterdir()):
            if d.is_dir():
                yield d


def result(path, fork: bool, monkeypatch):
    monkeypatch.setattr(oi, "FORK_MIN_MODULES", 0 if fork else 10**9)
    try:
        r = oi.inspect_checkpoint(path)
    except GptqfmtError as e:
        return ("error", str(e))
    try:
        return r.to_json()
    finally:
        # its survey thread ended: a thread left running would keep the next call from
        # forking (parallel.forks_safely)
        r.source.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks only on Linux")
def test_the_checks_in_a_child_give_what_one_process_gives(monkeypatch):
    """The forked results are the child's own: the checks never ran in this process (a
    child that failed would leave them to it, and the results would match regardless)."""
    forked = []
    in_parent: list[int] = []
    real = oi.in_child

    def noted(fn):
        forked.append(forks_safely())   # a real fork, not the one-process path

        def traced():
            in_parent.append(os.getpid())   # reaches this process's list only when run here
            return fn()
        return real(traced)
    monkeypatch.setattr(oi, "in_child", noted)
    compared = 0
    for d in labelled_fixtures():
        here = result(d, False, monkeypatch)
        before = len(forked)
        there = result(d, True, monkeypatch)
        assert there == here, d.name
        compared += len(forked) > before
    assert compared > 60 and all(forked) and in_parent == []
    with_findings = [d for d in labelled_fixtures()
                     if (r := result(d, True, monkeypatch)) and isinstance(r, dict)
                     and any(f["code"] in ("GQ403", "GQ405", "GQ318", "GQ316", "GQ315")
                             for f in r["findings"])]
    assert with_findings   # module checks that find something were compared too


def test_a_failure_after_opening_closes_the_source(monkeypatch):
    """inspect fails after the checkpoint is open (here: detection): the store it opened is
    closed, which ends its survey thread, so nothing of it is left running."""
    import threading

    from gptqfmt.errors import FindingError
    from gptqfmt.findings import Finding
    from gptqfmt.formats import open as formats_open

    closed = []
    real = formats_open.open_source

    def recorded(*a, **k):
        src = real(*a, **k)
        close = src.store.close
        src.store.close = lambda: (closed.append(src.store.root), close())
        return src

    def fails(*a, **k):
        raise FindingError(Finding("GQ301", "detection failed"))
    monkeypatch.setattr(oi, "open_source", recorded)
    monkeypatch.setattr(oi, "detect_checkpoint", fails)
    path = ROOT / "fixtures" / "ckpt" / "b4-asym-noact-gptq-sharded"
    with pytest.raises(FindingError):
        oi.inspect_checkpoint(path)
    assert closed == [path]
    assert not [t for t in threading.enumerate() if t.name == "gptqfmt-survey"]


def test_no_survey_thread_outlives_the_call(monkeypatch):
    """inspect returns only once its survey's thread has ended: here the thread, its passes
    read, is held until the survey is told to end or to finish (close, join). A thread left
    running would keep a later call in this process from forking (parallel.forks_safely)."""
    import threading

    from gptqfmt.safetensors_io.survey import Survey

    release = threading.Event()
    started = []
    real_run, real_close, real_join = Survey._run, Survey.close, Survey.join

    def held(self):
        started.append(self)
        real_run(self)
        release.wait()

    def close(self):
        release.set()
        real_close(self)

    def join(self):
        release.set()
        real_join(self)
    monkeypatch.setattr(Survey, "_run", held)
    monkeypatch.setattr(Survey, "close", close)
    monkeypatch.setattr(Survey, "join", join)
    try:
        r = oi.inspect_checkpoint(ROOT / "fixtures" / "ckpt" / "b4-asym-noact-gptq-sharded")
        alive = [t for t in threading.enumerate() if t.name == "gptqfmt-survey"]
    finally:
        release.set()   # a thread left held would hang close(), not fail the test
    r.source.close()
    assert started and alive == []


def test_a_pass_nothing_asks_for_is_not_waited_for(monkeypatch):
    """A survey pass that inspect's reads never asked for is stopped, not read to its end:
    here every pass after the first is held until the survey is stopped (close), and a wait
    for the survey to finish (join) is recorded, then let through rather than hung."""
    import threading

    from gptqfmt.safetensors_io.survey import Survey

    stopped = threading.Event()
    joined = []
    real_read, real_close, real_join = Survey._read, Survey.close, Survey.join

    def read(self, files, p):
        if p > 0:
            stopped.wait()
        return real_read(self, files, p)

    def close(self):
        stopped.set()
        real_close(self)

    def join(self):
        joined.append(stopped.is_set())
        stopped.set()
        real_join(self)

    # inspect of a GPTQ checkpoint asks its passes through groups / zero_heads: answered
    # here without the survey, so no pass after the first is ever asked for
    monkeypatch.setattr(Survey, "_read", read)
    monkeypatch.setattr(Survey, "close", close)
    monkeypatch.setattr(Survey, "join", join)
    monkeypatch.setattr(Survey, "groups", lambda self, tensors: ({}, list(tensors)))
    monkeypatch.setattr(Survey, "zero_heads", lambda self, tensors, n: (set(), list(tensors)))
    try:
        r = oi.inspect_checkpoint(ROOT / "fixtures" / "ckpt" / "b4-asym-noact-gptq-sharded")
    finally:
        stopped.set()
    r.source.close()
    assert False not in joined   # never a wait on a pass that was still held
    assert r.source.store.survey is None
