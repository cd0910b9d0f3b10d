"""Detection's reading of a checkpoint (gptqfmt/detection/read.py): the verdict on every fixture
against the generator's truth and its corruption signatures, inspect's sampling policy, and who
reads the modules: forked worker processes for a large checkpoint, threads otherwise. The answer
must not depend on it, the workers must really be other processes, and a signal or a dying
worker must end inspect the way any error does."""
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace

import pytest

import gptqfmt
from gptqfmt.bits.conventions import GPTQ
from gptqfmt.detection import pool, stats
from gptqfmt.detection import read as evidence
from gptqfmt.detection.decide import ModuleVerdict
from gptqfmt.detection.read import detect_checkpoint, detect_sequential
from gptqfmt.detection.stats import ZeroStats
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from tests.support import CKPT, MANIFEST, ROOT, SPECS, load_generator, load_script

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
    assert evidence.forks_safely() == sys.platform.startswith("linux")
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
        assert not evidence.forks_safely()
    finally:
        release.set()
        t.join()


def inspect_cli(path, *args, fault=None):
    env = ENV if fault is None else {**ENV, "GPTQFMT_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "gptqfmt", "inspect", str(path), *args],
                          env=env, capture_output=True, text=True)


@pytest.mark.faults
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


@pytest.mark.faults
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks only on Linux")
def test_a_worker_that_dies_is_an_error_that_says_so(whole, monkeypatch):
    from gptqfmt.errors import GptqfmtError
    monkeypatch.setattr(evidence, "_read_one", kill_self)
    with pytest.raises(GptqfmtError, match=r"m: a worker process reading its modules ended "
                       r"abruptly \(killed, or out of memory\?\); run again"):
        evidence.detect_checkpoint(open_checkpoint(whole), jobs=2)


PerModule = load_script(ROOT / "scripts" / "calibrate_detection.py").PerModule


def verdict(name, complete=False, inconsistent=False, llr=0.0):
    st = ZeroStats(cells=10, median=0.6, se=1.0)
    return ModuleVerdict(name, "ambiguous", 0.0, [], st, complete=complete,
                         inconsistent=inconsistent, llr=llr)


def test_sampling_rounds_skip_modules_that_fit_neither_and_stop_at_the_budget(monkeypatch):
    from gptqfmt.detection import read as evidence
    monkeypatch.setattr(evidence, "SAMPLE_BYTES", 10)
    monkeypatch.setattr(evidence, "EXTRA_BYTES", 100)
    reads = []

    def read(i, sample):
        reads.append((i, sample))
        return verdict(f"m{i}", inconsistent=(i == 0))
    det = detect_sequential(PerModule(read), 3, lambda i: 10**6, full=False)
    assert det.verdict == "ambiguous"
    first = [(i, 10) for i in range(3)]
    # module 0 fits neither convention: never read again; 1 and 2 grow 4x a round until
    # 100 bytes more are spent (40 + 40 in round 2, 160 for module 1 in round 3, then stop)
    assert reads == first + [(1, 40), (2, 40), (1, 160)]


def test_sampling_stops_when_the_pooled_evidence_decides(monkeypatch):
    from gptqfmt.detection import read as evidence
    monkeypatch.setattr(evidence, "SAMPLE_BYTES", 10)
    reads = []

    def read(i, sample):
        reads.append((i, sample))
        return verdict(f"m{i}", llr=0.0 if sample == 10 else 6.0)
    det = detect_sequential(PerModule(read), 2, lambda i: 10**6, full=False)
    assert det.verdict == GPTQ and reads == [(0, 10), (1, 10), (0, 40), (1, 40)]


def test_inspect_reads_every_modules_chance_when_the_pooled_test_needs_it(monkeypatch):
    """The I/O side of the fill: with the pooled test always on, inspect of AutoGPTQ's fixture
    gives every module its runs by chance, and the verdicts of the eager computation."""
    from gptqfmt.detection.read import detect_checkpoint
    from gptqfmt.formats.gptq.checkpoint import open_checkpoint
    from tests.support import CKPT
    path = CKPT / "autogptq-b4-asym-gptq"
    monkeypatch.setattr(pool, "POOLED_RUNS_MIN", 0)
    lazy = detect_checkpoint(open_checkpoint(path), jobs=1)
    assert all(v.stats.top_runs_expected is not None for v in lazy.modules if v.stats)
    monkeypatch.setattr(stats, "RUNS_CHANCE_MIN", 0)
    eager = detect_checkpoint(open_checkpoint(path), jobs=1)
    assert [v.to_json() for v in lazy.modules] == [v.to_json() for v in eager.modules]


def verdicts_without_stats(det):
    return det.to_json(), [{k: v for k, v in m.to_json().items() if k != "stats"}
                           for m in det.modules]


def test_leaving_out_the_chance_changes_no_verdict(monkeypatch):
    """Every shipped fixture: inspect's lazy runs by chance gives the verdicts, evidence and
    signatures that computing it for every module gives."""
    from gptqfmt.detection.read import detect_checkpoint
    from gptqfmt.formats.gptq.checkpoint import open_checkpoint
    from tests.support import CKPT
    paths = sorted(p for p in CKPT.iterdir() if p.is_dir())
    assert len(paths) > 50
    lazy = {p.name: verdicts_without_stats(detect_checkpoint(open_checkpoint(p), jobs=1))
            for p in paths}
    monkeypatch.setattr(stats, "RUNS_CHANCE_MIN", 0)
    for p in paths:
        eager = verdicts_without_stats(detect_checkpoint(open_checkpoint(p), jobs=1))
        assert lazy[p.name] == eager, p.name


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("full", [False, True], ids=["inspect", "verify"])
def test_verdict_is_the_data_convention(name, full):
    with open_checkpoint(CKPT / name) as ck:
        det = detect_checkpoint(ck, full=full)
    assert det.verdict == SPECS[name].convention, det.evidence
    assert 0.9 <= det.confidence <= 1.0


def signatures(name):
    with open_checkpoint(CKPT / name) as ck:
        return {s for v in detect_checkpoint(ck, full=True).modules for s in v.signatures}


def test_no_corruption_signature_on_clean_writers():
    for name, spec in SPECS.items():
        if spec.writer == "exact":
            assert signatures(name) == set(), name


@pytest.mark.parametrize(("name", "kind"), [
    ("autogptq-b4-asym-gptq", "autogptq_sign_extension"),
    ("autogptq-b2-asym-gptq", "autogptq_sign_extension"),  # structural: runs to the word top
    ("gptqmodel-b4-asym-gptq", "gptqmodel_borrow"),
    ("gptqmodel603-b3-asym-gptq", "gptqmodel_603_3bit"),
    ("gptqmodel603-b3-sym-gptq", "gptqmodel_603_3bit"),
])
def test_corruption_signatures_found(name, kind):
    assert kind in signatures(name)


def test_mislabelled_copies_are_detected_not_believed():
    for name in [n for n in SPECS if n.startswith("mislabelled")]:
        cf = gptqfmt.inspect(CKPT / name).to_json()["checkpoint_format"]
        assert cf["declared"] == MANIFEST[name]["declared"] != SPECS[name].convention
        assert cf["detected"] == SPECS[name].convention
