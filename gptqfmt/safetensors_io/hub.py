"""Checkpoints named as on the Hugging Face Hub, read from its local cache, and the content
hashes that cache records (verify --checksums).

A PATH that exists is a path, whatever it looks like. Otherwise `org/model[@revision]` is a repo
id, resolved offline through huggingface_hub (the optional extra `gptqfmt[hub]`) to the cached
snapshot of that revision (`main` by default), as `snapshot_download(..., local_files_only=True)`
does for transformers. Nothing is downloaded unless asked (`download=True`, the CLI's
--download). A cache entry `models--org--model/` given as a path resolves to its `main`
snapshot; without huggingface_hub, or without refs/main, it stays a path, and the reader's
GQ128 names the snapshot to pass (cache_root_hint).

The cache layout (huggingface_hub's "Manage the cache" guide):

    models--org--model/
      refs/main                      the commit that `main` points to
      blobs/<sha256 or git sha1>     the content, named by its hash: sha256 for LFS files,
                                     the git blob id (sha1 of "blob <size>\\0" + content) else
      snapshots/<commit>/config.json -> ../../blobs/<hash>

A folder made by `hf download --local-dir DIR` records the same hash (the Hub's ETag) in
DIR/.cache/huggingface/download/<file>.metadata (commit, etag, timestamp: one per line)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..findings import Finding
from ..parallel import cpus

#: a repo id as the Hub spells one, with an optional @revision (a branch, tag, commit or
#: refs/pr/N); a name with no slash is never read as one, so `model.safetensors` stays a path
REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[^\s@]+))?$")
#: a cache entry's directory name: models--org--name (models--name for a repo without an org)
CACHE_ENTRY = re.compile(r"^models--(?P<id>.+)$")
HUB_EXTRA = "pip install 'gptqfmt[hub]'"
#: what gptqfmt reads of a repo, and so all --download fetches (not *.bin, *.pt, original/...,
#: which can be several times the model); the offline lookup asks for the same, so a snapshot
#: fetched this way counts as complete
PATTERNS = ["*.json", "*.safetensors"]
CHUNK = 8 << 20     # hashing reads 8 MiB at a time: memory stays flat for a 10 GB shard


@dataclass(frozen=True)
class Resolved:
    """What a PATH argument names: `path`, the directory or file to read; for a Hub name also
    the repo id, the revision asked for and the commit of the snapshot it resolved to."""
    path: str
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None

    def describe(self) -> str:
        return (f"{self.repo_id}@{self.revision}: snapshot {self.commit} ({self.path})"
                if self.repo_id else self.path)


def download_command(repo_id: str, revision: str | None, filename: str | None = None) -> str:
    """The `hf download` command line that fetches what is missing."""
    cmd = f"hf download {repo_id}" + (f" {filename}" if filename else "")
    return cmd + (f" --revision {revision}" if revision and revision != "main" else "")


def cache_snapshots(p: Path) -> list[Path]:
    """The snapshot folders of a cache entry (`models--org--name/`), newest first; empty when
    `p` is not one."""
    snaps = p / "snapshots"
    if not (p.name.startswith(("models--", "datasets--")) or (p / "refs").is_dir()) \
            or not snaps.is_dir():
        return []
    try:
        found = [s for s in snaps.iterdir() if s.is_dir()]
    except OSError:
        return []
    return sorted(found, key=lambda s: s.stat().st_mtime, reverse=True)


def cache_main(p: Path) -> Path | None:
    """The snapshot that the entry's refs/main names, when it is there."""
    try:
        rev = (p / "refs" / "main").read_text("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    snap = p / "snapshots" / rev
    ok = rev and "/" not in rev and "\\" not in rev and rev not in (".", "..")
    return snap if ok and snap.is_dir() else None


def cache_root_note(p: Path) -> str:
    """For GQ128 on a directory with no safetensors: what it is, when it is a cache entry."""
    snaps = cache_snapshots(p)
    if not snaps:
        return ""
    return (f"; it is a Hugging Face cache root with {len(snaps)} snapshot"
            f"{'s' if len(snaps) > 1 else ''} under snapshots/")


def cache_root_hint(p: Path) -> str | None:
    """For GQ128: the snapshot to pass instead of a cache entry (refs/main's, else the newest),
    and the extra that would let the entry itself be passed."""
    snaps = cache_snapshots(p)
    if not snaps:
        return None
    main = cache_main(p)
    target = main or snaps[0]
    which = "refs/main" if target == main else "the newest"
    hint = f"pass a snapshot, e.g. {target} ({which})"
    if importlib.util.find_spec("huggingface_hub") is None:
        hint += f"; or install the hub extra ({HUB_EXTRA}) and pass the cache root or org/model"
    return hint


def resolve(arg: str | os.PathLike, download: bool = False) -> Resolved:
    """The checkpoint a PATH argument names (see the module's docstring). A local path is
    returned as given; a Hub name that cannot be resolved is a UsageError that says why and
    what to run."""
    text = os.fspath(arg)
    p = Path(text)
    if p.exists() or p.is_symlink():
        entry = CACHE_ENTRY.match(p.resolve().name) if p.is_dir() else None
        if entry and cache_main(p) is not None \
                and importlib.util.find_spec("huggingface_hub") is not None:
            return _snapshot(entry["id"].replace("--", "/"), "main", text, download,
                             cache_dir=p.resolve().parent)
        return Resolved(text)  # a path, whatever it looks like: --download is for Hub names
    m = REPO_ID.match(text)
    if m is None:
        return Resolved(text)  # the reader says "no such file or directory"
    return _snapshot(m["repo"], m["rev"] or "main", text, download)


def _snapshot(repo_id: str, revision: str, arg: str, download: bool,
              cache_dir: Path | None = None) -> Resolved:
    try:
        import huggingface_hub as hh
        from huggingface_hub import constants as hub_constants
        from huggingface_hub import errors as hub_errors
    except ImportError:
        raise UsageError(f"{arg}: no such file or directory; to read it as a Hugging Face repo "
                         f"id, install the hub extra: {HUB_EXTRA}") from None
    fetch = download_command(repo_id, revision)
    incomplete = getattr(hub_errors, "IncompleteSnapshotError", None)
    try:
        path = hh.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                    local_files_only=not download, allow_patterns=PATTERNS)
    except Exception as e:  # noqa: BLE001 - every Hub failure becomes one line and exit 2
        first = first_line(e)
        if incomplete is not None and isinstance(e, incomplete):
            raise UsageError(f"{repo_id}@{revision}: the cached snapshot {e.snapshot_path} is "
                             f"incomplete (an interrupted download?); complete it with: "
                             f"{fetch}") from None
        if isinstance(e, hub_errors.LocalEntryNotFoundError) and not download:
            where = cache_dir or hub_constants.HF_HUB_CACHE
            raise UsageError(f"{arg}: no such file or directory, and {repo_id}@{revision} is "
                             f"not in the Hugging Face cache ({where}); download it with: "
                             f"{fetch} (or pass --download)") from None
        verb = "download" if download else "resolve"
        raise UsageError(f"cannot {verb} {repo_id}@{revision}: {first}") from None
    return Resolved(str(path), repo_id, revision, Path(path).name)


