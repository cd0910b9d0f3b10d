"""`gptqfmt doctor PATH --runtime ID[@VERSION]`: whether one runtime will load a checkpoint
and compute the weights its data mean, the cheapest lossless plan that makes it so, and
(`fix`) that plan carried out with the commands' own code and the result judged again.

The answer is verify's: every check over all the data, then the runtime table
(runtimes/table.py) applied at the version asked. The plan's candidates are judged as each
would leave the checkpoint, without writing anything (runtimes.verdicts.Scenario), cheapest
first:

1. `fix-label`: the configs only (the convention label, `desc_act` where every g_idx is
   arange(K) // group_size, keys a loader refuses by name): seconds, no tensor touched;
2. `convert --in-place` (or to DST) into the other convention: the zero points rewritten,
   refused where a field cannot be held exactly (convert's own plan decides);
3. `convert --to compressed-tensors`, for a runtime that reads it where its GPTQ path does
   not serve (runtimes.table.COMPRESSED_TENSORS_ROUTES).

Where none works, the runtime versions and other runtimes that serve it as it is are named,
and why each candidate fails: no lossless way (requantizing is then the honest answer).
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .bits.conventions import CONVENTIONS, GPTQ, GPTQ_V2
from .conversion.plan import plan_conversion
from .conversion.relabel import LabelChange, fix_label, plan_relabel
from .conversion.run import convert
from .detection.decide import AMBIGUOUS
from .detection.pool import Detection
from .errors import FindingError, UsageError
from .findings import ERROR, Finding
from .formats.gptq.checkpoint import Checkpoint
from .formats.open import open_source
from .formats.source import Source
from .ops.inspect import inspect_checkpoint
from .ops.remote import mounted, said_of_repo
from .ops.reports import Progress, Result, tool_json
from .ops.verify import validate
from .runtimes import rules as rt
from .runtimes.table import COMPRESSED_TENSORS_ROUTES, RUNTIMES, family_entries, resolve
from .runtimes.verdicts import (
    DEFAULT_CAPABILITY,
    NONE,
    RuntimeVerdict,
    Scenario,
    assess,
    config_facts,
)
from .safetensors_io.remote import Hub

SERVES, REFUSES, MISCOMPUTES, UNDECIDED, BROKEN = (
    "serves", "refuses", "miscomputes", "undecided", "broken")
ANSWERS = (SERVES, REFUSES, MISCOMPUTES, UNDECIDED, BROKEN)
# findings a plan step can clear (the labels, what runtimes make of them); any other error
# is a fault in the checkpoint itself, which no relabel or conversion repairs
PLANNABLE = ("GQ204", "GQ212", "GQ401")


def quoted(path: str | os.PathLike[str]) -> str:
    return shlex.quote(str(path))


@dataclass(frozen=True)
class Step:
    """One command of a plan, as the user would type it, and what it changes."""
    action: str              # "fix-label", "convert-in-place", "convert", "copy"
    command: str
    does: str
    to: str | None = None            # the convention or format written
    src_convention: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "command": self.command, "does": self.does}


@dataclass
class Plan:
    """The cheapest lossless way to the right weights under the runtime (no steps: none, or
    nothing to do), what it was judged to give, and why the cheaper candidates do not."""
    steps: list[Step] = field(default_factory=list)
    expect: str | None = None            # the answer after the steps, as judged
    tried: list[str] = field(default_factory=list)      # candidates that fail, and why
    elsewhere: list[str] = field(default_factory=list)  # what serves it as it is

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps], "expect": self.expect,
                "tried": self.tried, "elsewhere": self.elsewhere}


@dataclass
class Fixed:
    """--fix: the steps run (command, exit 0 or the error that stopped it), the checkpoint
    they left (PATH itself in place, else DST) and its diagnosis."""
    output: str
    ran: list[tuple[Step, str | None]]
    after: "Diagnosis | None"

    @property
    def ok(self) -> bool:
        return self.after is not None and self.after.answer == SERVES

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output,
                "steps": [{**s.to_json(), "error": err} for s, err in self.ran],
                "after": self.after.summary_json() if self.after else None, "ok": self.ok}


@dataclass
class Diagnosis:
    """One runtime's answer on one checkpoint, with the reason and the plan."""
    path: str
    runtime: rt.Runtime
    version: tuple[int, ...] | None
    answer: str
    headline: str
    reason: str
    modules_wrong: int
    modules: int
    verdict: RuntimeVerdict | None
    detection: Detection | None
    blocking: list[Finding]
    plan: Plan
    notes: list[str] = field(default_factory=list)
    fixed: Fixed | None = None
    remote: dict[str, Any] | None = None    # a Hub repo read over HTTP: ops.remote.record

    @property
    def ok(self) -> bool:
        """Exit 0: the runtime computes the right weights (after --fix, when asked)."""
        return self.fixed.ok if self.fixed is not None else self.answer == SERVES

    def summary_json(self) -> dict[str, Any]:
        return {"answer": self.answer, "headline": self.headline, "reason": self.reason,
                "modules_wrong": self.modules_wrong, "modules": self.modules}

    def to_json(self) -> dict[str, Any]:
        r = self.runtime
        return {"tool": tool_json(), "path": self.path,
                "status": "ok" if self.ok else "fail",
                "runtime": {"id": r.id, "family": r.family, "name": r.name,
                            "versions": r.versions, "version": _dotted(self.version)},
                **self.summary_json(),
                "detected": self.detection.verdict if self.detection else None,
                "verdict": self.verdict.to_json() if self.verdict else None,
                "findings": [f.to_json() for f in self.blocking],
                "plan": self.plan.to_json(), "notes": self.notes,
                "fix": self.fixed.to_json() if self.fixed else None,
                **({"remote": self.remote} if self.remote is not None else {})}


