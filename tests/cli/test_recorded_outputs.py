"""Everything inspect, verify and convert print on the shipped fixtures (JSON and text), byte
for byte, against the record in tests/golden/outputs.json (scripts/record_outputs.py). A change
that means to change an output rewrites the record (`python3 scripts/record_outputs.py --write
tests/golden/outputs.json`) and shows the diff in review; a refactoring leaves it alone."""
import importlib.util
import json
import re

from tests.support import ROOT, unwrap


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


def _text_records():
    record = json.loads((ROOT / "tests" / "golden" / "outputs.json").read_text())
    return {k: v for k, v in record.items() if k.startswith("text ")}


def test_every_text_line_fits_100_columns():
    """Wrapped, never cut: no recorded text line is wider than 100 characters."""
    wide = [(k, len(line)) for k, v in _text_records().items()
            for line in v["stdout"].splitlines() if len(line) > 100]
    assert wide == []


def test_the_verdict_is_the_first_line_and_the_status_the_last():
    """Every text report starts with OK or FAIL and its reason, and ends with the status line
    of one grammar: `OK|FAIL: [N modules, ]E errors, W warnings, I infos[; ...]` (verify
    --against and --reference end with their own count of modules)."""
    status = re.compile(r"^(OK|FAIL): (\d+ modules?, )?\d+ errors?, \d+ warnings?, \d+ infos?"
                        r"( \(-v lists them\))?(; .*)?$")
    bad_first, bad_last = [], []
    for k, v in _text_records().items():
        lines = unwrap(v["stdout"])
        if not lines:
            continue
        if not re.match(r"^(OK|FAIL): \S", lines[0]):
            bad_first.append(k)
        if "--against" not in k and "--reference" not in k and not status.match(lines[-1]):
            bad_last.append(k)
    assert bad_first == [] and bad_last == []


def test_a_clean_verify_fits_in_ten_lines():
    """A verify without errors or warnings is at most 10 lines: the verdict, the compact
    runtimes table, the status (infos are counted, -v lists them)."""
    long = []
    for k, v in _text_records().items():
        if not k.startswith("text verify ") or "--against" in k or "--reference" in k:
            continue
        last = v["stdout"].splitlines()[-1]
        if re.match(r"^OK: \d+ modules?, 0 errors, 0 warnings", last) and \
                len(v["stdout"].splitlines()) > 10:
            long.append(k)
    assert long == []
