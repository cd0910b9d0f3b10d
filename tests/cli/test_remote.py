"""inspect --remote, doctor --remote and scan against a local Hub (tests/hubserver.py): the same
answer and document as on a local copy, few bytes and requests, and each network fault as one
line (or one repo's GQ132), never a traceback or a partial verdict."""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from gptqfmt.safetensors_io import remote as remote_io
from tests.hubserver import HubServer, Repo
from tests.support import CKPT, FORMATS, ROOT

pytest.importorskip("huggingface_hub")

SCHEMAS = ROOT / "schemas"
# single file, shards, act-order, 2/3/8 bits, both conventions, a mislabel, another format
FIXTURES = ["b4-sym-noact-gptq_v2-single", "b2-asym-act-gptq-sharded",
            "b3-asym-noact-gptq-single", "b8-sym-act-gptq_v2-sharded",
            "mislabelled-b4-asym-gptq-as-v2", "mislabelled-b4-sym-v2-as-gptq",
            "static-b4-asym-act-gptq_v2"]
# zero points stored exactly: compressed-tensors and AutoAWQ (their readers read otherwise)
OTHER_FORMATS = ["ct-b4-asym-g32", "awq-b4-g32-quant-config-sharded"]
DOCTOR_ONLY = ["b4-asym-noact-gptq_v2-single", "rt-nodescact-b4-sym-gptq"]
TOKEN = "hf_secret"


