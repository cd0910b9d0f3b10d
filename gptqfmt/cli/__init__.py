"""Command-line interface: thin click commands and reporters. The only place that prints or
exits."""
from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

    from .main import main

__all__ = ["main", "run"]


def __getattr__(name: str) -> Any:
    """`main`, the command group, imported from main.py when first asked for: importing this
    package or one of its modules (output.py, view.py) does not load the commands."""
    if name == "main":
        from .main import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """This package as a module object: importing main.py binds the name `main` here to the
    command group it defines, not to the module (`gptqfmt.cli.main` is the group)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "main" and isinstance(value, types.ModuleType):
            value = value.main
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def run(argv: list[str] | None = None, command: click.Command | None = None,
        prog_name: str = "gptqfmt") -> None:
    """The console entry point (`gptqfmt`, `python -m gptqfmt`): main.run, imported only now,
    so that a Ctrl-C while the command line loads, before main.run sets its signal handlers,
    is caught too: one line (or one JSON document) and exit 130, never a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from .. import faults

        try:
            faults.point("start")
        except ValueError:
            pass  # a malformed GPTQFMT_FAULT: main.run reports it, at the "command" stage
        from .main import run as run_command
    except KeyboardInterrupt:
        from .main import interrupted_at_start

        raise SystemExit(interrupted_at_start(args)) from None
    run_command(args, command, prog_name)

