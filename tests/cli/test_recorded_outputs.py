"""Everything inspect, verify and convert print on the shipped fixtures (JSON and text), byte
for byte, against the record in tests/golden/outputs.json (scripts/record_outputs.py). A change
that means to change an output rewrites the record (`python3 scripts/record_outputs.py --write
tests/golden/outputs.json`) and shows the diff in review; a refactoring leaves it alone."""
import importlib.util
import json
import re

from tests.support import ROOT


def test_outputs_match_the_record():
    spec = importlib.util.spec_from_file_location("record_outputs",
                                                  ROOT / "scripts" / "record_outputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    want = json.loads((ROOT / "tests" / "golden" / "outputs.json").read_text())
    got = mod.outputs()
    assert sorted(got) == sorted(want)
    differ = [k for k in sorted(want) if got[k] != want[k]]
    assert not differ, f"{len(differ)} outputs changed, first: {differ[0]}\n" \
        f"want {want[differ[0]]}\ngot  {got[differ[0]]}"


def test_no_output_speaks_of_the_projects_history():
    """What the tool prints is about the user's checkpoint: no issue numbers of its own
    tracker, no "will write" of features to come."""
    record = json.loads((ROOT / "tests" / "golden" / "outputs.json").read_text())
    bad = [k for k, v in record.items() if HISTORY.search(v["stdout"])]
    assert bad == []


HISTORY = re.compile(r"\bissues? #?\d+\b|\bwill write\b", re.IGNORECASE)