# ---- verify --checksums --------------------------------------------------------------------

HEX = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


@dataclass
class Checksums:
    """What verify --checksums compared: files and bytes hashed, against which record
    ("cache" or "local-dir"), files with no recorded hash, and the mismatches as findings."""
    source: str
    files: int = 0
    bytes: int = 0
    unrecorded: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"source": self.source, "files": self.files, "bytes": self.bytes,
                "mismatched": len(self.findings), "unrecorded": self.unrecorded}


def content_hash(path: Path, kind: str, progress=None, stop=None) -> str:
    """sha256 of the content (`kind` "sha256"), or its git blob id ("git-sha1": the sha1 of
    "blob <size>\\0" followed by the content), read CHUNK bytes at a time. `stop` (an Event)
    set by another thread ends it between two chunks (Ctrl-C while shards hash in threads)."""
    size = path.stat().st_size
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            if stop is not None and stop.is_set():
                raise InterruptedError(f"{path}: hashing stopped")
            h.update(chunk)
            progress and progress(len(chunk))
    return h.hexdigest()


def hash_kind(recorded: str) -> str:
    return "sha256" if len(recorded) == 64 else "git-sha1"


def _cache_repo(path: Path) -> tuple[str, str] | None:
    """The repo id and commit of the cache snapshot `path` lies in, if it does."""
    for snapshot in [path, *path.parents]:
        entry = CACHE_ENTRY.match(snapshot.parent.parent.name)
        if snapshot.parent.name == "snapshots" and entry:
            return entry["id"].replace("--", "/"), snapshot.name
    return None


