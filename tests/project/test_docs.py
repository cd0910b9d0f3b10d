"""The reference under docs/ holds together: every relative link of README.md and docs/*.md
points at a file that exists (and, with an anchor, at a heading of it), the README links every
page, and docs/cli.md names every option of every command."""
import re
import unicodedata
from pathlib import Path

import pytest

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def unfenced(text: str) -> str:
    """`text` without fenced code blocks, where a `#` starts no heading."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """`text` without fenced code blocks and code spans, where a bracket is no link."""
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", unfenced(text), flags=re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.strip().lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", unfenced(page.read_text()), re.M):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("verify --against and --reference fp32", "verify---against-and---reference-fp32"),
    ("The terminal: colour, quiet, verbose, summary, completion",
     "the-terminal-colour-quiet-verbose-summary-completion"),
    ("Where it says `ambiguous`", "where-it-says-ambiguous"),
    ("CI: exit codes, JSON, GitHub, SARIF, JUnit, pre-commit",
     "ci-exit-codes-json-github-sarif-junit-pre-commit"),
])
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_the_link_finder_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](x.md) and [b](y.md#z) and `[c](no.md)`, [d](https://e.org/f)\n"
                    "```\n[g](no2.md)\n```\n")
    assert relative_links(page) == ["x.md", "y.md#z"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_what_exists(page):
    links = relative_links(page)
    bad = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
            bad.append(f"{link}: no heading with that anchor")
    assert bad == []


def test_the_readme_links_every_page_and_the_pages_link_back():
    linked = {(ROOT / link.partition("#")[0]).resolve()
              for link in relative_links(ROOT / "README.md")}
    docs = set(PAGES[1:])
    assert docs and docs <= linked, sorted(str(p) for p in docs - linked)
    # a page found from another page leads on: each links at least one other page or the README
    assert all(relative_links(p) for p in docs)


def test_the_cli_page_names_every_option_of_every_command():
    from gptqfmt.cli import main

    text = (ROOT / "docs" / "cli.md").read_text()
    missing = []
    for name, cmd in main.commands.items():
        assert f"gptqfmt {name}" in text or f"`{name}" in text, name
        for p in cmd.params:
            for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
                if opt.startswith("-") and opt not in ("-h", "--help") and \
                        not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text):
                    missing.append(f"{name} {opt}")
    assert missing == []