def doctor_remote(repo: str, runtime: str = "vllm", *, capability: int = DEFAULT_CAPABILITY,
                  hub: Hub | None = None, progress: Progress | None = None) -> Diagnosis:
    """`gptqfmt doctor ORG/NAME[@REVISION] --remote`: the answer on the repo read over HTTP
    range requests, judged on inspect's reads (doctor's `bounded`). A plan's commands run on a
    local copy: its first step is the download that makes it."""
    with mounted(repo, hub) as mirror:
        diag = doctor(mirror.root, runtime, capability=capability, bounded=True,
                      progress=progress)
        diag = said_of_repo(diag, mirror, repo)
    rec = diag.remote
    assert rec is not None
    if diag.plan.steps:
        diag.plan.steps.insert(0, Step(
            "download", rec["download"], f"fetches the checkpoint ({rec['checkpoint_bytes']} "
            f"bytes) at commit {rec['commit'][:12]} to {rec['local_dir']}, where the steps "
            "below run"))
    return diag


def _dotted(v: tuple[int, ...] | None) -> str | None:
    return ".".join(map(str, v)) if v is not None else None


def doctor(path: str | os.PathLike[str], runtime: str = "vllm", *,
           capability: int = DEFAULT_CAPABILITY, dst: str | os.PathLike[str] | None = None,
           fix: bool = False, in_place: bool = False, bounded: bool = False,
           progress: Progress | None = None) -> Diagnosis:
    """The library form of `gptqfmt doctor`: `runtime` is an id or family, with an optional
    @VERSION ("vllm", "vllm@0.25", "sglang-gptq-gemm"). With `fix`, the plan is carried out
    into `dst` (a new directory) or, with `in_place`, on `path` itself, and the result judged
    again (Diagnosis.fixed). Raises UsageError for a runtime the table does not know, a
    checkpoint in another format, or --fix without a destination. `progress` hears of every
    phase (reports.Progress): verify's, the plan's checks, and with `fix` those of the steps
    and of the verify after them. `bounded`: judge on inspect's reads instead of verify's
    (qzeros, g_idx, a sample of qweight; no scales, so no weight change is measured), as
    doctor --remote does."""
    entry, version, notes = resolve(runtime)
    if fix and (dst is None) == (not in_place):
        raise UsageError("--fix needs a destination: --fix DST writes a fixed copy, --fix "
                         "--in-place fixes PATH itself")
    if dst is not None and not fix:
        raise UsageError("DST is where --fix writes; without --fix doctor writes nothing")
    if fix and bounded:
        raise UsageError("--fix runs on every byte of the checkpoint; judge it with its reads "
                         "unbounded")
    diag = _diagnose(str(path), entry, version, capability, progress, dst, bounded)
    diag.notes[:0] = notes
    if fix:
        diag.fixed = _carry_out(diag, str(path), dst, entry, version, capability, progress)
    return diag


