"""tests/hubserver.py, the local Hugging Face Hub that download tests run against, checked with
huggingface_hub's own client as the oracle: model_info parses its JSON into the right commit and
files, hf_hub_download gets byte-identical files (LFS files served directly or behind the CDN
redirect) and names its cache blobs after the ETags, and hf_raise_for_status maps its error
answers to huggingface_hub's error classes. Raw requests (httpx2) check byte ranges, the
counters and each injected fault."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from tests.hubserver import HubServer, Repo
from tests.support import CKPT, git_blob_id

hh = pytest.importorskip("huggingface_hub", reason="the [hub] extra (in [test])")
httpx2 = pytest.importorskip("httpx2", reason="huggingface_hub's HTTP client")
from huggingface_hub import constants  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import hf_raise_for_status  # noqa: E402

SINGLE = CKPT / "b4-sym-noact-gptq_v2-single"
SHARDED = CKPT / "b2-asym-act-gptq-sharded"
PR = "c" * 40  # the commit refs/pr/1 points at
TOKEN = "hf_test_token"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(data)}\n"
            f"size {len(data)}\n").encode()


def etag_of(data: bytes, name: str) -> str:
    """The ETag the Hub gives a file: its sha256 when stored with LFS, else its git sha1."""
    return sha256(data) if name.endswith(".safetensors") else git_blob_id(data)


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """huggingface_hub's shared client refuses every request in offline mode; its progress
    bars start no tqdm monitor thread, which would outlive the test (and a process with a
    second thread does not fork: detection's tests in the same worker)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    import tqdm
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)


@pytest.fixture
def hub():
    with HubServer([Repo("org/single", SINGLE, revisions={"refs/pr/1": PR}),
                    Repo("org/sharded", SHARDED)]) as server:
        yield server
    assert server.errors == []


def plain_client(timeout=10.0):
    """No proxies from the environment; http only, so no certificates to load."""
    return httpx2.Client(trust_env=False, verify=False, timeout=timeout)


@pytest.fixture
def client():
    with plain_client() as c:
        yield c


def api(hub, token=False):
    return hh.HfApi(endpoint=hub.endpoint, token=token)


def download(hub, repo_id, name, cache, **kw):
    kw.setdefault("token", False)
    return Path(hh.hf_hub_download(repo_id, name, endpoint=hub.endpoint, cache_dir=cache, **kw))


def url(hub, repo_id, name, revision="main"):
    return hh.hf_hub_url(repo_id, name, revision=revision, endpoint=hub.endpoint)


# --- model_info ---------------------------------------------------------------------------------

@pytest.mark.parametrize("repo_id,root", [("org/single", SINGLE), ("org/sharded", SHARDED)])
def test_model_info_gives_the_commit_and_every_file_with_its_size(hub, repo_id, root):
    info = api(hub).model_info(repo_id, files_metadata=True)
    assert (info.id, info.sha) == (repo_id, hub.repos[repo_id].commit)
    assert (info.private, info.gated, info.disabled) == (False, False, False)
    files = {p.name: p.read_bytes() for p in root.iterdir()}
    assert {s.rfilename: s.size for s in info.siblings} == {n: len(b) for n, b in files.items()}
    for s in info.siblings:
        data = files[s.rfilename]
        if s.rfilename.endswith(".safetensors"):
            pointer = lfs_pointer(data)
            assert (s.lfs.sha256, s.lfs.size, s.lfs.pointer_size) == \
                (sha256(data), len(data), len(pointer))
            assert s.blob_id == git_blob_id(pointer)
        else:
            assert s.lfs is None and s.blob_id == git_blob_id(data)
    [req] = hub.requests_for(f"/api/models/{repo_id}")
    assert (req.method, req.status) == ("GET", 200)


def test_the_commit_comes_from_the_repo_id_and_the_files(tmp_path):
    root = tmp_path / "m"
    shutil.copytree(SINGLE, root)
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "x.lock").write_bytes(b"")
    (root / "sub").mkdir()
    (root / "sub" / "a.txt").write_bytes(b"a")
    repo = Repo("org/m", root)
    assert re.fullmatch(r"[0-9a-f]{40}", repo.commit)
    assert list(repo.files) == sorted([p.name for p in SINGLE.iterdir()] + ["sub/a.txt"])
    assert Repo("org/m", root).commit == repo.commit
    assert Repo("org/other", root).commit != repo.commit
    (root / "sub" / "a.txt").write_bytes(b"b")
    assert Repo("org/m", root).commit != repo.commit
    assert repo.revisions == {"main": repo.commit}


