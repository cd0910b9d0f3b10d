"""A checkpoint's tensors across files: one .safetensors file, or shards with an index.

`open_store` never raises for a defect it can report and step past: those become findings and the
affected tensors are left out. It raises UsageError for a missing path and FindingError when
nothing at all can be read.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import FindingError, UsageError
from ..findings import Finding
from ..resources import best_error
from . import compiled, foreign, journal
from .header import TensorInfo
from .hub import cache_root_hint, cache_root_note
from .reader import Part, SafetensorsFile, sniff
from .remote import fetch_all
from .survey import Pass, Survey

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
BAND = 8 << 20   # bytes of rows a column gather maps at once (TensorStore.columns)
SUFFIX = ".safetensors"


@dataclass
class TensorStore:
    root: Path                                   # the checkpoint directory
    files: dict[str, SafetensorsFile]            # file name (relative to root) -> open file
    locations: dict[str, str]                    # tensor name -> file name
    findings: list[Finding] = field(default_factory=list)
    index_name: str | None = None
    # tensor -> shard, for the tensors the index puts in a shard that is absent or cannot be
    # read (its own finding says why): known to exist, not readable, never "missing"
    unreadable: dict[str, str] = field(default_factory=dict)
    # tensor -> its header entry in the file `locations` names: asked hundreds of thousands of
    # times of a mixture of experts, one lookup where the file's would be three
    infos: dict[str, TensorInfo] = field(default_factory=dict)
    # many small tensors read on a second thread (start_survey), None where none was started
    survey: Survey | None = None
    # the files a view may have mapped pages of since their last whole release (each file's
    # `watch`): empty, a module's release costs one test, not a lookup per tensor
    mapped: set[SafetensorsFile] = field(default_factory=set)

    def info(self, tensor: str) -> TensorInfo:
        return self.infos[tensor]

    def view(self, tensor: str, part: Part | None = None) -> np.ndarray:
        """The tensor's array; `part`: the byte ranges of it the caller reads (all of it by
        default), the only ones a file mirrored from the Hub fetches (SafetensorsFile.view)."""
        return self.files[self.locations[tensor]].view(tensor, part)

    def columns(self, tensor: str, idx: np.ndarray) -> np.ndarray:
        """tensor[:, idx] of a 2-D tensor, taken a band of rows (about BAND bytes) at a time,
        each band's mapped pages dropped once taken (they stay in the page cache): a column
        gather touches every row, so through one mapping the whole tensor would stay
        resident while the caller works on."""
        f = self.files[self.locations[tensor]]
        arr = f.view(tensor)
        rows, n = arr.shape
        row_bytes = n * arr.itemsize
        per = max(1, BAND // max(1, row_bytes))
        out = np.empty((rows, len(idx)), dtype=arr.dtype)
        at = f.ranges(tensor)[0][0]
        for r0 in range(0, rows, per):
            r1 = min(rows, r0 + per)
            out[r0:r1] = arr[r0:r1][:, idx]
            f.release(at + r0 * row_bytes, at + r1 * row_bytes)
        return out

    @property
    def remote(self) -> bool:
        """Whether its files are mirrored from the Hub (each read fetched first)."""
        return any(f.remote for f in self.files.values())

    def prefetch(self, parts: Iterable[tuple[str, Part | None]]) -> None:
        """Fetch ahead what the caller will view: (tensor, part or None for all of it), every
        file's ranges together (coalesced, in parallel). Nothing for local files."""
        if not self.remote:
            return
        wanted: dict[str, list[tuple[int, int]]] = {}
        for t, part in parts:
            if t not in self.locations:   # in a shard that cannot be read: its finding says so
                continue
            f = self.files[self.locations[t]]
            wanted.setdefault(self.locations[t], []).extend(f.ranges(t, part))
        fetch_all([(f.filler, wanted[n]) for n, f in self.files.items()
                   if n in wanted and f.filler is not None])

    def heads(self, tensors: Iterable[str], n: int | None = None
              ) -> Iterator[tuple[str, bytes]]:
        """(tensor, its first `n` bytes, all by default) of each of `tensors`, read without
        mapping (SafetensorsFile.heads), each file opened once: grouped by file, in the order
        each file is first met, and in a file in the order of its data. Files mirrored from
        the Hub fetch every file's ranges first, together (prefetch)."""
        by_file: dict[str, list[str]] = {}
        for t in tensors:
            by_file.setdefault(self.locations[t], []).append(t)
        self.prefetch((t, None if n is None else [(0, n)]) for ts in by_file.values()
                      for t in ts)
        for name, ts in by_file.items():
            yield from self.files[name].heads(ts, n)

    def start_survey(self, passes: list[Pass], n: int, most: int) -> None:
        """Survey (survey.py) the tensors named with the suffixes of `passes` on a second
        thread, from now on, where the compiled loops are built (probes of `n` bytes; whole
        tensors up to `most` bytes): heads_grouped and zero_heads then read only what it
        leaves unsaid."""
        if self.survey is None and compiled.available() and not self.remote:
            self.survey = Survey(passes, n, most)
            for name, f in self.files.items():
                self.survey.add(name, f)
            self.survey.fed(self.locations)

    def stop_survey(self) -> None:
        """End the survey, if one runs, and forget it: for a store whose reader does not ask
        what it surveys (every read is then its own)."""
        if self.survey is not None:
            self.survey.close()
            self.survey = None

    def settle(self) -> None:
        """Wait for the survey to read all it was asked and its thread to end, if one runs:
        before this process forks (a child of a process with a thread running may inherit a
        lock held)."""
        if self.survey is not None:
            self.survey.join()

    def heads_grouped(self, tensors: Iterable[str]) -> Iterator[tuple[bytes, list[str]]]:
        """Every one of `tensors` whole, as (bytes, the tensors that hold them): where the
        survey found tensors alike, their group's representative is read once for all of
        them; every other tensor is read alone (heads)."""
        known, rest = ({}, list(tensors)) if self.survey is None else \
            self.survey.groups(tensors)
        for r, raw in self.heads(known):
            yield raw, known[r]
        for t, raw in self.heads(rest):
            yield raw, [t]

    def zero_heads(self, tensors: Iterable[str], n: int) -> set[str]:
        """Those of `tensors` whose first `n` bytes (all of a smaller one) are zero bytes, an
        empty tensor never; as the survey found them where it did.

        Worked example: a 4-bit qweight whose first word is 0x00000010 has a nonzero head;
        one never packed (every word 0) has n zero bytes and is named."""
        found, rest = (set(), list(tensors)) if self.survey is None else \
            self.survey.zero_heads(tensors, n)
        zero = bytes(n)   # one to compare with, not one a tensor
        return found | {t for t, head in self.heads(rest, n)
                        if head and (head == zero if len(head) == n else
                                     head.count(0) == len(head))}

    def file_of(self, tensor: str) -> str:
        """The file that holds `tensor`, or the shard the index puts it in that cannot be
        read."""
        return self.locations.get(tensor) or self.unreadable[tensor]

    @property
    def unreadable_files(self) -> list[str]:
        """The shards the index names that are absent or cannot be read."""
        return sorted(set(self.unreadable.values()))

    def release(self, tensors: Iterable[str] = ()) -> None:
        """Drop mapped pages of the files holding `tensors` (all files when empty)."""
        if not tensors:
            for f in self.files.values():
                f.release()
            return
        if not self.mapped:   # called a module at a time: tens of thousands of times
            return
        files, where = self.files, self.locations
        for t in tensors:
            f = files[where[t]]
            if f.viewed:    # else nothing of it is mapped since its last release
                f.release()

    def release_ranges(self, tensors: Iterable[str]) -> None:
        """Drop the mapped pages of exactly these tensors' bytes, whatever the files' flags
        say: for a thread that reads tensors while another releases whole files (release
        then clears a file's flag, and would skip the pages this thread maps after it)."""
        for t in tensors:
            f = self.files[self.locations[t]]
            f.release(*f.ranges(t)[0])

    def close(self) -> None:
        if self.survey is not None:   # what it has not read yet is not waited for
            self.survey.close()
        for f in self.files.values():
            f.close()