def _diagnose(path: str, entry: rt.Runtime, version: tuple[int, ...] | None,
              capability: int, progress: Progress | None,
              dst: str | os.PathLike[str] | None, bounded: bool = False) -> Diagnosis:
    source = open_source(path)
    fmt = source.format
    source.close()
    if fmt not in CONVENTIONS:
        raise UsageError(f"{path}: a {fmt} checkpoint; doctor judges GPTQ checkpoints against "
                         "the runtime table (a format that stores its zero points exactly "
                         "has no convention for a runtime to misread)")
    report: Result = inspect_checkpoint(path) if bounded else validate(path, progress=progress)
    det = report.detection
    blocking = [f for f in report.findings if f.severity == ERROR and f.code not in PLANNABLE
                and not f.code.startswith("GQ6")]
    src, ckpt = report.source, report.source.labelled   # verify's open, its detection
    assert ckpt is not None   # a GPTQ source
    try:
        modules = len([m for m in ckpt.valid_modules if m.declared is not None])
        if blocking or det is None:
            first = blocking[0] if blocking else None
            return Diagnosis(
                path, entry, version, BROKEN,
                f"{_who(entry, version)}: no answer: the checkpoint fails verify "
                f"({len(blocking)} error{'s' if len(blocking) != 1 else ''})",
                first.one_line() if first else "nothing to judge", 0, modules, None, det,
                blocking, Plan(tried=[f"fix what verify reports first: `gptqfmt verify "
                                     f"{quoted(path)}`"]))
        verdict = _judge(ckpt, det, entry, version, capability, NONE, not bounded)
        answer, headline, reason, wrong = _answer(verdict, entry, version, modules)
        plan = Plan() if answer == SERVES else \
            _plan(ckpt, det, src, entry, version, capability, path, dst, report, progress,
                  bounded)
    finally:
        src.close()
    return Diagnosis(path, entry, version, answer, headline, reason, wrong, modules, verdict,
                     det, [], plan)


def _judge(ckpt: Checkpoint, det: Detection, entry: rt.Runtime,
           version: tuple[int, ...] | None, capability: int, scenario: Scenario,
           scales: bool = True) -> RuntimeVerdict:
    [v] = assess(ckpt, det, scales=scales, capability=capability, runtimes=[entry],
                 scenario=replace(scenario, version=version))
    return v


def _serves(v: RuntimeVerdict) -> bool:
    return v.loads and v.decodes_correctly is True


def _who(entry: rt.Runtime, version: tuple[int, ...] | None) -> str:
    name = entry.name.split(" (")[0]
    return f"{name} {_dotted(version)}" if version is not None else \
        f"{entry.name} {entry.versions}"


def _answer(v: RuntimeVerdict, entry: rt.Runtime, version: tuple[int, ...] | None,
            modules: int) -> tuple[str, str, str, int]:
    who = _who(entry, version)
    if not v.loads:
        return (REFUSES, f"{who} will not load it",
                "; ".join(x for x in v.reasons if not x.startswith("next step")) or
                "no kernel path takes it", 0)
    t = v.taken
    assert t is not None   # it loads
    if v.decodes_correctly is None:
        return (UNDECIDED, f"{who} will load it; whether it computes the right weights is "
                "not known", "; ".join(v.reasons), 0)
    if v.decodes_correctly:
        return (SERVES, f"{who} will load it and compute the right weights",
                f"{t.path.label}: " + "; ".join(v.reasons), 0)
    return (MISCOMPUTES, f"{who} will load it and compute wrong weights in "
            f"{t.modules_affected} of {modules} modules", f"{t.path.label}: "
            + "; ".join(v.reasons), t.modules_affected)