def test_a_revision_is_a_branch_a_full_sha_or_a_pr_ref(hub, tmp_path, client):
    repo = hub.repos["org/single"]
    for revision, commit in [(None, repo.commit), ("main", repo.commit),
                             (repo.commit, repo.commit), ("refs/pr/1", PR), (PR, PR)]:
        assert api(hub).model_info("org/single", revision=revision).sha == commit
    assert "/api/models/org/single/revision/refs/pr/1" in [r.path for r in hub.requests]
    # hf_hub_url quotes the revision (refs%2Fpr%2F1); an unquoted one is found too
    path = download(hub, "org/single", "config.json", tmp_path, revision="refs/pr/1")
    assert path.read_bytes() == (SINGLE / "config.json").read_bytes()
    assert path.parent.name == PR
    assert "%2F" in url(hub, "org/single", "config.json", "refs/pr/1")
    r = client.get(f"{hub.endpoint}/org/single/resolve/refs/pr/1/config.json")
    assert (r.status_code, r.headers["X-Repo-Commit"]) == (200, PR)


def test_a_repo_added_while_running_is_served(hub):
    with pytest.raises(RepositoryNotFoundError):
        api(hub).model_info("org/late")
    hub.add(Repo("org/late", SHARDED))
    assert api(hub).model_info("org/late").sha == hub.repos["org/late"].commit


# --- downloads ----------------------------------------------------------------------------------

@pytest.mark.parametrize("redirect_lfs", [False, True])
def test_hf_hub_download_gets_the_same_bytes(hub, tmp_path, redirect_lfs):
    hub.redirect_lfs = redirect_lfs
    for repo_id, root, name in [("org/single", SINGLE, "config.json"),
                                ("org/single", SINGLE, "model.safetensors"),
                                ("org/sharded", SHARDED, "model-00002-of-00003.safetensors")]:
        hub.reset_counts()
        data = (root / name).read_bytes()
        path = download(hub, repo_id, name, tmp_path)
        assert path.read_bytes() == data
        assert path.parent.name == hub.repos[repo_id].commit
        assert path.resolve().name == etag_of(data, name)   # the blob is named by its ETag
        steps = [(r.method, r.path.rsplit("/", 1)[-1], r.status, r.body_bytes)
                 for r in hub.requests]
        if redirect_lfs and name.endswith(".safetensors"):
            assert steps == [("HEAD", name, 302, 0), ("HEAD", sha256(data), 200, 0),
                             ("GET", sha256(data), 200, len(data))]
        else:
            assert steps == [("HEAD", name, 200, 0), ("GET", name, 200, len(data))]
        assert hub.bytes_sent == len(data)
        # in the cache now: a second call only asks for the metadata
        hub.reset_counts()
        assert download(hub, repo_id, name, tmp_path) == path
        assert [r.method for r in hub.requests] == ["HEAD"] * (2 if steps[0][2] == 302 else 1)
        assert hub.bytes_sent == 0


def test_the_headers_are_the_hubs(hub, client):
    data = (SINGLE / "model.safetensors").read_bytes()
    commit = hub.repos["org/single"].commit
    r = client.head(url(hub, "org/single", "model.safetensors"))
    assert r.status_code == 200 and r.content == b""
    assert r.headers["X-Repo-Commit"] == commit
    assert r.headers["ETag"] == r.headers["X-Linked-Etag"] == f'"{sha256(data)}"'
    assert r.headers["X-Linked-Size"] == r.headers["Content-Length"] == str(len(data))
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["Content-Type"] == "application/octet-stream"
    config = (SINGLE / "config.json").read_bytes()
    r = client.head(url(hub, "org/single", "config.json"))
    assert r.headers["ETag"] == f'"{git_blob_id(config)}"'
    assert r.headers["Content-Length"] == str(len(config))
    assert "X-Linked-Etag" not in r.headers and "X-Linked-Size" not in r.headers
    for r in (client.get(url(hub, "org/single", "config.json")),
              client.get(f"{hub.endpoint}/api/models/org/single")):
        assert r.headers["Content-Length"] == str(len(r.content))
    # huggingface_hub downloads over plain HTTP: nothing says Xet
    hub.redirect_lfs = True
    r = client.head(url(hub, "org/single", "model.safetensors"))
    assert not [k for k in r.headers if k.lower().startswith("x-xet")]
    assert not [r for r in hub.requests if r.status == 0]