def where(name: str) -> Path:
    return (FORMATS if name in OTHER_FORMATS else CKPT) / name


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    pickled = tmp_path_factory.mktemp("pickled")
    (pickled / "config.json").write_text('{"model_type": "llama"}')
    (pickled / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not read")
    repos = [Repo("org/pickled", pickled)] + [
        Repo(f"org/{name}", where(name)) for name in FIXTURES + DOCTOR_ONLY + OTHER_FORMATS]
    repos += [Repo("org/private", CKPT / FIXTURES[0], token=TOKEN),
              Repo("org/gated", CKPT / FIXTURES[0], token=TOKEN, gated=True),
              Repo("org/pinned", CKPT / FIXTURES[0],
                   revisions={"v1.0": "ab" * 20, "refs/pr/7": "cd" * 20})]
    with HubServer(repos) as server:
        yield server


@pytest.fixture(autouse=True)
def endpoint(hub, monkeypatch, tmp_path):
    """Every test talks to the local Hub only, with no token of the user's, and counts from
    zero; the retries record their waits instead of sleeping; the Hub raised nothing of its
    own."""
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    waits: list[float] = []
    monkeypatch.setattr(remote_io, "sleep", waits.append)
    hub.reset_counts()
    hub.fail.clear()
    hub.ignore_range = False
    hub.etag_salt.clear()
    hub.redirect_lfs = False
    hub.errors.clear()
    yield waits
    # a failure of the stand-in Hub itself would be answered 500 and retried: never silently
    assert hub.errors == []


def local_copy(name: str, into: Path, monkeypatch) -> str:
    """The fixture copied to NAME under `into` (what `hf download --local-dir NAME` makes),
    the working directory there: the path the remote document's commands name."""
    shutil.copytree(where(name), into / name)
    monkeypatch.chdir(into)
    return name


def ours(hub) -> list:
    """The requests gptqfmt sent (huggingface_hub fetches its agent registry once a day on
    its own, when it builds the headers)."""
    return [q for q in hub.requests if not q.path.startswith("/api/agent")]


def without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


# ---------------------------------------------------------------- the same answer as locally

@pytest.mark.parametrize("name", FIXTURES + OTHER_FORMATS)
def test_inspect_remote_json_is_the_local_one(name, run_cli, tmp_path, monkeypatch, hub):
    local = local_copy(name, tmp_path, monkeypatch)
    r = run_cli("inspect", f"org/{name}", "--remote", "--format", "json")
    here = run_cli("inspect", local, "--format", "json")
    assert r.exit_code == here.exit_code, r.stderr
    doc, ref = json.loads(r.stdout), json.loads(here.stdout)
    jsonschema.validate(doc, schema("inspect"))
    assert without(doc, "path", "remote") == without(ref, "path")
    assert doc["path"] == f"org/{name}"
    rec = doc["remote"]
    assert rec["commit"] == hub.repos[f"org/{name}"].commit
    assert rec["requests"] == len(ours(hub)) and rec["retries"] == 0
    hub.wait_idle()
    assert rec["bytes_read"] == sum(q.body_bytes for q in ours(hub))


@pytest.mark.parametrize("name", ["mislabelled-b4-asym-gptq-as-v2", "b4-sym-noact-gptq_v2-single"])
def test_inspect_remote_text_says_what_was_read(name, run_cli, tmp_path, monkeypatch, hub):
    local = local_copy(name, tmp_path, monkeypatch)
    r = run_cli("inspect", f"org/{name}@main", "--remote")
    here = run_cli("inspect", local)
    lines, ref = r.stdout.splitlines(), here.stdout.splitlines()
    assert lines[0] == ref[0]      # the same verdict
    commit = hub.repos[f"org/{name}"].commit
    remote = next(ln for ln in lines if ln.startswith("remote "))
    assert commit in remote and "read of" in remote
    assert any(f"hf download org/{name} --revision {commit} --local-dir {name}" in ln
               for ln in lines)
    assert lines[-1].startswith(ref[-1].split("; ")[0]) and "read over HTTP" in lines[-1]
    assert (r.exit_code, r.stderr) == (here.exit_code, "")


def test_redirected_files_and_revisions(run_cli, hub, tmp_path, monkeypatch):
    """Files behind the Hub's CDN redirect (LFS) are read as a local copy reads them, by
    branch and by commit; a revision in the document is the one asked for."""
    hub.redirect_lfs = True
    name = FIXTURES[1]
    commit = hub.repos[f"org/{name}"].commit
    here = run_cli("inspect", local_copy(name, tmp_path, monkeypatch), "--format", "json")
    for rev in ("main", commit):
        r = run_cli("inspect", f"org/{name}@{rev}", "--remote", "--format", "json")
        assert r.exit_code == here.exit_code
        doc = json.loads(r.stdout)
        assert without(doc, "path", "remote") == without(json.loads(here.stdout), "path")
        assert (doc["remote"]["revision"], doc["remote"]["commit"]) == (rev, commit)
    assert any(r.path.startswith("/cdn/") for r in hub.requests)
    for rev, commit in (("v1.0", "ab" * 20), ("refs/pr/7", "cd" * 20)):
        r = run_cli("inspect", f"org/pinned@{rev}", "--remote", "--format", "json")
        assert r.exit_code == 0 and json.loads(r.stdout)["remote"]["commit"] == commit


def test_a_header_longer_than_the_first_read(run_cli, tmp_path, monkeypatch, hub):
    """A header past the first read of a shard (64 KiB: a long __metadata__, or thousands of
    tensors) is read in a second request; the answer is still the local one."""
    from safetensors.numpy import load_file

    from gptqfmt.safetensors_io.writer import save_file

    src = CKPT / FIXTURES[0]
    root = tmp_path / "long-header"
    shutil.copytree(src, root)
    save_file(load_file(src / "model.safetensors"), root / "model.safetensors",
              {"format": "pt", "note": "x" * (3 * remote_io.HEAD_GUESS)})
    hub.add(Repo("org/long-header", root))
    r = run_cli("inspect", "org/long-header", "--remote", "--format", "json")
    monkeypatch.chdir(tmp_path)
    here = run_cli("inspect", "long-header", "--format", "json")
    assert without(json.loads(r.stdout), "path", "remote") == without(
        json.loads(here.stdout), "path")
    header_end = 8 + int.from_bytes((root / "model.safetensors").read_bytes()[:8], "little")
    reads = [q.range for q in hub.requests_for("model.safetensors")]
    assert reads[:2] == [f"bytes=0-{remote_io.HEAD_GUESS - 1}",
                         f"bytes={remote_io.HEAD_GUESS}-{header_end - 1}"]


def test_library_call_and_no_litter(hub, monkeypatch, tmp_path):
    import gptqfmt.ops.remote as ops_remote

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = ops_remote.inspect_remote(f"org/{FIXTURES[0]}")
    assert result.ok and result.remote["repo_id"] == f"org/{FIXTURES[0]}"
    assert result.to_json()["remote"] == result.remote
    assert list(tmp_path.iterdir()) == []   # the mirror is gone
    hub.fail.append((".safetensors", 404, {"X-Error-Code": "EntryNotFound"}))
    with pytest.raises(remote_io.RemoteError):
        ops_remote.inspect_remote(f"org/{FIXTURES[0]}")
    assert list(tmp_path.iterdir()) == []   # and gone after an error too


def test_an_interrupt_removes_the_mirror(hub, monkeypatch, tmp_path):
    """Ctrl-C (or a signal the boundary turns into one) while shards are read: the mirror
    goes, and the interrupt reaches the caller."""
    import gptqfmt.ops.remote as ops_remote

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fetch, calls = remote_io.Filler.fetch, []
    running = threading.Condition()
    active = [0]

    def interrupted(self, a, b):
        with running:
            calls.append((a, b))
            active[0] += 1
        try:
            if len(calls) == 4:
                raise KeyboardInterrupt
            return fetch(self, a, b)
        finally:
            with running:
                active[0] -= 1
                running.notify_all()

    monkeypatch.setattr(remote_io.Filler, "fetch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ops_remote.inspect_remote(f"org/{FIXTURES[1]}")
    # the interrupt returns at once and leaves the requests running to end on their own (their
    # bytes land nowhere): they end here, not in the next test's counts
    with running:
        assert running.wait_for(lambda: active[0] == 0, timeout=60)
    assert hub.wait_idle()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- few bytes, few requests

def llama_layer(root: Path, hidden: int = 4096, inter: int = 11008, layers: int = 1) -> int:
    """A Llama-7B-shaped 4-bit, group-128 checkpoint of `layers` layers (one shard each) with
    realistic codes; returns its bytes."""
    from bench.synth import module
    from gptqfmt.safetensors_io.writer import save_file

    rng = np.random.default_rng(0)
    linears = [("self_attn.q_proj", hidden, hidden), ("self_attn.k_proj", hidden, hidden),
               ("self_attn.v_proj", hidden, hidden), ("self_attn.o_proj", hidden, hidden),
               ("mlp.gate_proj", hidden, inter), ("mlp.up_proj", hidden, inter),
               ("mlp.down_proj", inter, hidden)]
    root.mkdir()
    weight_map = {}
    for i in range(layers):
        tensors = {f"model.layers.{i}.{lin}.{role}": arr for lin, k, n in linears
                   for role, arr in module(rng, k, n).items()}
        name = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        save_file(tensors, root / name, {"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    q = {"bits": 4, "group_size": 128, "desc_act": False, "sym": False, "quant_method": "gptq",
         "checkpoint_format": "gptq_v2"}
    (root / "config.json").write_text(json.dumps({"model_type": "llama",
                                                  "quantization_config": q}))
    return sum(p.stat().st_size for p in root.iterdir())


def test_bytes_and_requests_stay_small(run_cli, tmp_path, hub, monkeypatch):
    root = tmp_path / "llama"
    size = llama_layer(root, layers=2)
    hub.add(Repo("org/llama", root))
    r = run_cli("inspect", "org/llama", "--remote", "--format", "json", "--in-flight", "4")
    doc = json.loads(r.stdout)
    monkeypatch.chdir(tmp_path)
    assert without(doc, "path", "remote") == without(
        json.loads(run_cli("inspect", "llama", "--format", "json").stdout), "path")
    rec = doc["remote"]
    assert rec["checkpoint_bytes"] == size
    assert rec["bytes_read"] < 0.02 * size, rec
    # every module's reads coalesced: the API, 2 configs, 2 headers, then about ten requests
    # per module (the sampled rows of the narrow ones are apart)
    assert rec["requests"] <= 5 + 14 * 12, rec
    # a request the client no longer waits for may still be in the server's hands (its status
    # set as it is answered): the counters are final once the server is idle
    assert hub.wait_idle()
    served = [q for q in hub.requests if q.path.endswith(".safetensors")]
    assert all(q.status == 206 for q in served), \
        [(q.method, q.range, q.status) for q in served if q.status != 206]
    assert max(q.body_bytes for q in served) <= remote_io.PIECE


def test_in_flight_bound(hub, tmp_path):
    """No more requests at once than asked, over every shard."""
    from gptqfmt.ops.remote import inspect_remote

    root = tmp_path / "llama"
    llama_layer(root, hidden=1024, inter=2048, layers=3)
    hub.add(Repo("org/small", root))
    inspect_remote("org/small", remote_io.Hub(in_flight=2))
    assert 1 <= hub.max_active <= 2


# ---------------------------------------------------------------- faults

def one_line_error(r, *words: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_timeout(run_cli, hub, monkeypatch, endpoint):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.2")
    hub.hang = ".safetensors"
    try:
        one_line_error(run_cli("inspect", f"org/{FIXTURES[0]}", "--remote"),
                       "no answer", "HF_HUB_DOWNLOAD_TIMEOUT")
    finally:
        hub.hang = None
    assert len(endpoint) == remote_io.RETRIES   # retried with backoff, as huggingface_hub does
    assert endpoint[:3] == [1.0, 2.0, 4.0]


def test_private_repo_needs_the_token(run_cli, monkeypatch):
    line = one_line_error(run_cli("inspect", "org/private", "--remote"),
                          "org/private", "private", "hf auth login")
    assert "401" in line
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert run_cli("inspect", "org/private", "--remote").exit_code == 0


def test_gated_repo(run_cli, monkeypatch):
    one_line_error(run_cli("inspect", "org/gated", "--remote"),
                   "gated", "accept its conditions", "/org/gated", "hf auth login")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert run_cli("inspect", "org/gated", "--remote").exit_code == 0


@pytest.mark.parametrize("arg,words", [
    ("org/nothing", ["no such repo"]),
    (f"org/{FIXTURES[0]}@no-such-branch", ["no such revision"]),
])
def test_not_found(run_cli, arg, words):
    one_line_error(run_cli("inspect", arg, "--remote"), *words)


def test_file_not_found(run_cli, hub):
    hub.fail.append(("config.json", 404, {"X-Error-Code": "EntryNotFound"}))
    one_line_error(run_cli("inspect", f"org/{FIXTURES[0]}", "--remote"),
                   "config.json", "no such file")


def test_rate_limit_is_retried(run_cli, hub, endpoint):
    hub.fail += [(".safetensors", 429, {"Retry-After": "0"})] * 2
    r = run_cli("inspect", f"org/{FIXTURES[0]}", "--remote", "--format", "json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["remote"]["retries"] == 2
    assert endpoint == [0.0, 0.0]      # Retry-After honoured
    hub.fail += [("/api/models/", 429, {})] * (remote_io.RETRIES + 1)
    one_line_error(run_cli("inspect", f"org/{FIXTURES[0]}", "--remote"), "429", "wait")
    assert endpoint[2:] == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_redirect_loop(run_cli, hub):
    name = FIXTURES[0]
    path = f"/org/{name}/resolve/{hub.repos[f'org/{name}'].commit}/model.safetensors"
    hub.fail += [(".safetensors", 302, {"Location": path})] * 30
    one_line_error(run_cli("inspect", f"org/{name}", "--remote"), "model.safetensors",
                   "TooManyRedirects")


def test_server_errors_are_retried(run_cli, hub):
    hub.fail += [("/api/models/", 503, {}), (".safetensors", 502, {})]
    r = run_cli("inspect", f"org/{FIXTURES[0]}", "--remote", "--format", "json")
    assert r.exit_code == 0 and hub.fail == []
    assert json.loads(r.stdout)["remote"]["retries"] == 2
    assert [q.status for q in ours(hub) if q.status >= 500] == [503, 502]


def test_server_ignoring_range_is_refused(run_cli, tmp_path, hub):
    root = tmp_path / "llama"
    size = llama_layer(root, hidden=2048, inter=4096)
    hub.add(Repo("org/norange", root))
    hub.ignore_range = True
    one_line_error(run_cli("inspect", "org/norange", "--remote"),
                   "ignores byte ranges", "--whole-files", "hf download org/norange")
    hub.wait_idle()
    assert hub.bytes_sent < size / 4    # the whole file was not read
    hub.reset_counts()
    r = run_cli("inspect", "org/norange", "--remote", "--whole-files", "--format", "json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["remote"]["bytes_read"] >= size


def test_file_changed_between_reads(hub, tmp_path):
    from gptqfmt.ops.inspect import inspect_checkpoint
    from gptqfmt.ops.remote import mounted

    llama_layer(tmp_path / "llama", hidden=1024, inter=2048, layers=2)
    hub.add(Repo("org/pushed", tmp_path / "llama"))
    with mounted("org/pushed") as mirror:   # the headers are read
        for shard in mirror.shards:
            hub.etag_salt[shard] = "pushed"
        with pytest.raises(remote_io.RemoteError, match="changed while it was read"):
            inspect_checkpoint(mirror.root)


def test_offline_mode_and_bad_arguments(run_cli, monkeypatch):
    one_line_error(run_cli("inspect", "not-a-repo-id", "--remote"), "ORG/NAME")
    one_line_error(run_cli("inspect", "org/x", "--remote", "--download"), "one of them")
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: True)
    one_line_error(run_cli("inspect", f"org/{FIXTURES[0]}", "--remote"), "HF_HUB_OFFLINE")


def test_a_repo_without_safetensors(run_cli):
    r = run_cli("inspect", "org/pickled", "--remote")
    assert r.exit_code == 1
    assert "org/pickled: GQ128 no *.safetensors file at the top level of the repo" in r.stdout
    assert "it holds pytorch_model.bin" in r.stdout and "gptqfmt-remote" not in r.stdout


def test_json_error_document(run_cli):
    r = run_cli("inspect", "org/nothing", "--remote", "--format", "json")
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, schema("inspect"))
    assert "no such repo" in doc["error"]


# ---------------------------------------------------------------- doctor --remote

@pytest.mark.parametrize("name,runtime,steps", [
    ("mislabelled-b4-asym-gptq-as-v2", "transformers", 0),
    ("mislabelled-b4-sym-v2-as-gptq", "vllm", 0),
    ("b4-sym-noact-gptq_v2-single", "vllm", 0),
    ("b2-asym-act-gptq-sharded", "vllm", 0),
    ("static-b4-asym-act-gptq_v2", "vllm", 2),
    ("b4-asym-noact-gptq_v2-single", "vllm", 2),
    ("rt-nodescact-b4-sym-gptq", "sglang", 2),
    ("b3-asym-noact-gptq-single", "transformers", 0),
])
def test_doctor_remote(name, runtime, steps, run_cli, tmp_path, monkeypatch, hub):
    from gptqfmt.doctor import doctor

    local = local_copy(name, tmp_path, monkeypatch)
    r = run_cli("doctor", f"org/{name}", "--remote", "--runtime", runtime, "--format", "json")
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, schema("doctor"))
    # the document of doctor's bounded reads on the local copy, a download step first
    bounded = doctor(local, runtime, bounded=True).to_json()
    plan = doc["plan"]["steps"]
    assert len(plan) == steps   # a plan, and only then, starts with the download
    if steps:
        assert plan[0]["action"] == "download"
        assert plan[0]["command"] == doc["remote"]["download"]
        assert all(f" {name}" in s["command"] for s in plan)
        doc["plan"]["steps"] = plan[1:]
    assert without(doc, "path", "remote", "exit_code") == without(bounded, "path")
    # and the answer of doctor's full reads
    full = json.loads(run_cli("doctor", local, "--runtime", runtime, "--format",
                              "json").stdout)
    assert (doc["answer"], doc["headline"], doc["exit_code"]) == (
        full["answer"], full["headline"], full["exit_code"])
    assert [s["command"] for s in doc["plan"]["steps"]] == [
        s["command"] for s in full["plan"]["steps"]]


def test_doctor_remote_text_and_fix_refused(run_cli):
    name = "rt-nodescact-b4-sym-gptq"
    r = run_cli("doctor", f"org/{name}", "--remote", "--runtime", "vllm")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("FAIL: ") and lines[1].startswith("why: ")
    assert f"  1. hf download org/{name} --revision" in r.stdout
    assert f"gptqfmt fix-label {name}" in r.stdout
    one_line_error(run_cli("doctor", f"org/{name}", "--remote", "--fix", "out"),
                   "--fix writes a local copy")


def test_ci_formats_locate_findings_on_the_hub(run_cli, hub):
    name = "mislabelled-b4-asym-gptq-as-v2"
    page = f"/org/{name}/blob/{hub.repos[f'org/{name}'].commit}/config.json"
    for argv in (["inspect", f"org/{name}", "--remote"],
                 ["doctor", f"org/{name}", "--remote", "--runtime", "transformers"]):
        gh = run_cli(*argv, "--format", "github").stdout.splitlines()
        assert any(ln.startswith("::error file=http") and page in ln for ln in gh), gh
        sarif = json.loads(run_cli(*argv, "--format", "sarif").stdout)
        uris = [loc["physicalLocation"]["artifactLocation"]["uri"]
                for res in sarif["runs"][0]["results"] for loc in res.get("locations", [])]
        assert f"{hub.endpoint}{page}" in uris


# ---------------------------------------------------------------- scan

def test_scan(run_cli, tmp_path, hub):
    names = [f"org/{n}" for n in FIXTURES] + ["org/nothing", "org/private", "org/pickled"]
    listing = tmp_path / "repos.txt"
    listing.write_text("# to audit\n" + "\n".join(names[2:]) + "\n\n")
    r = run_cli("scan", *names[:2], "--file", listing, "--jobs", "3", "--format", "json")
    assert r.exit_code == 1
    hub.wait_idle()
    served = ours(hub)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, schema("scan"))
    assert [x["repo"] for x in doc["repos"]] == names
    by = {x["repo"]: x for x in doc["repos"]}
    assert by["org/nothing"]["status"] == "unreadable"
    assert by["org/nothing"]["findings"][0]["code"] == "GQ132"
    assert by["org/private"]["status"] == "unreadable"
    assert by["org/mislabelled-b4-asym-gptq-as-v2"]["status"] == "fail"
    assert by["org/pickled"]["status"] == "fail"      # read: no checkpoint there
    assert by["org/pickled"]["findings"][0]["code"] == "GQ128"
    assert by[f"org/{FIXTURES[0]}"]["status"] == "ok"
    for n in FIXTURES:   # each the answer inspect --remote gives
        one = json.loads(run_cli("inspect", f"org/{n}", "--remote", "--format", "json").stdout)
        assert by[f"org/{n}"]["status"] == one["status"]
        assert by[f"org/{n}"]["summary"] == one["summary"]
        assert by[f"org/{n}"]["commit"] == hub.repos[f"org/{n}"].commit
    t = doc["totals"]
    assert (t["repos"], t["unreadable"]) == (len(names), 2)
    assert t["ok"] + t["fail"] == len(FIXTURES) + 1
    assert t["requests"] == len(served)   # every request counted, of repos not read too
    # the bodies read (an error's few bytes of JSON are not: its status and headers say it)
    assert t["bytes_read"] == sum(q.body_bytes for q in served if q.status < 400)


def test_scan_text_github_sarif(run_cli, hub):
    names = [f"org/{FIXTURES[0]}", "org/mislabelled-b4-asym-gptq-as-v2", "org/nothing"]
    text = run_cli("scan", *names).stdout.splitlines()
    assert text[0] == "FAIL: 2 of 3 repos: 1 fail inspect, 1 cannot be read"
    assert text[-1].startswith("FAIL: ") and "3 repos: 1 ok, 1 fail, 1 unreadable" in text[-1]
    rows = text[1:-1]
    assert [row.split()[:2] for row in rows] == [["OK", names[0]], ["FAIL", names[1]],
                                                 ["ERROR", names[2]]]
    gh = run_cli("scan", *names, "--format", "github").stdout.splitlines()
    commit = hub.repos[names[1]].commit
    # the config block's key is split off the file (a page that exists) and named first
    assert any(ln.startswith("::error file=") and f"/{names[1]}/blob/{commit}/config.json,"
               "title=GQ401" in ln and "::quantization_config: " in ln for ln in gh), gh
    assert any("GQ132" in ln and "no such repo" in ln for ln in gh)
    sarif = json.loads(run_cli("scan", *names, "--format", "sarif").stdout)
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"]
            for res in sarif["runs"][0]["results"] for loc in res.get("locations", [])
            if "physicalLocation" in loc]
    assert f"{hub.endpoint}/{names[1]}/blob/{commit}/config.json" in uris
    assert {"name": "quantization_config", "fullyQualifiedName": "quantization_config",
            "kind": "object"} in [lg for res in sarif["runs"][0]["results"]
                                  for loc in res.get("locations", [])
                                  for lg in loc.get("logicalLocations", [])]


def test_scan_needs_repos(run_cli):
    r = run_cli("scan")
    assert r.exit_code == 2 and "no repo to scan" in r.stderr