# ---------------------------------------------------------------- the plan

def _plan(ckpt: Checkpoint, det: Detection, src: Source, entry: rt.Runtime,
          version: tuple[int, ...] | None, capability: int, path: str,
          dst: str | os.PathLike[str] | None, report: Result,
          progress: Progress | None = None, bounded: bool = False) -> Plan:
    plan = Plan()

    def judge(scenario: Scenario) -> RuntimeVerdict:
        # the weight change (scales) only where a verdict's words are shown: not bounded
        return _judge(ckpt, det, entry, version, capability, scenario, not bounded)

    def serves(scenario: Scenario) -> bool:   # a yes or no needs no scales
        return _serves(_judge(ckpt, det, entry, version, capability, scenario, False))

    truth = det.verdict if det.verdict != AMBIGUOUS else None
    relabel = _relabel(path, det)
    # what fix-label writes besides the label: desc_act false where no g_idx reorders (also
    # after a convert, which keeps desc_act)
    act = any(c.key == "desc_act" for c in relabel)
    p, d = quoted(path), quoted(dst if dst is not None else _default_dst(path, entry))
    if truth is None:
        plan.tried.append("the data do not decide between gptq and gptq_v2, so no plan can "
                          "be judged; if you know which they are: `gptqfmt fix-label "
                          f"{p} --to gptq` (or gptq_v2), then doctor again")
        plan.elsewhere = _elsewhere(report, entry, ckpt, det, capability)
        return plan
    if relabel:
        v = judge(Scenario(label=truth, no_act_order=act, drop_legacy=True))
        keys = " and ".join(dict.fromkeys(c.key for c in relabel))
        what = f"{keys} in {' and '.join(dict.fromkeys(c.file for c in relabel))}"
        if _serves(v):
            if dst is None:
                plan.steps = [Step("fix-label", f"gptqfmt fix-label {p}",
                                   f"rewrites {what}; no tensor touched", truth)]
            else:   # convert writes the label the data have, and keeps every field
                plan.steps = [Step("copy", f"gptqfmt convert {p} {d} --from {truth} --to {truth}",
                                   f"writes a copy labelled {truth} (proven equal before it is "
                                   "kept)", truth, truth)]
                if act and not serves(Scenario(label=truth, drop_legacy=True)):
                    plan.steps.append(Step("fix-label", f"gptqfmt fix-label {d}",
                                           "rewrites desc_act false (no g_idx reorders)", truth))
            plan.expect = _answer(v, entry, version, 0)[1]
            return plan
        plan.tried.append(f"fix-label ({what}): " + _short(v))
    other = GPTQ_V2 if truth == GPTQ else GPTQ
    why_not = _lossless(src, det, truth, other, progress, full=not bounded)
    if why_not:
        plan.tried.append(f"convert to {other}: {why_not}")
    else:
        # desc_act rewritten only where the runtime needs it (convert keeps the configs' value)
        v = judge(Scenario(label=other, drop_legacy=True, convention=other))
        act_needed = act and not _serves(v)
        if act_needed:
            v = judge(Scenario(label=other, no_act_order=True, drop_legacy=True,
                               convention=other))
        if _serves(v):
            if dst is None:
                steps = [Step("convert-in-place",
                              f"gptqfmt convert {p} --in-place --from {truth} --to {other}",
                              f"rewrites the zero points as {other} and the label, in place "
                              "(journalled; proven equal before it is kept)", other, truth)]
                target = p
            else:
                steps = [Step("convert", f"gptqfmt convert {p} {d} --from {truth} --to {other}",
                              f"writes a copy with the zero points as {other} (proven equal "
                              "before it is kept)", other, truth)]
                target = d
            if act_needed:
                steps.append(Step("fix-label", f"gptqfmt fix-label {target}",
                                  "rewrites desc_act false (no g_idx reorders)", other))
            plan.steps, plan.expect = steps, _answer(v, entry, version, 0)[1]
            return plan
        plan.tried.append(f"convert to {other}: " + _short(v))
    route = COMPRESSED_TENSORS_ROUTES.get(entry.family)
    if route is not None:
        fails = route.refuses(replace(config_facts(ckpt, capability), version=version))
        if fails:
            plan.tried.append(f"convert --to compressed-tensors: {route.name}: {fails}")
        else:
            why_ct = _lossless(src, det, truth, "compressed-tensors", progress,
                               full=not bounded)
            if why_ct:
                plan.tried.append(f"convert --to compressed-tensors: {why_ct}")
            else:
                plan.steps = [Step("convert", f"gptqfmt convert {p} {d} --from {truth} --to "
                                   "compressed-tensors", "writes a compressed-tensors copy "
                                   "(pack-quantized, zero points stored exactly; proven "
                                   "equal before it is kept)", "compressed-tensors", truth)]
                plan.expect = (f"{route.name} will load it and compute the right weights "
                               f"({route.how})")
                return plan
    plan.elsewhere = _elsewhere(report, entry, ckpt, det, capability)
    return plan


