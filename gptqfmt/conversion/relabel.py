"""`fix-label`: set the configs' convention label to what the data are, in place, without
touching a tensor (the fix GQ401's hint asks for).

`checkpoint_format` and `format` change (both set: vLLM, transformers and ExLlamaV2 read the
first, GPTQModel the second), and AutoGPTQ's `is_marlin_format: false` is dropped (GPTQModel 6.0
and later refuse the key by name; a label already right with that key is still rewritten).
`desc_act` true (or missing from GPTQ's config) becomes false where no g_idx reorders. A key
the config files disagree on (GQ205: bits, group_size, sym, desc_act, pack_dtype) is set in
each file to what the data are, where the modules agree on it (configs.data_values). Every
other key keeps its value and place, and `meta.gptqfmt` records what was done. Each file is
replaced atomically: a temporary file beside it, written, fsynced, renamed over it, the directory
fsynced; a file is never half-written, and a failure before the renames leaves every file as it
was.

auto-round's own config (quant_method auto-round) keeps its method: its `packing_format` is set
to the data's (auto_round:auto_gptq for gptq; auto_round:gptqmodel for gptq_v2 with g_idx
tensors, auto_round without), and checkpoint_format and format only where it has them
(formats/gptq/config.py label_values).

Refused (nothing written):
- the data's convention is undecidable and no `--to` names one (GQ416);
- `--to` names a convention the data contradict (GQ417): that would write a GQ401;
- a config file is a symbolic link, as in a Hugging Face cache snapshot, where it points into
  blobs/ shared by every snapshot holding the same file (its name is its hash): rewriting the
  blob would change other revisions, replacing the link would leave the cache inconsistent.
  Copy the snapshot (`cp -rL`) or download with `local_dir`, then fix that copy;
- no config file holds a quantization config (nothing to relabel: convert writes a derived one).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import faults
from ..bits.conventions import CONVENTIONS
from ..detection.decide import AMBIGUOUS
from ..detection.pool import Detection
from ..detection.read import detect_checkpoint
from ..errors import OutputError, UsageError, naming
from ..findings import Finding
from ..formats.configs import CONFIG_FILES, CONFIG_JSON
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.gptq.config import (
    AUTOROUND_DEFAULT,
    AUTOROUND_PACKING,
    COMPARED_KEYS,
    PACKING_KEY,
    is_autoround,
    label_values,
)
from ..formats.open import open_labelled
from ..ops.reports import DETECT, Progress, rounds, tool_json
from ..ops.verify import Report, validate
from ..safetensors_io.journal import fsync_path, rename_over, write_beside
from .atomic import TMP_TAG, alive
from .configs import data_values, dumps, legacy_dropped, provenance, quant_config, relabelled

DETECTED = "detected"
TARGETS = (DETECTED,) + CONVENTIONS


@dataclass(frozen=True)
class LabelChange:
    """One key of one config file: `old` as JSON text where not a string (None: missing),
    `new` the value written (None: the key is removed)."""
    file: str
    key: str
    old: str | None
    new: str | None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "key": self.key, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class RelabelPlan:
    path: Path
    root: Path
    target: str | None              # the convention written; None when refused
    detection: Detection
    changes: list[LabelChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    docs: dict[str, Any] = field(default_factory=dict)   # the config files as read (by name)
    g_idx: bool = False             # whether the modules store g_idx (auto-round's label)

    @property
    def refused(self) -> bool:
        return self.target is None

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(c.file for c in self.changes))


def plan_relabel(path: str | os.PathLike, to: str = DETECTED,
                 detection: Detection | None = None,
                 progress: Progress | None = None) -> RelabelPlan:
    """What fix-label would write for the checkpoint at `path` (nothing is written).
    `detection`: the data's, where the caller has it (doctor: verify's), else detected here
    (DETECT, to `progress`).
    Raises UsageError where it cannot relabel at all (see the module docstring)."""
    if to not in TARGETS:
        raise UsageError(f"--to {to!r}: expected one of {', '.join(TARGETS)}")
    src, ckpt = open_labelled(path)
    try:
        det = detection or detect_checkpoint(ckpt, full=False,
                                             progress=rounds(progress, DETECT))
        return _plan(path, to, src.root, det, ckpt)
    finally:
        src.close()


def _plan(path: str | os.PathLike[str], to: str, root: Path, det: Detection,
          ckpt: Checkpoint) -> RelabelPlan:
    """plan_relabel's plan, the checkpoint open (the data values of disputed keys are read)."""
    g_idx = any("g_idx" in m.tensors for m in ckpt.valid_modules)
    # desc_act true where no g_idx reorders (every one arange(K) // group_size): the
    # act-order label says what the data do not have, and makes vLLM >= 0.30 and Humming
    # refuse a checkpoint they would serve; false changes nothing the data hold
    reorders = any(m.act_order for m in ckpt.valid_modules)
    files = [n for n in CONFIG_FILES if (root / n).exists() or (root / n).is_symlink()]
    linked = [n for n in files if (root / n).is_symlink()]
    if linked:
        raise UsageError(
            f"{root / linked[0]}: a symbolic link (a Hugging Face cache snapshot?); its target "
            "is a blob shared by every snapshot with the same file, so fix-label will not "
            "rewrite it. Copy the snapshot first (`cp -rL SNAPSHOT DIR`, or download with "
            "local_dir=DIR) and fix the copy")
    docs = {n: _read(root / n) for n in files}
    declaring = [n for n in files if quant_config(n, docs[n]) is not None]
    if not declaring:
        raise UsageError(f"{root}: no config file holds a quantization config, so there is no "
                         "label to fix; `gptqfmt convert` writes a quantize_config.json "
                         "derived from the data")
    findings: list[Finding] = []
    detected = det.verdict
    where = declaring[0]
    if to == DETECTED:
        if detected == AMBIGUOUS:
            findings.append(Finding(
                "GQ416", "the data do not decide between gptq and gptq_v2: "
                + "; ".join(det.evidence), file=where,
                hint="name the convention with --to gptq or --to gptq_v2 if you know it "
                     "(e.g. from the tool that wrote the checkpoint)"))
            return RelabelPlan(Path(path), root, None, det, [], findings, docs)
        target = detected
    else:
        target = to
        if detected != AMBIGUOUS and detected != to:
            findings.append(Finding(
                "GQ417", f"--to {to}, but the data are {detected} (confidence "
                f"{det.confidence:.4f}); that label would make every runtime read each zero "
                "point off by one", file=where,
                hint=f"run with --to {detected} (or --to detected)",
                details={"requested": to, "detected": detected}))
            return RelabelPlan(Path(path), root, None, det, [], findings, docs)
    agreed = _agreed(ckpt, target, declaring, docs)
    changes = []
    for name in declaring:
        q = quant_config(name, docs[name])
        assert q is not None
        # checkpoint_format and format; auto-round's packing_format (label_values)
        for key, new in label_values(q, target, g_idx).items():
            old = q.get(key)
            if old != new:
                changes.append(LabelChange(name, key, old if isinstance(old, str) or old is None
                                           else json.dumps(old), new))
        changes += [LabelChange(name, key, json.dumps(q[key]), None)
                    for key in legacy_dropped(q)]
        if not reorders and "desc_act" not in agreed and \
                q.get("desc_act", None if is_autoround(q) else True) is True:
            # true where nothing reorders, or missing from GPTQ's config (vLLM refuses one
            # without it; auto-round's own config never has it, and its loaders do not ask)
            changes.append(LabelChange(name, "desc_act", "true" if "desc_act" in q else None,
                                       "false"))
        # keys the files disagree on (GQ205) take the data's value in every file
        for key, value in agreed.items():
            if key in q and q[key] != value:
                changes.append(LabelChange(name, key, json.dumps(q[key]), json.dumps(value)))
    return RelabelPlan(Path(path), root, target, det, changes, findings, docs, g_idx)


