"""Who reads the modules during detection: forked worker processes for a large checkpoint,
threads otherwise. The answer must not depend on it, the workers must really be other
processes, and a signal or a dying worker must end inspect the way any error does."""
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace

import pytest

from gptqfmt.detection import read as evidence
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from tests.support import ROOT, load_generator

WM = load_generator("make_whole_models")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("GPTQFMT_FAULT", None)
UNPATCHED_READ = evidence._read_one


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """210 modules (30 layers x 7), 8-bit asymmetric act-order gptq: inspect samples them."""
    d = tmp_path_factory.mktemp("workers") / "m"
    WM.build_whole_model(WM.WholeSpec(bits=8, act_order=True), d)
    return d


def everything(det):
    return det.to_json(), [m.to_json() for m in det.modules]


def read_noting_the_process(work, i, sample, known):
    """_read_one, with the reading process's id as a last evidence line (module level: the
    process pool pickles it by name)."""
    v = UNPATCHED_READ(work, i, sample, known)
    return replace(v, evidence=v.evidence + [f"pid {os.getpid()}"])


def test_processes_and_threads_give_the_same_answer(whole, monkeypatch):
    assert evidence._forks_safely() == sys.platform.startswith("linux")
    threads = everything(evidence.detect_checkpoint(open_checkpoint(whole), jobs=1))
    procs = everything(evidence.detect_checkpoint(open_checkpoint(whole), jobs=2))
    assert threads == procs
    assert threads[0]["detected"] == "gptq"
    monkeypatch.setattr(evidence, "PROCESS_MIN_MODULES", 10**6)  # two threads, not processes
    assert everything(evidence.detect_checkpoint(open_checkpoint(whole), jobs=2)) == threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks only on Linux")
def test_a_large_checkpoint_is_read_in_other_processes(whole, monkeypatch):
    monkeypatch.setattr(evidence, "_read_one", read_noting_the_process)
    det = evidence.detect_checkpoint(open_checkpoint(whole), jobs=2)
    pids = {e for v in det.modules for e in v.evidence if e.startswith("pid ")}
    assert len(det.modules) == 210 and pids and f"pid {os.getpid()}" not in pids


def test_no_fork_beside_another_thread():
    """A lock another thread holds at the fork would stay held in the child: with a second
    thread running, detection uses threads."""
    release = threading.Event()
    t = threading.Thread(target=release.wait)
    t.start()
    try:
        assert not evidence._forks_safely()
    finally:
        release.set()
        t.join()


def inspect_cli(path, *args, fault=None):
    env = ENV if fault is None else {**ENV, "GPTQFMT_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "gptqfmt", "inspect", str(path), *args],
                          env=env, capture_output=True, text=True)


@pytest.mark.skipif(evidence.cpus() < 2 or not sys.platform.startswith("linux"),
                    reason="inspect forks workers only with 2 CPUs or more, on Linux")
@pytest.mark.parametrize("sig, fmt", [(signal.SIGINT, "text"), (signal.SIGTERM, "json")],
                         ids=["SIGINT-text", "SIGTERM-json"])
def test_a_signal_while_workers_run_ends_inspect_cleanly(whole, sig, fmt):
    """The signal arrives in the parent after the first round of reads, its workers alive: one
    line (or one JSON document), exit 128 + n, no worker traceback."""
    r = inspect_cli(whole, "--format", fmt, fault=f"detect-round:0:{sig.name}")
    assert r.returncode == 128 + sig
    if fmt == "json":
        assert json.loads(r.stdout)["error"] == f"interrupted by {sig.name}"
        assert r.stderr == ""
    else:
        assert r.stdout == "" and r.stderr == f"gptqfmt: error: interrupted by {sig.name}\n"


def kill_self(work, i, sample, known):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks only on Linux")
def test_a_worker_that_dies_is_an_error_that_says_so(whole, monkeypatch):
    from gptqfmt.errors import GptqfmtError
    monkeypatch.setattr(evidence, "_read_one", kill_self)
    with pytest.raises(GptqfmtError, match=r"m: a worker process reading its modules ended "
                       r"abruptly \(killed, or out of memory\?\); run again"):
        evidence.detect_checkpoint(open_checkpoint(whole), jobs=2)
