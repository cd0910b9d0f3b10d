#!/usr/bin/env python3
"""Re-run the example commands of README.md and docs/*.md and put their real output in place,
so that no example shows an output the tool does not print.

An example is a block between two markers; the comments under the first say what to run:

    <!-- example:NAME:begin -->
    <!-- cp -r fixtures/ckpt/SRC model -->        set-up (optional): copy a fixture,
    <!-- hf-cache ORG/NAME fixtures/ckpt/SRC COMMIT -->   or make it a Hugging Face cache entry
    <!-- flip-bit FILE -->                         (HF_HUB_CACHE=hf-cache), or flip a bit of a file
    <!-- $ gptqfmt verify ./model -->             each command, run in order
    ```console
    $ gptqfmt verify ./model
    ...what it printed, stdout and stderr in the order a terminal shows them...
    ```
    <!-- example:NAME:end -->

Each example runs in a fresh temporary directory that holds `fixtures`, a link to the
repository's, so every command runs exactly as written (relative paths, a DST such as
./model-v2) and its output names the paths as written. Commands are `gptqfmt` (run as
gptqfmt.cli.main.run, from this tree) and `gptqfmt-pre-commit`; no shell is involved. Where an
output names the temporary directory or the repository's, it reads `.`; the tool's version, as
`gptqfmt VERSION` or a JSON `"version"`, reads `<VERSION>`.

    python3 scripts/readme_examples.py --write   # rewrite every block
    python3 scripts/readme_examples.py --check   # exit 1 and name the blocks that differ

tests/project/test_readme.py runs --check.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENTRY = {"gptqfmt": "from gptqfmt.cli.main import run",
         "gptqfmt-pre-commit": "from gptqfmt.cli.precommit import run"}
BLOCK = re.compile(
    r"^(?P<begin><!-- example:(?P<name>[\w.-]+):begin -->\n)"
    r"(?P<steps>(?:<!-- .*? -->\n)+)"
    r"```console\n.*?```\n"
    r"(?P<end><!-- example:(?P=name):end -->)$", re.S | re.M)
STEP = re.compile(r"<!-- (.*?) -->")


def _version() -> str:
    text = (ROOT / "gptqfmt" / "version.py").read_text("utf-8")
    found = re.search(r"__version__\s*=\s*[\"']([^\"']+)[\"']", text)
    return found[1] if found else "\0"


def _env() -> dict[str, str]:
    """The environment of a command: this tree first on the path, output unbuffered (so that
    stdout and stderr interleave as on a terminal), and nothing of the caller's that changes
    an output (a GitHub step summary, colour, gptqfmt's test hooks, a Hugging Face cache)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPTQFMT_", "GITHUB_", "HF_", "HUGGINGFACE_"))
           and k not in ("NO_COLOR", "FORCE_COLOR", "CLICOLOR_FORCE", "PYTHONPATH", "COLUMNS")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8",
               TERM="dumb")
    return env


