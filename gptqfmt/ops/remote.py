"""inspect (and, through it, doctor) of a checkpoint on the Hugging Face Hub without downloading
it: the repo mirrored (safetensors_io/mirror.py), read by the local code, and the answer said
of the repo.

What the answer names is rewritten from the mirror to what the user has: the document's
`path` is the repo id as given, and a command that needs the files names `NAME`, the folder
that `hf download ORG/NAME --revision COMMIT --local-dir NAME` makes (said once, in `remote`),
as the same command run in the folder that holds it names it.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from ..errors import FindingError, UsageError
from ..findings import Finding
from ..formats.configs import CONFIG_FILES
from ..safetensors_io.foreign import weights_name
from ..safetensors_io.hub import REPO_ID, download_command
from ..safetensors_io.mirror import Mirror
from ..safetensors_io.remote import Hub
from .inspect import InspectResult, inspect_checkpoint


def parse_repo(arg: str) -> tuple[str, str]:
    """(repo id, revision) of `ORG/NAME[@REVISION]` (revision `main` by default)."""
    m = REPO_ID.match(arg)
    if m is None:
        raise UsageError(f"{arg}: --remote reads a Hugging Face repo id, ORG/NAME or "
                         "ORG/NAME@REVISION (a branch, tag or commit)")
    return m["repo"], m["rev"] or "main"


@contextmanager
def mounted(arg: str, hub: Hub | None = None) -> Iterator[Mirror]:
    """The repo `arg` names, mirrored for the length of the with block. A repo with no
    safetensors file to read is a GQ128 of the repo; an error raised inside names the repo's
    files as the repo has them (`NAME/...`), not the mirror's."""
    repo_id, revision = parse_repo(arg)
    mirror = Mirror.open(repo_id, revision, hub=hub, configs=CONFIG_FILES)
    try:
        if not mirror.shards:
            weights = sorted(n for n in mirror.files if weights_name(n))
            held = f"; it holds {', '.join(weights[:3])}" + (
                f" and {len(weights) - 3} more" if len(weights) > 3 else "") if weights else ""
            raise FindingError(Finding(
                "GQ128", f"no *.safetensors file at the top level of the repo at commit "
                f"{mirror.commit}{held}", file=arg,
                hint="gptqfmt reads safetensors checkpoints; convert the weights to safetensors "
                "first" if weights else None))
        old = os.fspath(mirror.holder) + os.sep
        try:
            yield mirror
        except FindingError as e:
            raise FindingError(*rebased(e.findings, old, "")) from None
        except UsageError as e:
            raise UsageError(str(e).replace(old, "")) from None
    finally:
        mirror.close()


def local_name(mirror: Mirror) -> str:
    """Where `hf download --local-dir` would put the files: what the commands name."""
    return mirror.root.name


def record(mirror: Mirror) -> dict[str, Any]:
    """What was read, from where: the `remote` object of the JSON documents."""
    st = mirror.hub.stats
    size = mirror.size
    return {"repo_id": mirror.repo_id, "revision": mirror.revision, "commit": mirror.commit,
            "endpoint": mirror.hub.endpoint, "bytes_read": st.bytes,
            "checkpoint_bytes": size,
            "fraction_read": round(st.bytes / size, 6) if size else 0.0,
            "requests": st.requests, "retries": st.retries,
            "local_dir": local_name(mirror),
            "download": download_command(mirror.repo_id, mirror.commit)
            + f" --local-dir {local_name(mirror)}"}


def blob_url(remote: dict[str, Any]) -> str:
    """Where the files of a repo read over HTTP (its `record`) are shown on the Hub, at the
    commit read: what the CI formats locate its findings under."""
    return f"{remote['endpoint']}/{remote['repo_id']}/blob/{remote['commit']}"


def rebased(x: Any, old: str, new: str) -> Any:
    """`x` with every `old` in its strings replaced by `new`: strings, lists, tuples, dicts
    and dataclasses (copied, frozen or not), through everything but SKIP's fields (the opened
    checkpoint and the runtime table, which hold no path a person reads)."""
    if isinstance(x, str):
        return x.replace(old, new) if old in x else x
    if isinstance(x, list):
        return [rebased(v, old, new) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(rebased(v, old, new) for v in x)
    if isinstance(x, dict):
        return {k: rebased(v, old, new) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {f.name: rebased(getattr(x, f.name), old, new)
                   for f in dataclasses.fields(x) if f.init and f.name not in SKIP}
        changes = {k: v for k, v in changes.items() if v is not getattr(x, k)}
        return dataclasses.replace(x, **changes) if changes else x
    return x


SKIP = frozenset({"source", "detection", "runtime", "ckpt", "store", "path"})


R = TypeVar("R")


def said_of_repo(result: R, mirror: Mirror, arg: str) -> R:
    """`result` (InspectResult, doctor's Diagnosis) as said of the repo: paths into the
    mirror rewritten to NAME, `path` the repo id as given, `remote` the record."""
    out = rebased(result, os.fspath(mirror.holder) + os.sep, "")
    return cast(R, dataclasses.replace(out, path=arg, remote=record(mirror)))


def inspect_remote(arg: str, hub: Hub | None = None) -> InspectResult:
    """`inspect ORG/NAME[@REVISION] --remote` as a library call: the InspectResult of the
    repo, read over HTTP range requests (its `remote` says what was read)."""
    with mounted(arg, hub) as mirror:
        result = inspect_checkpoint(mirror.root)
        return said_of_repo(result, mirror, arg)