def test_an_lfs_file_behind_the_redirect(hub, client):
    data = (SINGLE / "model.safetensors").read_bytes()
    hub.redirect_lfs = True
    r = client.get(url(hub, "org/single", "model.safetensors"))
    assert r.status_code == 302 and r.content == b""
    assert r.headers["Location"].startswith(f"/cdn/{sha256(data)}")
    assert r.headers["X-Linked-Etag"] == f'"{sha256(data)}"'
    assert r.headers["X-Linked-Size"] == str(len(data))
    assert r.headers["X-Repo-Commit"] == hub.repos["org/single"].commit
    r = client.get(url(hub, "org/single", "model.safetensors"), headers={"Range": "bytes=8-15"},
                   follow_redirects=True)
    assert (r.status_code, r.content) == (206, data[8:16])
    assert r.url.path == f"/cdn/{sha256(data)}"
    assert [q.status for q in hub.requests] == [302, 302, 206]
    assert client.get(f"{hub.endpoint}/cdn/{'0' * 64}").status_code == 404
    # a file that is not LFS is never redirected
    assert client.get(url(hub, "org/single", "config.json")).status_code == 200


# --- ranges and counters ------------------------------------------------------------------------

def test_a_range_gets_206_with_its_bytes(hub, client):
    data = (SINGLE / "model.safetensors").read_bytes()
    size = len(data)
    u = url(hub, "org/single", "model.safetensors")
    for header, first, last in [("bytes=10-19", 10, 19), ("bytes=100-", 100, size - 1),
                                ("bytes=-7", size - 7, size - 1), (f"bytes={size - 1}-", size - 1,
                                                                   size - 1),
                                ("bytes=0-999999", 0, size - 1), ("bytes=-999999", 0, size - 1)]:
        r = client.get(u, headers={"Range": header})
        assert r.status_code == 206, header
        assert r.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
        assert r.headers["Content-Length"] == str(last - first + 1)
        assert r.content == data[first:last + 1]
    for header in (f"bytes={size}-", f"bytes={size}-{size + 9}", "bytes=-0"):
        r = client.get(u, headers={"Range": header})
        assert r.status_code == 416, header
        assert (r.headers["Content-Range"], r.content) == (f"bytes */{size}", b"")
        with pytest.raises(HfHubHTTPError) as e:
            hf_raise_for_status(r)
        assert e.value.response.status_code == 416
    # a range the server may ignore (several, or malformed): the whole file
    for header in ("bytes=0-1,5-6", "bytes=9-3", "items=0-1"):
        r = client.get(u, headers={"Range": header})
        assert (r.status_code, r.content) == (200, data), header
        assert "Content-Range" not in r.headers


def test_the_counters_count_what_was_written(hub, client):
    config = (SINGLE / "config.json").read_bytes()
    u = url(hub, "org/single", "config.json")
    client.head(u)
    client.get(u)
    client.get(u, headers={"Range": "bytes=-10"})
    client.get(u, headers={"Range": f"bytes={len(config)}-"})
    path = "/org/single/resolve/main/config.json"
    assert [(r.method, r.path, r.range, r.status, r.body_bytes) for r in hub.requests] == [
        ("HEAD", path, None, 200, 0),
        ("GET", path, None, 200, len(config)),
        ("GET", path, "bytes=-10", 206, 10),
        ("GET", path, f"bytes={len(config)}-", 416, 0)]
    assert hub.bytes_sent == len(config) + 10
    assert hub.requests_for("config.json") == hub.requests
    assert hub.requests_for("/quantize_config.json") == []
    info = client.get(f"{hub.endpoint}/api/models/org/single")
    assert hub.bytes_sent == len(config) + 10 + len(info.content)
    hub.reset_counts()
    assert (hub.requests, hub.bytes_sent) == ([], 0)


# --- faults -------------------------------------------------------------------------------------

def test_a_queued_fault_is_answered_once(hub, client):
    data = (SINGLE / "model.safetensors").read_bytes()
    u = url(hub, "org/single", "model.safetensors")
    hub.fail = [(".safetensors", 429, {"Retry-After": "0"}), ("", 503, {})]
    r = client.get(url(hub, "org/single", "config.json"))   # only "" matches
    assert (r.status_code, r.content) == (503, b"")
    assert hub.fail == [(".safetensors", 429, {"Retry-After": "0"})]
    r = client.get(u)
    assert (r.status_code, r.content, r.headers["Content-Length"]) == (429, b"", "0")
    assert r.headers["Retry-After"] == "0"
    with pytest.raises(HfHubHTTPError) as e:
        hf_raise_for_status(r)
    assert type(e.value) is HfHubHTTPError and e.value.response.status_code == 429
    r = client.get(u)
    assert (r.status_code, r.content) == (200, data)
    assert hub.fail == []
    assert [q.status for q in hub.requests] == [503, 429, 200]


