"""A test hook: stop the process at a named stage, or fail its I/O there, so that tests of
kills, signals and I/O errors are deterministic (no sleeps, no racing a timer against the work,
no full disk to fill).

Set ``GPTQFMT_FAULT=stage[:n][:SIGNAL]`` in the environment of a gptqfmt process. When that
process reaches `stage` with index `n`, it sends itself SIGNAL (default SIGKILL) with
``os.kill(os.getpid(), ...)``, as ``kill`` or ``timeout`` would. SIGKILL ends it on the spot; a
signal the CLI handles (SIGINT, SIGTERM, SIGHUP) unwinds it as a real one does. It fires once.

``stage[:n]:ERRNO`` (an errno name: ENOSPC, EROFS, EACCES, EIO, ENOENT, ...) raises
``OSError(errno, strerror)`` there instead, without a file name, as a failed write(2) or
fsync(2) reaches Python: the I/O step the stage stands at fails, and the code around it must
name the file itself. Several specs separated by commas each fire once (an error, then a
second one in the rollback it causes: ``inplace-range:3:EIO,inplace-rollback:1:ENOSPC``).

`n` is the stage's index, counted from 0, for the stages that have one: ``S.T`` for
``mid-shard`` (shard S in sorted order, its qzeros tensor T in file order), ``M`` for
``gate-module``, ``R`` for ``detect-round`` (0: the first); missing parts are 0. Examples:
``mid-shard:2.1`` kills the process after the second qzeros tensor of the third shard has been
written; ``before-rename:SIGTERM`` sends SIGTERM just before the staging directory becomes
DST. The stages are listed in `STAGES`.

The variable is read once, when this module is imported. Unset, `point` is a function that
returns at once. A malformed value raises ValueError at the first stage reached. The hook
fires in the process that reaches the stage: with ``convert --jobs N`` the shards, and so
``mid-shard``, are written in worker processes.
Not for use outside tests.
"""
from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from typing import NoReturn

ENV = "GPTQFMT_FAULT"

# stage -> (where it is, how many index parts it takes)
STAGES = {
    "start": ("gptqfmt.cli.run, before the command line's modules are imported and its signal "
              "handlers set (SIGINT there is a KeyboardInterrupt)", 0),
    "command": ("cli.main.run, its signal handlers set, before the command is parsed and run",
                0),
    "staging-created": ("convert: the staging directory beside DST exists, empty", 0),
    "mid-shard": ("convert: shard S written up to and including its qzeros tensor T (file "
                  "order); the rest of the shard is not", 2),
    "shards-written": ("convert: every shard written (not yet fsynced); other files and "
                       "configs not yet", 0),
    "before-gate": ("convert: the staging directory complete, before the verify gate", 0),
    "gate-module": ("convert: the verify gate has checked module M (0-based)", 1),
    "before-fsync": ("convert: gate passed, before the staging directory is fsynced", 0),
    "before-rename": ("convert: everything fsynced, before the rename to DST", 0),
    "detect-round": ("inspect (and convert's detection): round R of module reads done, in the "
                     "parent, its worker processes or threads still running", 1),
    "after-rename": ("convert: DST in place, before its parent directory is fsynced", 0),
    "relabel-new": ("fix-label: config file F's new copy created beside it, still empty", 1),
    "relabel-staged": ("fix-label: config file F (0-based, in the order written) staged and "
                       "fsynced beside it, none renamed yet", 1),
    "relabel-renamed": ("fix-label: config file F renamed over the old one", 1),
    "inplace-open": ("convert --in-place: shard S (0-based, of those with ranges to change, in "
                     "journal order) about to be opened for writing; the journal not sealed", 1),
    "inplace-journal": ("convert --in-place: the unsealed undo journal (.gptqfmt-journal.tmp) "
                        "holds E entries (ranges in file order, then configs); E 0: about to be "
                        "created", 1),
    "inplace-config-new": ("convert --in-place: config file F's new copy "
                           "(.NAME.gptqfmt-journal-new) created beside it, still empty; the "
                           "journal not sealed", 1),
    "inplace-journaled": ("convert --in-place: the undo journal durable, nothing overwritten",
                          0),
    "inplace-range": ("convert --in-place: qzeros range R (0-based, in journal order) "
                      "overwritten, not yet fsynced", 1),
    "inplace-synced": ("convert --in-place: every range overwritten and fsynced; configs old",
                       0),
    "inplace-config": ("convert --in-place: config file F (0-based) replaced", 1),
    "inplace-complete": ("convert --in-place: the journal marked complete, not yet removed", 0),
    "inplace-rollback": ("recovery or a failed convert --in-place: change C (0-based, journal "
                         "order) written back (only changes that need it are)", 1),
}


@dataclass(frozen=True)
class Fail:
    """What an ERRNO spec does at its stage: raise OSError(errno, strerror), no file name."""
    errno: int

    def __call__(self) -> NoReturn:
        raise OSError(self.errno, os.strerror(self.errno))


def _parse(spec: str) -> tuple[str, tuple[int, ...], int | Fail]:
    """'mid-shard:2.1:SIGTERM' -> ('mid-shard', (2, 1), 15); 'inplace-range:3:EIO' ->
    ('inplace-range', (3,), Fail(5)); ValueError when malformed."""
    stage, *rest = spec.split(":")
    if stage not in STAGES or len(rest) > 2:
        raise ValueError(f"{ENV}={spec!r}: expected stage[:n][:SIGNAL|:ERRNO] with a stage in "
                         f"{', '.join(STAGES)}")
    arity = STAGES[stage][1]
    index: tuple[int, ...] = (0,) * arity
    action: int | Fail = signal.SIGKILL
    if rest and rest[0][:1].isdigit():
        parts = rest.pop(0).split(".")
        if not all(x.isdigit() for x in parts) or len(parts) > max(arity, 1) or \
                (arity == 0 and parts != ["0"]):
            raise ValueError(f"{ENV}={spec!r}: {stage} takes {arity} index part(s)")
        index = (tuple(map(int, parts)) + (0,) * arity)[:arity]
    if rest:
        name = rest.pop(0).upper()
        if name.startswith("E") and isinstance(getattr(errno, name, None), int):
            action = Fail(getattr(errno, name))
        else:
            try:
                action = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
            except KeyError:
                raise ValueError(f"{ENV}={spec!r}: {name!r} is neither a signal nor an errno "
                                 "name") from None
    if rest:
        raise ValueError(f"{ENV}={spec!r}: expected stage[:n][:SIGNAL|:ERRNO]")
    return stage, index, action if isinstance(action, Fail) else int(action)


def _armed(spec: str):
    """The hook for a GPTQFMT_FAULT value (one spec, or several separated by commas): each
    fires once, at the stage and index it names."""
    try:
        faults = [_parse(one) for one in spec.split(",")]
    except ValueError as e:
        error = e

        def malformed(at: str, *at_index: int) -> None:
            raise error
        return malformed
    fired: set[int] = set()

    def armed(at: str, *at_index: int) -> None:
        for i, (stage, index, action) in enumerate(faults):
            if at == stage and at_index == index and i not in fired:
                fired.add(i)
                if isinstance(action, Fail):
                    action()
                # SIGKILL: gone; a handled signal runs its handler here
                os.kill(os.getpid(), action)
    return armed


def _unset(stage: str, *index: int) -> None:
    """GPTQFMT_FAULT is not set: nothing to do."""


_SPEC = os.environ.get(ENV)
#: point(stage, *index): stop the process here (or fail its I/O here) when GPTQFMT_FAULT names
#: this stage and index.
point = _armed(_SPEC) if _SPEC else _unset