def _agreed(ckpt: Checkpoint, convention: str, declaring: list[str], docs: dict) -> dict:
    """The data's value of each quantization key the config files disagree on (GQ205), for
    the data read as `convention`; a key the data do not settle either (the modules differ)
    is left out, and stays a GQ205."""
    seen: dict[str, set[str]] = {}
    for name in declaring:
        q = quant_config(name, docs[name])
        assert q is not None
        for key in COMPARED_KEYS:
            if key in q:
                seen.setdefault(key, set()).add(json.dumps(q[key]))
    disputed = tuple(k for k in COMPARED_KEYS if len(seen.get(k, ())) > 1)
    if not disputed:
        return {}
    return data_values(ckpt, convention, [], keys=disputed)


def _label(q: dict) -> str | None:
    """The label quantization config `q` carries (provenance's `from`): its checkpoint_format,
    else its format, else in auto-round's config the convention its packing_format names;
    None where it names none."""
    for key in ("checkpoint_format", "format"):
        if isinstance(q.get(key), str):
            return q[key]
    if is_autoround(q):
        return AUTOROUND_PACKING.get(q.get(PACKING_KEY, AUTOROUND_DEFAULT))
    return None


def apply_relabel(plan: RelabelPlan) -> list[str]:
    """Write the plan's changes, each file replaced atomically; returns the files written.
    Every new file is staged and fsynced before the first rename, so a failure while staging
    leaves every file as it was. An OSError is one OutputError (exit 2) that names the file
    and says which configs it left rewritten: none, unless it came between the renames."""
    target = plan.target
    if target is None or not plan.changes:
        return []
    root = plan.root
    staged: list[tuple[Path, Path]] = []
    renamed: list[str] = []
    try:
        _remove_stale(root)
        for i, name in enumerate(plan.files):
            dst = root / name
            before = quant_config(name, plan.docs[name])
            assert before is not None   # a file with a change declares
            prov = provenance(_label(before), target, command="fix-label",
                              previous={c.key: before.get(c.key) for c in plan.changes
                                        if c.file == name and c.new is not None})
            tmp = root / f".{name}{TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"
            staged.append((tmp, dst))
            doc = relabelled(name, plan.docs[name], target, prov, relabel=True,
                             g_idx=plan.g_idx)
            for c in plan.changes:
                if c.file == name and c.key in COMPARED_KEYS:
                    q = quant_config(name, doc)
                    assert q is not None and c.new is not None   # a declaring file's key
                    q[c.key] = json.loads(c.new)
            write_beside(dst, tmp, dumps(doc),
                         ("relabel-new", i))
            with naming(dst):
                faults.point("relabel-staged", i)
        # config.json last: vLLM, transformers and SGLang read it first, so until the last
        # rename they still see one consistent (old) label
        for i, (tmp, dst) in enumerate(sorted(staged, key=lambda t: t[1].name == CONFIG_JSON)):
            rename_over(tmp, dst)
            renamed.append(dst.name)
            with naming(dst):
                faults.point("relabel-renamed", i)
        fsync_path(root)
    except OSError as e:
        left = [n for n in plan.files if n not in renamed]
        done = ("nothing was changed" if not renamed else
                f"{', '.join(renamed)} rewritten, {', '.join(left)} not" if left else
                "every config was rewritten")
        again = f"gptqfmt fix-label {plan.path}" + \
            (f" --to {target}" if target != plan.detection.verdict else "")
        raise OutputError.of(e, "cannot write",
                             f"{done}; once that is fixed, run {again}", root) from None
    finally:
        for tmp, _ in staged:  # the ones not renamed (a rename leaves nothing to remove)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return plan.files