def _default_dst(path: str, entry: rt.Runtime) -> str:
    p = Path(path)
    root = p.parent if p.is_file() else p
    return str(root.with_name(f"{root.name}-{entry.family or entry.id}"))


def _relabel(path: str, det: Detection) -> list[LabelChange]:
    """What fix-label would rewrite (its own plan; none where it cannot relabel at all)."""
    try:
        return plan_relabel(path, detection=det).changes
    except UsageError:
        return []


def _lossless(src: Source, det: Detection, truth: str, to: str,
              progress: Progress | None = None, full: bool = True) -> str | None:
    """None where convert's own plan converts `src` (read as `truth`) into `to` exactly, else
    its refusal, in one line."""
    try:
        plan_conversion(src, truth, to, allow_lossy=False, detection=det, progress=progress,
                        full=full)
    except FindingError as e:
        return e.findings[0].message if e.findings else str(e)
    except UsageError as e:
        return str(e)
    return None


def _short(v: RuntimeVerdict) -> str:
    if not v.loads:
        return "it would still not load it: " + "; ".join(
            x for x in v.reasons if not x.startswith("next step"))
    if v.decodes_correctly is False and v.taken is not None:
        return "it would still compute wrong weights: " + "; ".join(v.reasons)
    return "; ".join(v.reasons)


def _elsewhere(report: Result, entry: rt.Runtime, ckpt: Checkpoint, det: Detection,
               capability: int) -> list[str]:
    """The versions of the same runtime, then the other runtimes, that serve it as it is."""
    out = []
    for other, since, before in _version_spans(entry):
        v = _judge(ckpt, det, other, since, capability, NONE, scales=False)   # serves or not
        if _serves(v):
            out.append(f"{other.name.split(' (')[0]} {_span(since, before)}")
    seen = {e.id for e in family_entries(entry.family)}
    for v in report.runtimes or []:
        if v.runtime.id not in seen and _serves(v):
            out.append(f"{v.runtime.name} {v.runtime.versions}")
    return out


def _version_spans(entry: rt.Runtime
                   ) -> list[tuple[rt.Runtime, tuple[int, ...], tuple[int, ...] | None]]:
    """(entry, first version, end) of each span of the family where the rules are the same:
    split at every rule's `since`."""
    out = []
    for e in family_entries(entry.family):
        cuts = sorted({r.since for r in _rules(e) if r.since is not None and e.covers(r.since)})
        starts = [e.since or (0,)] + cuts
        ends = cuts + [e.before]
        for s, b in zip(starts, ends):
            out.append((e, s, b))
    return out


def _rules(e: rt.Runtime) -> list[rt.Rule]:
    return list(e.requires) + [r for p in e.paths for r in p.when + p.requires]