def _listdir(p: Path) -> list[Path]:
    try:
        return sorted(p.iterdir())
    except OSError as e:
        raise UsageError(f"{p}: cannot list the directory: {e.strerror or e}") from None


def safe_shard_name(name) -> bool:
    """A shard name an index may use: a plain file name in the checkpoint directory."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name and not os.path.isabs(name))


def _refuse_json_file(p: Path) -> None:
    """A config or index file given where the checkpoint was meant: say what was passed."""
    try:
        with open(p, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return  # the reader reports it with its own code
    if p.suffix == ".json" or head.startswith(b"{"):
        raise UsageError(f"{p}: a JSON file, not safetensors; pass the checkpoint directory "
                         f"that holds it ({p.parent})")


# what start_survey takes: the passes, the probes' bytes, the largest tensor compared whole
SurveyPlan = tuple[list[Pass], int, int]


def open_store(path: str | os.PathLike, survey: SurveyPlan | None = None) -> TensorStore:
    """The checkpoint at `path` (a directory or one .safetensors file), its headers read and
    checked. An in-place convert that a kill interrupted there is first finished or undone
    (journal.recover), and the store's findings say so (GQ420). `survey`: start_survey's
    arguments, for the survey to read each file while the next headers are parsed (where the
    compiled loops are built and no file is mirrored from the Hub)."""
    p = Path(path)
    recovered = journal.recover(p if p.is_dir() else p.parent) if p.exists() else []
    sv = Survey(*survey) if survey is not None and compiled.available() else None
    try:
        store = _open_store(path, sv)
    except BaseException:
        if sv is not None:
            sv.close()
        raise
    store.findings[:0] = recovered
    if sv is not None:
        if store.remote:
            sv.close()
        else:
            store.survey = sv
            sv.fed(store.locations)
    return store


def _open_store(path: str | os.PathLike, sv: Survey | None = None) -> TensorStore:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file or directory")
    if p.is_file():
        _refuse_json_file(p)
        _refuse_lone_shard(p)
        store = TensorStore(p.parent, {}, {})
        _open_into(store, p.name, sv)
        if not store.files:
            raise FindingError(*store.findings)
        return store
    if not p.is_dir():
        raise UsageError(f"{path}: not a file or directory")
    if (p / INDEX_NAME).is_file():
        return _open_indexed(p, sv)
    shards = sorted(f.name for f in _listdir(p) if f.name.endswith(SUFFIX) and f.is_file())
    if not shards:
        raise FindingError(_no_safetensors(p))
    store = TensorStore(p, {}, {})
    if SINGLE_NAME in shards:  # what transformers loads without an index; others are ignored
        for name in shards:
            if name != SINGLE_NAME:
                store.findings.append(Finding("GQ125", f"not loaded: without {INDEX_NAME}, "
                                              f"loaders read {SINGLE_NAME} only", file=name))
        shards = [SINGLE_NAME]
    for name in shards:
        _open_into(store, name, sv)
    if not store.files:
        raise FindingError(*store.findings)
    return store


def _no_safetensors(p: Path) -> Finding:
    """GQ128 for directory `p`: what it holds instead, where that is weights in another format
    (the first bytes of each file named like them tell which), or a cache entry's snapshots."""
    found = [(f, other) for f in _listdir(p)
             if foreign.weights_name(f.name) and f.is_file() and (other := sniff(f)) is not None]
    missing = f"no *{SUFFIX} file and no {INDEX_NAME} in this directory"
    if not found:
        return Finding("GQ128", missing + cache_root_note(p), file=str(p),
                       hint=cache_root_hint(p))
    (first, other), more = found[0], len(found) - 1
    also = f", and {more} more file{'s' if more > 1 else ''} in another format" if more else ""
    return Finding("GQ128", f"{missing}; it holds {first.name}, {other.what}{also}"
                   + foreign.consequence(other), file=str(p),
                   hint=foreign.next_step(other, str(first), then=str(p),
                                          more=sum(o.kind == other.kind for _, o in found[1:])))


