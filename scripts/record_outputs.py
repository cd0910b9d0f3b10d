#!/usr/bin/env python3
"""What inspect, verify and convert print on every shipped fixture (the JSON documents and the
text reports), as one file: a record to diff a refactoring against (a redesign must leave every
byte of them unchanged).

For each directory under fixtures/ckpt, fixtures/invalid, fixtures/hostile and fixtures/formats
it runs, in process, with --format json and with --format text: `inspect`, `verify`,
`fix-label --dry-run` (which writes nothing), `convert SRC DST --to T` into a temporary DST
with T each convention (and compressed-tensors for fixtures/formats), and `verify DST
--against SRC` where the conversion succeeded. It keeps each command's exit code and stdout,
with three things that differ from run to run replaced: the temporary directory (<TMP>), the
repository's directory (<ROOT>) and the tool's version.

    python3 scripts/record_outputs.py --write OUT.json    # record
    python3 scripts/record_outputs.py --check OUT.json    # exit 1 and name what differs

tests/cli/test_recorded_outputs.py checks the record committed in tests/golden/.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from click.testing import CliRunner  # noqa: E402

from gptqfmt.cli import main  # noqa: E402
from gptqfmt.cli.view import WIDTH, wrapped  # noqa: E402
from gptqfmt.version import __version__  # noqa: E402

KINDS = ("ckpt", "invalid", "hostile", "formats")
CONVENTIONS = ("gptq", "gptq_v2")
TARGETS = {"formats": ("gptq", "gptq_v2", "compressed-tensors")}  # else CONVENTIONS
FORMATS = ("json", "text")


def fixture_dirs(root: Path = ROOT / "fixtures") -> list[Path]:
    return sorted(p for kind in KINDS for p in (root / kind).iterdir() if p.is_dir())


def run(args: list[str], tmp: Path) -> dict:
    """One command's exit code and stdout, with the paths of this machine as <ROOT> and <TMP>.
    Text is printed unwrapped, the paths replaced, and then wrapped at the width a person
    sees, as the reporter wraps it: where a line breaks must not depend on where the
    checkout lies."""
    r = CliRunner(env={"GPTQFMT_WIDTH": "0"}).invoke(main, args, catch_exceptions=False)
    out = r.stdout.replace(str(tmp), "<TMP>").replace(str(ROOT), "<ROOT>").replace(
        f'"version": "{__version__}"', '"version": "<VERSION>"')
    if "--format" in args and args[args.index("--format") + 1] == "text":
        out = "".join(piece + "\n" for line in out.splitlines() for piece in wrapped(line, WIDTH))
    return {"exit": r.exit_code, "stdout": out}


def outputs() -> dict[str, dict]:
    """{"command fixture": {"exit": code, "stdout": text}} over every fixture directory, for
    --format json and, under keys that start with "text ", --format text."""
    record: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for d in fixture_dirs():
            name = f"{d.parent.name}/{d.name}"
            src = str(d)
            for fmt in FORMATS:
                key = "" if fmt == "json" else f"{fmt} "
                opts = ["--format", fmt]
                record[f"{key}inspect {name}"] = run(["inspect", src, *opts], tmp)
                record[f"{key}verify {name}"] = run(["verify", src, *opts], tmp)
                record[f"{key}fix-label --dry-run {name}"] = run(
                    ["fix-label", src, "--dry-run", *opts], tmp)
                for to in TARGETS.get(d.parent.name, CONVENTIONS):
                    dst = tmp / f"{d.parent.name}-{d.name}-{to}-{fmt}"
                    got = run(["convert", src, str(dst), "--to", to, *opts], tmp)
                    record[f"{key}convert {name} --to {to}"] = got
                    if got["exit"] == 0:
                        record[f"{key}verify --against {name} --to {to}"] = run(
                            ["verify", str(dst), "--against", src, *opts], tmp)
    return record


def main_(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path)
    g.add_argument("--check", type=Path)
    a = ap.parse_args(argv)
    got = outputs()
    if a.write:
        a.write.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} outputs to {a.write}", file=sys.stderr)
        return 0
    want = json.loads(a.check.read_text())
    differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    for k in differ:
        print(f"differs: {k}", file=sys.stderr)
    print(f"{len(got) - len(differ)} of {len(set(got) | set(want))} outputs identical",
          file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main_())