def _span(since: tuple[int, ...], before: tuple[int, ...] | None) -> str:
    lo = f">= {_dotted(since)}" if since != (0,) else ""
    hi = f"< {_dotted(before)}" if before is not None else ""
    return ", ".join(x for x in (lo, hi) if x) or "(every version)"


# ---------------------------------------------------------------- --fix

def _carry_out(diag: Diagnosis, path: str, dst: str | os.PathLike[str] | None,
               entry: rt.Runtime, version: tuple[int, ...] | None, capability: int,
               progress: Progress | None) -> Fixed:
    """Run the plan's steps with the commands' library code (each with its own proof and
    refusals); stop at the first that fails; judge what they left."""
    out = str(dst) if dst is not None else path
    ran: list[tuple[Step, str | None]] = []
    if not diag.plan.steps:
        if diag.answer == SERVES:
            # nothing to fix: PATH itself is the answer, and DST is not written
            return Fixed(path, ran, diag)
        return Fixed(out, ran, None)
    if dst is None and not in_place_possible(diag.plan):
        # a format's re-layout is never written over its source
        step = next(s for s in diag.plan.steps if s.to not in CONVENTIONS)
        return Fixed(out, [(step, f"writes a new directory, not in place: run `gptqfmt doctor "
                                  f"{quoted(path)} --runtime {_spec(entry, version)} --fix DST`")],
                     None)
    for step in diag.plan.steps:
        try:
            _run(step, path, dst, progress)
        except (FindingError, UsageError, OSError) as e:
            msg = (e.findings[0].one_line() if isinstance(e, FindingError) and e.findings
                   else str(e))
            ran.append((step, msg))
            return Fixed(out, ran, None)
        ran.append((step, None))
    if diag.plan.steps[-1].to in CONVENTIONS:
        return Fixed(out, ran, _diagnose(out, entry, version, capability, progress, None))
    return Fixed(out, ran, _diagnose_format(out, entry, version, progress))


def _diagnose_format(path: str, entry: rt.Runtime, version: tuple[int, ...] | None,
                     progress: Progress | None) -> Diagnosis:
    """The answer on a checkpoint the plan converted into another format: verify's checks
    (convert proved it computes what the source does), then the route's conditions."""
    route = COMPRESSED_TENSORS_ROUTES[entry.family]
    report = validate(path, progress=progress)
    errors = [f for f in report.findings if f.severity == ERROR]
    modules = len(report.source.modules)
    report.source.close()
    if errors:
        return Diagnosis(path, entry, version, BROKEN, f"{route.name}: no answer: the output "
                         f"fails verify", errors[0].one_line(), 0, modules, None, None, errors,
                         Plan())
    return Diagnosis(path, entry, version, SERVES, f"{route.name} will load it and compute the "
                     "right weights", route.how, 0, modules, None, None, [], Plan())


def _spec(entry: rt.Runtime, version: tuple[int, ...] | None) -> str:
    return entry.id + (f"@{_dotted(version)}" if version is not None else "")


def in_place_possible(plan: Plan) -> bool:
    """Whether --fix --in-place can carry the plan out (a conversion between formats writes a
    new directory)."""
    return all(s.to in CONVENTIONS for s in plan.steps)


def _run(step: Step, path: str, dst: str | os.PathLike[str] | None,
         progress: Progress | None = None) -> None:
    if step.action == "fix-label":
        target = str(dst) if dst is not None else path
        result = fix_label(target, progress=progress)
        if result.plan.refused:
            raise FindingError(*result.plan.findings)
    elif step.action == "convert-in-place":
        convert(path, None, to=step.to or GPTQ_V2, src_convention=step.src_convention or "auto",
                in_place=True, progress=progress, on_module=progress)
    else:   # "convert", "copy": into DST
        convert(path, dst, to=step.to or GPTQ_V2, src_convention=step.src_convention or "auto",
                progress=progress, on_module=progress)


__all__ = ["ANSWERS", "Diagnosis", "Plan", "Step", "doctor", "doctor_remote", "RUNTIMES"]