def test_hf_hub_download_gets_over_a_429(hub, tmp_path):
    """Its first HEAD makes no retry; on a 429 it asks once more, at once, and downloads."""
    hub.fail = [("model.safetensors", 429, {"Retry-After": "0"})]
    data = (SINGLE / "model.safetensors").read_bytes()
    assert download(hub, "org/single", "model.safetensors", tmp_path).read_bytes() == data
    assert [(r.method, r.status) for r in hub.requests] == [("HEAD", 429), ("HEAD", 200),
                                                            ("GET", 200)]


def test_ignore_range_answers_the_whole_file(hub, client):
    data = (SINGLE / "model.safetensors").read_bytes()
    hub.ignore_range = True
    r = client.get(url(hub, "org/single", "model.safetensors"), headers={"Range": "bytes=0-99"})
    assert (r.status_code, r.content) == (200, data)
    assert "Content-Range" not in r.headers
    assert [(q.range, q.status, q.body_bytes) for q in hub.requests] == \
        [("bytes=0-99", 200, len(data))]


def test_a_client_that_leaves_early_is_sent_only_part(hub, tmp_path):
    """32 MiB: more than the socket buffers on both sides hold, so the server's writes fail
    once the client has closed, and the counters stop there."""
    root = tmp_path / "big"
    root.mkdir()
    size = 32 << 20
    with open(root / "weights.bin", "wb") as f:
        f.truncate(size)
    hub.add(Repo("org/big", root))
    hub.ignore_range = True
    with plain_client() as c:
        with c.stream("GET", url(hub, "org/big", "weights.bin"),
                      headers={"Range": "bytes=0-999"}) as r:
            assert r.status_code == 200 and r.headers["Content-Length"] == str(size)
            got = b""
            for chunk in r.iter_bytes():
                got += chunk
                if len(got) >= 1000:
                    break
    assert hub.wait_idle()
    [req] = hub.requests
    assert req.status == 200
    assert 1000 <= req.body_bytes < size
    assert hub.bytes_sent == req.body_bytes


def test_a_hung_request_times_out_and_the_others_are_answered(hub, client):
    hub.hang = "/main/config.json"
    with plain_client(timeout=0.2) as c:
        with pytest.raises(httpx2.ReadTimeout):
            c.get(url(hub, "org/single", "config.json"))
    r = client.get(url(hub, "org/single", "quantize_config.json"))
    assert r.content == (SINGLE / "quantize_config.json").read_bytes()
    assert hub.wait_idle()   # the hung one is not busy
    [hung] = hub.requests_for("/main/config.json")
    assert (hung.status, hung.body_bytes) == (0, 0)


def test_exit_releases_hung_requests_and_kept_alive_connections():
    before = set(threading.enumerate())
    with HubServer([Repo("org/single", SINGLE)]) as server:
        server.hang = "config.json"
        with plain_client(timeout=0.2) as c:
            with pytest.raises(httpx2.ReadTimeout):
                c.get(url(server, "org/single", "config.json"))
        kept = plain_client()   # its connection stays open
        assert kept.get(url(server, "org/single", "model.safetensors")).status_code == 200
    try:
        assert [t for t in threading.enumerate() if t not in before] == []
        assert server.errors == []
    finally:
        kept.close()


@pytest.mark.parametrize("redirect_lfs", [False, True])
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_salted_etag_is_a_changed_file(hub, tmp_path, name, redirect_lfs):
    hub.redirect_lfs = redirect_lfs
    data = (SINGLE / name).read_bytes()
    u = url(hub, "org/single", name)
    meta = hh.get_hf_file_metadata(u, token=False)
    assert (meta.etag, meta.size) == (etag_of(data, name), len(data))
    first = download(hub, "org/single", name, tmp_path)
    hub.etag_salt[name] = "v2"
    salted = hh.get_hf_file_metadata(u, token=False)
    assert salted.etag != meta.etag and len(salted.etag) == len(meta.etag)
    assert (salted.commit_hash, salted.size) == (meta.commit_hash, meta.size)
    # huggingface_hub takes it for another file: it downloads it again, into another blob
    for p in first.parent.iterdir():
        p.unlink()
    hub.reset_counts()
    second = download(hub, "org/single", name, tmp_path)
    assert second.resolve().name == salted.etag
    assert second.read_bytes() == data
    assert hub.bytes_sent == len(data)
    del hub.etag_salt[name]
    assert hh.get_hf_file_metadata(u, token=False).etag == meta.etag


