"""`gptqfmt scan REPO...`: inspect many Hugging Face repos over HTTP, one line each."""
from __future__ import annotations

import itertools

import click

from ..errors import UsageError
from .boundary import guarded, http_options


@click.command("scan", short_help="Inspect many Hugging Face repos on the Hub without "
                                    "downloading them: one line each, and a summary.")
@click.argument("repos", nargs=-1)
@click.option("--file", "repo_file", type=click.File("r", encoding="utf-8"), metavar="FILE",
              help="Read repo ids from FILE (- for stdin), one per line; # starts a comment.")
@click.option("--jobs", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Repos read at once.")
@http_options(16, 256, "Over every repo: ")
@guarded
def scan_cmd(repos, out, repo_file, jobs, in_flight, whole_files):
    """Read each Hugging Face repo id (ORG/NAME[@REVISION]) as `inspect REPO --remote` does
    (configs, headers, qzeros, g_idx and a sample of qweight over HTTP range requests) and say
    on one line whether it passes, with the commit read and the reason; then the totals. A
    repo that cannot be read (private, gated, missing, the network) is a GQ132 of its own and
    the others go on.

    Exit 0 when every repo passes, 1 when one fails or cannot be read, 2 usage error."""
    from ..ops.scan import read_repo_list, scan
    from .text_lines import inspect_reason

    names = list(repos) + (read_repo_list(repo_file) if repo_file is not None else [])
    if not names:
        raise UsageError("no repo to scan: name repo ids (ORG/NAME[@REVISION]) or --file FILE")
    done = itertools.count(1)   # told from the scan's threads: next() is one step

    def tick(r) -> None:
        out.note(f"gptqfmt: [{next(done)}/{len(names)}] {r.repo}: {r.status}")

    result = scan(names, jobs=jobs, in_flight=in_flight, whole_files=whole_files,
                  reason=inspect_reason, on_repo=tick if out.progress else None)
    code = 0 if result.ok else 1
    out.scan(result, code)
    return code
