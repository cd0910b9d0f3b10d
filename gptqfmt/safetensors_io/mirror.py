"""A Hub checkpoint as a local directory: the mirror that inspect and doctor read with --remote
(remote.py says how its bytes arrive)."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .index import INDEX_NAME, SUFFIX
from .remote import HEAD_GUESS, Filler, Hub, fetch_all, parallel, register, unregister


@dataclass
class Mirror:
    """A Hub checkpoint as a local directory (see the module's docstring). `root` is read like
    any checkpoint while the mirror is open; `close()` (or the with block's end) removes it."""
    repo_id: str
    revision: str
    commit: str
    root: Path
    hub: Hub
    files: dict[str, int]       # every file of the repo and its size
    shards: list[str]
    holder: Path

    @classmethod
    def open(cls, repo_id: str, revision: str = "main", *, hub: Hub | None = None,
             configs: Iterable[str] = ()) -> Mirror:
        """Resolve `repo_id` at `revision`, fetch `configs` (file names, where the repo has
        them) and the index whole, and make an empty sparse copy of each safetensors file that
        a checkpoint there could read (those at the top level)."""
        hub = hub or Hub()
        commit, files = hub.resolve(repo_id, revision)
        holder = Path(tempfile.mkdtemp(prefix="gptqfmt-remote-"))
        root = holder / repo_id.split("/")[-1]
        root.mkdir()
        shards = sorted(n for n in files if n.endswith(SUFFIX) and "/" not in n)
        m = cls(repo_id, revision, commit, root, hub, files, shards, holder)
        try:
            m.fetch_whole([n for n in (*configs, INDEX_NAME) if n in files])
            fillers = []
            for n in shards:
                path = root / n
                with open(path, "wb") as f:
                    f.truncate(files[n])
                fillers.append(Filler(hub, repo_id, commit, n, path, files[n]))
                register(path, fillers[-1])
            # every shard's first bytes at once: its length and (nearly always) its header
            fetch_all([(f, [(0, HEAD_GUESS)]) for f in fillers])
        except BaseException:
            m.close()
            raise
        return m

    def fetch_whole(self, names: list[str]) -> None:
        """Fetch these files of the repo whole, in parallel (the configs and the index)."""
        def one(name: str) -> None:
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.truncate(self.files[name])
            Filler(self.hub, self.repo_id, self.commit, name, path,
                   self.files[name]).fetch(0, self.files[name])
        parallel(one, names, self.hub.in_flight)

    @property
    def size(self) -> int:
        """The bytes of the files a checkpoint read here could read: the safetensors files and
        the configs."""
        return sum(self.files[n] for n in self.shards) + sum(
            s for n, s in self.files.items() if n.endswith(".json") and "/" not in n)

    def close(self) -> None:
        for n in self.shards:
            unregister(self.root / n)
        shutil.rmtree(self.holder, ignore_errors=True)