def _open_into(store: TensorStore, name: str, sv: Survey | None = None) -> None:
    """Open file `name`, record its tensors (and duplicates across files); `sv`: the survey
    given each file opened."""
    try:
        f = SafetensorsFile(store.root / name, display_name=name)
    except FindingError as e:
        store.findings.append(e.finding)
        return
    store.files[name] = f
    f.watch = store.mapped
    if sv is not None:
        sv.add(name, f)
    if store.locations.keys().isdisjoint(f.tensors):   # the rule: a whole file's at once
        store.locations.update(dict.fromkeys(f.tensors, name))
        store.infos.update(f.tensors)
        return
    for t, i in f.tensors.items():
        if t in store.locations:
            store.findings.append(Finding(
                "GQ126", f"stored in {store.locations[t]} and in {name}", file=name, tensor=t,
                hint="remove one copy; loaders pick one arbitrarily"))
        else:
            store.locations[t] = name
            store.infos[t] = i


def _refuse_lone_shard(p: Path) -> None:
    """GQ131 for one shard of an indexed checkpoint given alone: its modules' tensors may sit in
    the shards beside it, so read alone every such module would be blamed on this file."""
    index = p.parent / INDEX_NAME
    if not index.is_file():
        return
    try:
        weight_map, _ = _read_index(index)
    except FindingError:
        return   # an index that cannot be read says nothing of this file; it is read alone
    shards = sorted(set(weight_map.values()))
    if p.name not in shards or len(shards) < 2:
        return
    raise FindingError(Finding(
        "GQ131", f"shard {shards.index(p.name) + 1} of {len(shards)} that {INDEX_NAME} "
        f"beside it names: a module's tensors may sit in the other shards, so it is checked "
        "with them, as a directory", file=str(p), hint=f"pass the directory: {p.parent}"))