def hf_cache_entry(cache: Path, repo_id: str, src: Path, commit: str) -> None:
    """The files of `src` as revision `commit` (and `main`) of `repo_id` in the Hugging Face
    cache `cache`, laid out as huggingface_hub lays a download out: blobs named by sha256 for
    .safetensors files (what the Hub keeps in LFS) and by git blob id for the rest, each
    snapshot file a relative link to its blob."""
    entry = cache / ("models--" + repo_id.replace("/", "--"))
    snap = entry / "snapshots" / commit
    snap.mkdir(parents=True)
    (entry / "blobs").mkdir(exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        data = f.read_bytes()
        blob = (hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors" else
                hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (entry / "blobs" / blob).write_bytes(data)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", blob))
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)


def set_up(step: str, work: Path, env: dict[str, str]) -> None:
    """One set-up step of an example, in its directory `work`."""
    words = shlex.split(step)
    if words[:2] == ["cp", "-r"] and len(words) == 4:
        (work / words[3]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(ROOT / words[2], work / words[3])
    elif words[0] == "hf-cache" and len(words) == 4:
        hf_cache_entry(work / "hf-cache", words[1], ROOT / words[2], words[3])
        env["HF_HUB_CACHE"] = "hf-cache"  # relative to the example's directory: outputs name it so
    elif words[0] == "flip-bit" and len(words) == 2:  # the last byte: tensor data, still parses
        path = work / words[1]
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    else:
        raise SystemExit(f"example step {step!r}: expected `$ COMMAND`, `cp -r A B`, "
                         "`hf-cache REPO SRC COMMIT` or `flip-bit FILE`")


def run_example(steps: list[str]) -> str:
    """The console text of one example: each `$ command` line and what it printed."""
    shown = []
    env = _env()
    with tempfile.TemporaryDirectory(prefix="gptqfmt-example-") as t:
        work = Path(t)
        (work / "fixtures").symlink_to(ROOT / "fixtures", target_is_directory=True)
        for step in steps:
            if not step.startswith("$ "):
                set_up(step, work, env)
                continue
            argv = shlex.split(step[2:])
            if argv[0] not in ENTRY:
                raise SystemExit(f"example step {step!r}: runs only {', '.join(ENTRY)}")
            code = f"import sys; {ENTRY[argv[0]]}; run(sys.argv[1:])"
            out = subprocess.run([sys.executable, "-c", code, *argv[1:]], cwd=work,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=600).stdout
            shown += [step, *normalise(out, work).splitlines()]
    return "\n".join(shown) + "\n"


def normalise(text: str, work: Path) -> str:
    for d in sorted({str(work), str(work.resolve())}, key=len, reverse=True):
        text = text.replace(d + os.sep, "").replace(d, ".")
    text = text.replace(str(ROOT) + os.sep, "").replace(str(ROOT), ".")
    v = _version()
    for form in ('"version": "{}"', "gptqfmt {}", "gptqfmt/{}"):
        text = text.replace(form.format(v), form.format("<VERSION>"))
    return text


def examples(text: str) -> list[tuple[str, list[str]]]:
    return [(m["name"], STEP.findall(m["steps"])) for m in BLOCK.finditer(text)]


def rendered(text: str, outputs: dict[str, str]) -> str:
    """`text` with every example block holding its output from `outputs`."""
    return BLOCK.sub(lambda m: f"{m['begin']}{m['steps']}```console\n{outputs[m['name']]}```\n"
                               f"{m['end']}", text)


def check_markers(page: Path, text: str) -> list[str]:
    """Markers that no well-formed block holds (a begin without its end, a missing command)."""
    names = [m["name"] for m in BLOCK.finditer(text)]
    begins = re.findall(r"^<!-- example:([\w.-]+):begin -->$", text, re.M)
    bad = [f"{page.relative_to(ROOT)}: example {n!r} is not a well-formed block"
           for n in begins if n not in names]
    bad += [f"{page.relative_to(ROOT)}: example {n!r} appears twice"
            for n in sorted({n for n in names if names.count(n) > 1})]
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="rewrite every example block")
    g.add_argument("--check", action="store_true", help="exit 1 when a block differs")
    a = ap.parse_args(argv)
    texts = {p: p.read_text("utf-8") for p in PAGES}
    bad = [b for p, t in texts.items() for b in check_markers(p, t)]
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    jobs = {(p, name): steps for p, t in texts.items() for name, steps in examples(t)}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outs = dict(zip(jobs, pool.map(run_example, jobs.values())))
    differ = []
    for page, text in texts.items():
        new = rendered(text, {name: out for (p, name), out in outs.items() if p == page})
        if new == text:
            continue
        for name, _ in examples(text):
            block, now = rendered_block(text, name), f"```console\n{outs[page, name]}```\n"
            if block != now:
                where = f"{page.relative_to(ROOT)}: example {name!r}"
                differ.append(where if a.write else where + "\n" + "\n".join(
                    difflib.unified_diff(block.splitlines(), now.splitlines(), "written",
                                         "printed now", lineterm="")))
        if a.write:
            page.write_text(new, "utf-8")
    verb = "rewrote" if a.write else "differs:"
    for d in differ:
        print(f"{verb} {d}", file=sys.stderr)
    print(f"{len(jobs) - len(differ)} of {len(jobs)} examples as the commands print them",
          file=sys.stderr)
    return 1 if differ and a.check else 0


def rendered_block(text: str, name: str) -> str:
    """The fenced block of example `name` as `text` holds it."""
    m = next(m for m in BLOCK.finditer(text) if m["name"] == name)
    return text[m.end("steps"):m.start("end")]


if __name__ == "__main__":
    sys.exit(main())