def _remove_stale(root: Path) -> None:
    """Temporary config files of an earlier fix-label that was killed (SIGKILL leaves them;
    other signals and errors remove their own): those whose process is gone."""
    for name in CONFIG_FILES:
        prefix = f".{name}{TMP_TAG}"
        for p in root.glob(f"{prefix}*"):
            pid = p.name[len(prefix):].split("-")[0]
            if p.is_file() and not p.is_symlink() and pid.isdigit() and not alive(int(pid)):
                p.unlink()


def _read(p: Path):
    try:
        return json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{p}: cannot read it as JSON ({e}); fix the file first "
                         "(`gptqfmt verify` reports it)") from e


@dataclass(frozen=True)
class RelabelResult:
    """What fix-label did: its plan, the files it wrote, and verify's report afterwards (None
    when refused or a dry run)."""
    plan: RelabelPlan
    dry_run: bool
    written: list[str]
    verify: Report | None = None

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"tool": tool_json(), "path": str(p.path),
                "status": "fail" if p.refused or (self.verify is not None and
                                                  self.verify.failed()) else "ok",
                "dry_run": self.dry_run, "to": p.target,
                "detected": p.detection.to_json(),
                "changes": [c.to_json() for c in p.changes], "written": self.written,
                "findings": [f.to_json() for f in p.findings],
                "verify": self.verify.to_json() if self.verify is not None else None}


def fix_label(path: str | os.PathLike, to: str = DETECTED, dry_run: bool = False,
              progress: Progress | None = None) -> RelabelResult:
    """Plan, write (unless `dry_run` or refused) and verify: the library form of
    `gptqfmt fix-label`. `progress` hears of the detection's and verify's phases."""
    plan = plan_relabel(path, to, progress=progress)
    if plan.refused or dry_run:
        return RelabelResult(plan, dry_run, [])
    written = apply_relabel(plan)
    return RelabelResult(plan, dry_run, written, validate(path, progress=progress))