def _open_indexed(root: Path, sv: Survey | None = None) -> TensorStore:
    store = TensorStore(root, {}, {}, index_name=INDEX_NAME)
    weight_map, declared_total = _read_index(root / INDEX_NAME)
    named = set(weight_map.values())   # a few shards, each named by thousands of tensors
    bad_names = sorted(s for s in named if not safe_shard_name(s))
    for s in bad_names:
        store.findings.append(Finding(
            "GQ121", f"shard name {s!r} is not a plain file name in the checkpoint directory",
            file=INDEX_NAME, hint="shard names may not contain '/', '\\' or '..'"))
    shard_names = sorted(s for s in named if safe_shard_name(s))
    per_shard = Counter(weight_map.values())
    for s in shard_names:
        if not (root / s).is_file():
            what = "is not a regular file" if (root / s).exists() or (root / s).is_symlink() \
                else "does not exist"
            store.findings.append(Finding("GQ122", f"shard {s!r} ({per_shard[s]} tensors) {what}",
                                          file=INDEX_NAME))
        else:
            _open_into(store, s, sv)
    failed = set(shard_names) - set(store.files)
    if failed:
        store.unreadable.update((t, s) for t, s in weight_map.items()
                                if s in failed and t not in store.locations)
    if weight_map != store.locations:   # else every tensor sits where the map says: one compare
        store.findings += _misplaced(store, weight_map)
    for p in _listdir(root):
        if p.name.endswith(SUFFIX) and p.name not in named:
            store.findings.append(Finding("GQ125", "not referenced by the index; ignored",
                                          file=p.name))
    if declared_total is not None and not (isinstance(declared_total, int)
                                           and not isinstance(declared_total, bool)):
        store.findings.append(Finding("GQ127", f"metadata.total_size is {declared_total!r}, "
                                      "not an integer", file=INDEX_NAME))
    elif declared_total is not None and len(store.files) == len(shard_names) and not bad_names:
        tensor_total, file_total = total_sizes(store.files.values())
        if declared_total not in (tensor_total, file_total):
            store.findings.append(Finding(
                "GQ127", f"metadata.total_size is {declared_total}; expected the tensor bytes "
                f"({tensor_total}, as huggingface_hub and transformers write it) or the shard "
                f"file bytes ({file_total}, headers included, as GPTQModel writes it)",
                file=INDEX_NAME, hint="loaders ignore total_size; regenerate the index if the "
                "shards were edited by hand"))
    if not store.files:
        raise FindingError(*store.findings, Finding("GQ128", "no shard of the index could be "
                                                    "read", file=INDEX_NAME))
    return store


