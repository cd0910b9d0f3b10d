"""The package's shape, read with ast (scripts/floors.py measures it): every room on a floor of
the plan, no import up a floor and no import cycle (lazy imports inside functions count too), no
module reaching into another's private names, and no code outside the format readers and
writers asking which format a checkpoint is in."""
import re
from pathlib import Path

from tests.support import ROOT, load_script

FLOORS = load_script(ROOT / "scripts" / "floors.py")


def test_every_room_is_on_a_floor():
    rooms = {FLOORS.room(m) for m in FLOORS.modules(ROOT)}
    assert sorted(r for r in rooms if FLOORS.floor_of(r) is None) == []


def test_no_import_runs_up_a_floor():
    assert FLOORS.upward(ROOT) == []


def test_no_import_cycle():
    assert FLOORS.cycles(ROOT) == []


def test_no_module_takes_a_private_name_of_another():
    assert FLOORS.private_reaches(ROOT) == []


def test_only_the_formats_ask_which_format_a_checkpoint_is():
    assert FLOORS.format_forks(ROOT) == []


def test_no_code_speaks_of_the_projects_history():
    """No code, comment or message of the package names an issue of its own tracker (upstream
    trackers are cited with their repository: vllm-project/vllm#54809)."""
    history = re.compile(r"(?<![\w/#-])issues? #?\d+", re.IGNORECASE)
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "gptqfmt").rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if history.search(line)]
    assert bad == []


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / "gptqfmt" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks on a made-up package: each can fail."""
    write_package(tmp_path, {
        "__init__.py": "",
        "errors.py": "from .bits import swar\n",                 # up a floor
        "bits/__init__.py": "",
        "bits/swar.py": "def f():\n    from ..formats import a\n    return a._secret\n",
        "formats/__init__.py": "",
        "formats/a.py": "from ..bits.swar import f\n_secret = 1\n",
        "ops/__init__.py": "",
        "ops/x.py": "def g(src, r):\n    return src.format == 'awq' or isinstance(r, "
                    "FormatReport)\n",
    })
    assert FLOORS.cycles(tmp_path) == ["gptqfmt.bits.swar -> gptqfmt.formats.a -> "
                                       "gptqfmt.bits.swar"]
    assert FLOORS.private_reaches(tmp_path) == ["gptqfmt.bits.swar:3 a._secret"]
    assert FLOORS.upward(tmp_path) == ["gptqfmt.bits.swar -> gptqfmt.formats.a",
                                       "gptqfmt.errors -> gptqfmt.bits.swar"]
    assert sorted(f.split(" ", 1)[1] for f in FLOORS.format_forks(tmp_path)) == [
        "isinstance(r, FormatReport)", "src.format == 'awq'"]