# --- access -------------------------------------------------------------------------------------

def test_a_private_repo_needs_its_token(hub, client, tmp_path):
    hub.add(Repo("org/private", SINGLE, token=TOKEN))
    for path in ("/api/models/org/private", "/org/private/resolve/main/config.json"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = client.get(hub.endpoint + path, headers=headers)
            assert (r.status_code, r.headers["X-Error-Code"]) == (401, "RepoNotFound")
            with pytest.raises(RepositoryNotFoundError) as e:
                hf_raise_for_status(r)
            assert type(e.value) is RepositoryNotFoundError
        r = client.get(hub.endpoint + path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
    with pytest.raises(RepositoryNotFoundError):
        api(hub).model_info("org/private")
    info = api(hub, token=TOKEN).model_info("org/private", files_metadata=True)
    assert (info.private, info.sha) == (True, hub.repos["org/private"].commit)
    with pytest.raises(RepositoryNotFoundError):
        download(hub, "org/private", "config.json", tmp_path)
    path = download(hub, "org/private", "config.json", tmp_path, token=TOKEN)
    assert path.read_bytes() == (SINGLE / "config.json").read_bytes()


def test_a_gated_repo_shows_its_info_and_keeps_its_files(hub, client, tmp_path):
    hub.add(Repo("org/gated", SINGLE, token=TOKEN, gated=True))
    hub.add(Repo("org/closed", SINGLE, gated=True))
    for repo_id in ("org/gated", "org/closed"):
        info = api(hub).model_info(repo_id)
        assert (info.gated, info.private) == ("auto", False)
        for token in (None, "wrong", TOKEN):
            if repo_id == "org/gated" and token == TOKEN:
                continue
            headers = {} if token is None else {"Authorization": f"Bearer {token}"}
            r = client.head(url(hub, repo_id, "config.json"), headers=headers)
            assert (r.status_code, r.headers["X-Error-Code"]) == (401, "GatedRepo")
            with pytest.raises(GatedRepoError):
                hf_raise_for_status(r)
    with pytest.raises(GatedRepoError):
        download(hub, "org/gated", "model.safetensors", tmp_path)
    path = download(hub, "org/gated", "model.safetensors", tmp_path, token=TOKEN)
    assert path.read_bytes() == (SINGLE / "model.safetensors").read_bytes()


@pytest.mark.parametrize("path,error,code", [
    ("/api/models/org/nope", RepositoryNotFoundError, "RepoNotFound"),
    ("/api/models/org/single/revision/nope", RevisionNotFoundError, "RevisionNotFound"),
    ("/api/models/org/single/revision/refs%2Fpr%2F2", RevisionNotFoundError, "RevisionNotFound"),
    ("/org/nope/resolve/main/config.json", RepositoryNotFoundError, "RepoNotFound"),
    ("/org/single/resolve/nope/config.json", RevisionNotFoundError, "RevisionNotFound"),
    ("/org/single/resolve/refs%2Fpr%2F2/config.json", RevisionNotFoundError, "RevisionNotFound"),
    ("/org/single/resolve/main/nope.json", RemoteEntryNotFoundError, "EntryNotFound"),
    ("/org/single/resolve/main/sub/config.json", RemoteEntryNotFoundError, "EntryNotFound"),
])
def test_a_404_maps_to_huggingface_hubs_error(hub, client, path, error, code):
    for method in ("HEAD", "GET"):
        r = client.request(method, hub.endpoint + path)
        assert (r.status_code, r.headers["X-Error-Code"]) == (404, code)
        assert r.headers["X-Error-Message"]
        with pytest.raises(error) as e:
            hf_raise_for_status(r)
        assert type(e.value) is error


def test_huggingface_hub_raises_the_right_error(hub, tmp_path):
    with pytest.raises(RepositoryNotFoundError):
        api(hub).model_info("org/nope")
    with pytest.raises(RevisionNotFoundError):
        api(hub).model_info("org/single", revision="v9")
    with pytest.raises(RepositoryNotFoundError):
        download(hub, "org/nope", "config.json", tmp_path)
    with pytest.raises(RevisionNotFoundError):
        download(hub, "org/single", "config.json", tmp_path, revision="v9")
    with pytest.raises(RemoteEntryNotFoundError):
        download(hub, "org/single", "nope.json", tmp_path)
    # the Hub names the commit of a missing file: huggingface_hub remembers it is missing
    commit = hub.repos["org/single"].commit
    assert os.path.exists(tmp_path / "models--org--single" / ".no_exist" / commit / "nope.json")