def _recorded_in_cache(f: Path) -> str | None:
    if not f.is_symlink():
        return None
    target = Path(os.path.realpath(f))
    return target.name if target.parent.name == "blobs" and HEX.match(target.name) else None


def _recorded_in_local_dir(root: Path, rel: str) -> str | None:
    meta = root / ".cache" / "huggingface" / "download" / f"{rel}.metadata"
    try:
        lines = meta.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
    return etag if HEX.match(etag) else None


def checksums(path: str | os.PathLike, progress=None) -> Checksums:
    """Hash every file of the checkpoint at `path` (a directory: every file under it but the
    .cache and .git folders; one file: that file) and compare it with the hash its Hugging Face
    cache entry records: a mismatch, a missing blob, or a file in a cache snapshot that is not a
    link into blobs/ (replaced after the download) is a GQ129. `progress(nbytes, total)` as
    validate's. A directory with no recorded hash at all is a UsageError: there is nothing to
    compare with."""
    p = Path(path)
    root = p if p.is_dir() else p.parent
    if p.is_dir():
        files = sorted(f for f in p.rglob("*")
                       if (f.is_file() or f.is_symlink())
                       and not {".cache", ".git"} & set(f.relative_to(p).parts[:-1]))
    else:
        files = [p]
    cached = {f: _recorded_in_cache(f) for f in files}
    in_cache = any(cached.values())
    result = Checksums("cache" if in_cache else "local-dir")
    repo = _cache_repo(Path(os.path.abspath(root)))
    present = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        want = cached[f] if in_cache else _recorded_in_local_dir(root, rel)
        if want is None and in_cache:
            result.findings.append(Finding(
                "GQ129", "not a link into the cache's blobs/: the file was replaced after "
                "the download, and no hash records what it held", file=rel,
                hint=_refetch(repo, rel)))
        elif want is None:
            result.unrecorded.append(rel)
        elif not f.exists():  # a link whose blob is gone
            result.findings.append(Finding(
                "GQ129", f"the blob it links to ({want}) is missing", file=rel,
                hint=_refetch(repo, rel)))
        else:
            present.append((f, rel, want))
    if not present and not result.findings:
        raise UsageError(f"--checksums: {path} is neither a Hugging Face cache snapshot (files "
                         "linked to blobs/<hash>) nor a folder from `hf download --local-dir` "
                         "(.cache/huggingface/download/): no recorded hash to compare with")
    sizes = {f: f.stat().st_size for f, _, _ in present}
    total = sum(sizes.values())
    progress and progress(0, total)
    lock, stop = threading.Lock(), threading.Event()

    def tick(n: int) -> None:  # from the hashing threads: one at a time into the bar
        if progress:
            with lock:
                progress(n, total)

    # one file per thread: hashlib releases the GIL on large updates, so shards hash in
    # parallel (as fast as the disk, or the CPUs, allow); each thread holds one CHUNK
    workers = max(1, min(len(present), cpus()))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        hashes = pool.map(lambda t: content_hash(t[0], hash_kind(t[2]), tick, stop), present)
        try:
            done = list(zip(present, hashes))
        except BaseException:  # Ctrl-C, SIGTERM: the threads stop at their next chunk
            stop.set()
            raise
        for (f, rel, want), got in done:
            result.files += 1
            result.bytes += sizes[f]
            if got != want:
                kind = hash_kind(want)
                result.findings.append(Finding(
                    "GQ129", f"{kind} of the content is {got}, the "
                    f"{'cache entry' if in_cache else 'download metadata'} records {want}",
                    file=rel, hint=_refetch(repo, rel),
                    details={"algorithm": kind, "expected": want, "got": got}))
    result.findings.sort(key=Finding.sort_key)
    return result


def _refetch(repo: tuple[str, str] | None, rel: str) -> str:
    if repo:
        return ("the local copy is damaged; fetch it again: "
                f"{download_command(repo[0], repo[1], rel)} --force-download")
    return "the local copy is damaged; download the file again"


def first_line(e: BaseException) -> str:
    """An exception's message, its first line (its type's name where it has none): what a
    one-line error quotes of a library's failure."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
