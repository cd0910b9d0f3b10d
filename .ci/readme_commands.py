"""Print one of the README's two set-up commands, read from the README itself.

    python3 .ci/readme_commands.py main   # installs and runs the main job on a shipped fixture
    python3 .ci/readme_commands.py test   # installs and runs the tests

They are the two `sh` blocks of the section "## Set-up: two commands", in that order. CI runs
them verbatim, so the README cannot drift from what works on a fresh machine.
"""
import re
import sys
from pathlib import Path

SECTION = "## Set-up: two commands"


def commands(readme: str) -> dict[str, str]:
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    blocks = re.findall(r"```sh\n(.+?)\n```", readme[start:end if end > 0 else None], re.S)
    if len(blocks) != 2 or any("\n" in b for b in blocks):
        raise SystemExit(f"README.md: expected two one-line sh blocks under '{SECTION}', "
                         f"found {blocks!r}")
    return {"main": blocks[0], "test": blocks[1]}


if __name__ == "__main__":
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    print(commands(readme)[sys.argv[1]])