def _misplaced(store: TensorStore, weight_map: dict[str, str]) -> list[Finding]:
    """GQ123 for each tensor the index maps to a file that does not hold it, GQ124 for each
    tensor of a file that the index does not list. The few mapped elsewhere than where they
    were found are found first, as a set difference (not a step a tensor of the hundreds of
    thousands mapped), then sorted; one found first in another file may still be in its own."""
    out = []
    for t, s in sorted((t, s) for t, s in weight_map.items() - store.locations.items()
                       if s in store.files and t not in store.files[s].tensors):
        actual = store.locations.get(t)
        where = f"; it is in {actual}" if actual else ""
        out.append(Finding("GQ123", f"index maps it to {s}, which does not contain it{where}",
                           file=INDEX_NAME, tensor=t))
    for name, f in store.files.items():
        if weight_map.keys() >= f.tensors.keys():   # the rule: every tensor listed
            continue
        out += [Finding("GQ124", "not listed in the index weight_map; loaders that follow the "
                        "index never see it", file=name, tensor=t)
                for t in f.tensors if t not in weight_map]
    return out


def total_sizes(files) -> tuple[int, int]:
    """The two values producers write as an index's `metadata.total_size`: (sum of tensor data
    bytes, sum of shard file bytes including each 8-byte length and header).

    - huggingface_hub `split_state_dict_into_shards_factory` adds `get_storage_size(tensor)` per
      tensor (src/huggingface_hub/serialization/_base.py, huggingface/huggingface_hub @
      ee0a4510f4bc15e26cb722be2efc2bdb01383ca0 and release 2.4.0). transformers'
      `PreTrainedModel.save_pretrained` writes that split's metadata (modeling_utils.py:
      4.46.3 `{"total_size"}`; 5.24.0 `{"total_parameters", "total_size"}`), and so did
      GPTQModel 1.4 to 4.x (`split_torch_state_dict_into_shards`, ModelCloud/GPTQModel bafa0a155).
    - GPTQModel >= 5.0 writes its own shards: `streaming_state_dict_to_shards` sums
      `_write_shard_file`'s return value, `out.tell()` after the length, header and data, i.e. the
      file size (gptqmodel/utils/model.py; models/writer.py `save_quantized` puts it in
      `{"metadata": {"total_size": ...}}`; ModelCloud/GPTQModel v7.3.4 =
      783a0fbb9e3dcddc281a4291ec19d5fa86aec091, since 10f3d1fe0, first released in v5.0.0).
    """
    files = list(files)
    # a header's data_len is its tensors' bytes: parse_header refuses holes and overlaps
    return sum(f.header.data_len for f in files), sum(f.size for f in files)


def _read_index(path: Path) -> tuple[dict[str, str], int | None]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FindingError(Finding("GQ118", f"cannot read: {e.strerror or e}", file=path.name))
    plain = compiled.index_map(raw)   # an index of the plain kind, in one compiled pass
    if plain is not None:
        weight_map, meta = plain
        return weight_map, meta.get("total_size") if meta is not None else None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FindingError(Finding("GQ120", f"not valid JSON: {_reason(e)}", file=path.name))
    # the schema's whole rule, at a dict lookup a tensor: a mixture of experts' index names
    # 100,000 tensors, which the validator walks at 20 us each; it runs where this does not
    # hold, to say what is wrong
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    ok = isinstance(wm, dict) and set(map(type, wm.values())) <= {str}   # one pass in C
    err = None if ok else best_error("index", doc)
    if err is not None:
        where = ".".join(str(p) for p in err.path) or "(top level)"
        raise FindingError(Finding("GQ120", f"{where}: {err.message}; expected {{\"weight_map\": "
                                   "{tensor: shard file name}}", file=path.name))
    meta = doc.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    return doc["weight_map"], total


def _reason(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)
