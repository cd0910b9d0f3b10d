"""The CI output formats (gptqfmt/cli/ci.py): SARIF validated against the OASIS schema, GitHub
workflow commands parsed back, JUnit XML parsed by the standard library, and --output writing
several of them in one run. Each is checked against the JSON document of the same command:
the CI formats must carry every finding, with its code, severity, file and tensor."""
import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from gptqfmt.cli.ci import (
    CHECKPOINT_CASE,
    GithubReporter,
    Outcome,
    gh_command,
    junit_xml,
    module_of,
)
from gptqfmt.cli.output import escape
from gptqfmt.findings import CATALOGUE, Finding
from tests.support import CKPT, FIXTURES, ROOT

SARIF_SCHEMA = json.loads((ROOT / "tests" / "third_party" / "sarif-schema-2.1.0.json")
                          .read_text())
INVALID = FIXTURES / "invalid"
MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"  # GQ401 on config.json:quantization_config
FAILING = [INVALID / "config-not-json", INVALID / "declared-bits-wrong",
           INVALID / "labelled-gptq-but-gptq-v2", INVALID / "index-lacks-tensor",
           INVALID / "control-characters-in-names", MISLABELLED,
           CKPT / "optimum-b4-sym-gptq-sharded"]
PASSING = CKPT / "b4-asym-act-gptq-sharded"
LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)   # a CI job runs in the repository: files are relative to it
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def as_json(run_cli, *args):
    r = run_cli(*args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


# a finding's `file` that names a block inside a file: (the file, the key)
INSIDE = {"config.json:quantization_config": ("config.json", "quantization_config")}


def where(f: dict, ckpt: Path) -> str | None:
    """The path a CI system is pointed at: the finding's file in the checkpoint, relative to
    the repository; for a block inside a file, that file."""
    if f["file"] is None:
        return None
    file = INSIDE.get(f["file"], (f["file"], None))[0]
    return (Path(ckpt).relative_to(ROOT) / file).as_posix()


def key_of(f: dict) -> str | None:
    return INSIDE.get(f["file"], (None, None))[1]


# ---- SARIF -------------------------------------------------------------------------------

def sarif(run_cli, *args):
    r = run_cli(*args, "--format", "sarif")
    log = json.loads(r.stdout)
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(log)
    return r.exit_code, log


@pytest.mark.parametrize("ckpt", FAILING + [PASSING], ids=lambda p: p.name)
def test_sarif_is_valid_and_carries_every_finding(run_cli, ckpt):
    code, doc = as_json(run_cli, "verify", ckpt)
    scode, log = sarif(run_cli, "verify", ckpt)
    assert scode == code
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(CATALOGUE)  # one rule per code, in catalogue order
    assert all(r["shortDescription"]["text"] == CATALOGUE[r["id"]].title for r in rules)
    got = []
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        loc = res.get("locations", [{}])[0]
        uri = loc.get("physicalLocation", {}).get("artifactLocation", {}).get("uri")
        logical = {x["kind"]: x["fullyQualifiedName"] for x in loc.get("logicalLocations", [])}
        assert set(logical) <= {"member", "object"}
        got.append((res["ruleId"], res["level"], uri, logical.get("member"),
                    logical.get("object")))
    # a finding of no one file is located at the checkpoint itself
    want = [(f["code"], {"info": "note"}.get(f["severity"], f["severity"]),
             where(f, ckpt) or ckpt.relative_to(ROOT).as_posix(), f["tensor"], key_of(f))
            for f in doc["findings"]]
    assert got == want
    assert run["invocations"][0] == {"executionSuccessful": True, "exitCode": code}
    assert run["properties"]["final"].startswith("FAIL" if code else "OK")


def test_sarif_of_a_failure_and_of_verify_against(run_cli, tmp_path):
    # a path that cannot be read: exit 2, the reason as a tool notification
    code, log = sarif(run_cli, "verify", tmp_path / "missing")
    inv = log["runs"][0]["invocations"][0]
    assert code == 2 and inv["exitCode"] == 2 and not inv["executionSuccessful"]
    assert "missing" in inv["toolExecutionNotifications"][0]["message"]["text"]
    # two checkpoints that differ: one GQ504 per difference of a module, one GQ507 per
    # tensor outside the modules that differs
    code, log = sarif(run_cli, "verify", CKPT / "mislabelled-b4-sym-v2-as-gptq", "--against",
                      CKPT / "b4-sym-noact-gptq-single")
    codes = {r["ruleId"] for r in log["runs"][0]["results"]}
    assert code == 1 and codes == {"GQ504", "GQ507"}


# ---- GitHub workflow commands ------------------------------------------------------------

COMMAND = re.compile(r"^::(?P<level>error|warning|notice)(?: (?P<props>[^:]*))?::(?P<msg>.*)$")


def unescape(s: str) -> str:
    return s.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":") \
        .replace("%2C", ",").replace("%25", "%")


def parse_github(text: str):
    """The workflow commands of `text`, parsed as the runner parses them, and the other lines."""
    commands, plain = [], []
    for line in text.splitlines():
        m = COMMAND.match(line)
        if not m:
            plain.append(line)
            continue
        props = dict(p.split("=", 1) for p in m["props"].split(",")) if m["props"] else {}
        commands.append((m["level"], {k: unescape(v) for k, v in props.items()},
                         unescape(m["msg"])))
    return commands, plain


@pytest.mark.parametrize("ckpt", FAILING + [PASSING], ids=lambda p: p.name)
def test_github_lines_parse_back_to_the_findings(run_cli, ckpt):
    code, doc = as_json(run_cli, "verify", ckpt)
    r = run_cli("verify", ckpt, "--format", "github")
    assert r.exit_code == code
    commands, plain = parse_github(r.stdout)
    assert len(commands) == len(doc["findings"])
    for (level, props, msg), f in zip(commands, doc["findings"]):
        assert level == LEVEL[f["severity"]]
        assert props.get("file") == where(f, ckpt)
        assert props["title"] == f"{f['code']} {CATALOGUE[f['code']].title}"
        assert f["code"] in props["title"]
        assert msg.endswith(f" (hint: {f['hint']})" if f.get("hint") else "")
        if key_of(f):   # the key inside the file leads the message
            assert msg.startswith(f"{key_of(f)}: {f['message']}")
    assert plain[-1].startswith("FAIL" if code else "OK")  # the text report's final line


def test_a_config_block_is_located_at_its_file_with_the_key_named(run_cli):
    """GQ401 on config.json's quantization_config: the annotation lands on config.json, which
    a runner can attach to a file of the commit, and the message names the key; SARIF gives the
    file as the physical location and the key as a logical one."""
    _, doc = as_json(run_cli, "verify", MISLABELLED)
    [f] = [f for f in doc["findings"] if f["code"] == "GQ401"]
    assert f["file"] == "config.json:quantization_config"
    lines = run_cli("verify", MISLABELLED, "--format", "github").stdout.splitlines()
    [line] = [ln for ln in lines if "title=GQ401" in ln]
    assert line.startswith(
        "::error file=fixtures/ckpt/mislabelled-b4-sym-v2-as-gptq/config.json,title=GQ401 "
        f"{CATALOGUE['GQ401'].title}::quantization_config: {f['message']}")
    assert "%3A" not in line.partition(",title=")[0]
    _, log = sarif(run_cli, "verify", MISLABELLED)
    [res] = [r for r in log["runs"][0]["results"] if r["ruleId"] == "GQ401"]
    assert res["locations"] == [{
        "physicalLocation": {"artifactLocation": {
            "uri": "fixtures/ckpt/mislabelled-b4-sym-v2-as-gptq/config.json",
            "uriBaseId": "%SRCROOT%"}},
        "logicalLocations": [{"name": "quantization_config",
                              "fullyQualifiedName": "quantization_config", "kind": "object"}]}]


def test_a_file_named_like_a_block_is_left_as_it_is():
    """Only the config blocks the readers label FILE:KEY are split: any other file name with a
    colon (a shard an index names) is a file, passed on whole (escaped as a property)."""
    buf = io.StringIO()
    f = Finding("GQ125", "not referenced", file="a:b.safetensors")
    GithubReporter(buf).emit(Outcome("verify", None, 1, "FAIL", [f]))
    [(level, props, msg)], _ = parse_github(buf.getvalue())
    assert props["file"] == "a:b.safetensors" and msg == "not referenced"


def test_github_escapes_what_would_end_a_command_early():
    msg = "50% of a,b: x\r\ny"
    line = gh_command("error", msg, file="dir,a:b/c.json", title="GQ201 t")
    assert "\n" not in line and "\r" not in line
    [(level, props, got)], _ = parse_github(line)
    assert (level, props, got) == ("error", {"file": "dir,a:b/c.json", "title": "GQ201 t"}, msg)


def test_github_writes_a_job_summary_when_the_runner_asks(run_cli, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    _, doc = as_json(run_cli, "verify", INVALID / "config-not-json")
    run_cli("verify", INVALID / "config-not-json", "--format", "github",
            "--output", f"github={tmp_path / 'second.txt'}")
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, never overwritten
    assert text.count("gptqfmt verify") == 1  # one summary, though two github reports
    rows = [ln for ln in text.splitlines() if re.match(r"^\| (error|warning|info) \|", ln)]
    assert [r.split(" | ")[1] for r in rows] == [f["code"] for f in doc["findings"]]


def test_markdown_cells_cannot_break_the_table_or_render(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "s.md"))
    f = Finding("GQ301", "a | b <script>\nc ![i](https://e.example/p.png) _x_ `y`",
                file="x|y.json", tensor="[t](https://e.example)")
    GithubReporter().emit(Outcome("verify", "ck`pt", 1, "FAIL", [f]))
    text = (tmp_path / "s.md").read_text()
    row = [ln for ln in text.splitlines() if "GQ301" in ln][0]
    assert row.count(" | ") == 3 and "<script>" not in row and "\\|" in row
    for raw in ("](", "![", "https://", "_x_", "`y`"):
        assert raw not in text, raw
    assert not re.search(r"(?<!\\)`", text)  # every backtick escaped: no code span
    assert "\\!\\[i\\]\\(https\\://e\\.example/p\\.png\\)" in row  # shown, not rendered


def test_github_file_property_is_escaped_for_the_terminal():
    f = Finding("GQ125", "not referenced", file="a\x1b[2Jb.safetensors")
    buf = io.StringIO()
    GithubReporter(buf).emit(Outcome("verify", None, 1, "FAIL", [f]))
    assert "\x1b" not in buf.getvalue() and "\\x1b" in buf.getvalue()


# ---- JUnit XML ---------------------------------------------------------------------------

@pytest.mark.parametrize("ckpt", FAILING + [PASSING], ids=lambda p: p.name)
def test_junit_has_one_case_per_module_and_fails_where_the_errors_are(run_cli, ckpt):
    code, doc = as_json(run_cli, "verify", ckpt)
    r = run_cli("verify", ckpt, "--format", "junit")
    assert r.exit_code == code
    root = ET.fromstring(r.stdout)
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert cases[0].get("name") == CHECKPOINT_CASE
    names = [c.get("name") for c in cases[1:]]  # every module, valid or not, names escaped
    assert len(names) == doc["summary"]["modules"]
    assert {escape(m["name"]) for m in doc["modules"]} <= set(names)
    assert int(suite.get("tests")) == len(cases)

    def case_of(f):
        return module_of(escape(f["tensor"]) if f["tensor"] else None, set(names)) \
            or CHECKPOINT_CASE

    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert set(failed) == {case_of(f) for f in errors}
    assert int(suite.get("failures")) == len(failed) and (code == 1) == bool(failed)
    for name, el in failed.items():
        mine = [f["code"] for f in errors if case_of(f) == name]
        assert el.get("type") == mine[0] and len(el.text.splitlines()) == len(mine)


def test_junit_strict_fails_on_warnings_and_a_failure_is_an_error_case(run_cli, tmp_path):
    ckpt = INVALID / "g-idx-missing"  # warnings only
    root = ET.fromstring(run_cli("verify", ckpt, "--format", "junit").stdout)
    assert root.get("failures") == "0"
    root = ET.fromstring(run_cli("verify", ckpt, "--strict", "--format", "junit").stdout)
    assert root.get("failures") != "0"
    root = ET.fromstring(run_cli("verify", tmp_path / "missing", "--format", "junit").stdout)
    assert root.get("errors") == "1" and root.find(".//error") is not None
    assert root.find(".//testcase").get("classname") == "gptqfmt.verify"


def test_module_of_takes_the_longest_module_prefix():
    mods = {"a.b", "a.b.c"}
    assert module_of("a.b.c.qzeros", mods) == "a.b.c"
    assert module_of("a.b.qweight", mods) == "a.b"
    assert module_of("lm_head.weight", mods) is None and module_of(None, mods) is None


def test_junit_escapes_what_xml_cannot_hold():
    f = Finding("GQ301", "bad \x01 <&> name", tensor="m\x1b[31m.qweight")
    text = junit_xml(Outcome("verify", None, 1, "FAIL", [f], ["m\x1b[31m"]))
    root = ET.fromstring(text)  # parses: no raw control character
    assert "\x1b" not in text and "\x01" not in text
    assert root.find(".//failure").get("type") == "GQ301"
    # no line of the XML starts with a name from the file (a workflow command on a CI log)
    f = Finding("GQ301", "x", tensor="::error::injected.qweight")
    text = junit_xml(Outcome("verify", None, 1, "FAIL", [f, f], ["m"]))
    assert not [ln for ln in text.splitlines() if ln.lstrip().startswith("::")]


# ---- --output FORMAT=FILE ----------------------------------------------------------------

def test_output_writes_extra_reports_while_stdout_keeps_the_format(run_cli, tmp_path):
    ckpt = INVALID / "declared-bits-wrong"
    code, doc = as_json(run_cli, "verify", ckpt)
    r = run_cli("verify", ckpt, "--format", "json", "--output", f"sarif={tmp_path / 'r.sarif'}",
                "--output", f"junit={tmp_path / 'r.xml'}", "--output",
                f"text={tmp_path / 'r.txt'}", "--output", f"github={tmp_path / 'r.gh'}")
    assert r.exit_code == code
    assert json.loads(r.stdout) == doc  # stdout: exactly the --format document
    log = json.loads((tmp_path / "r.sarif").read_text())
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(log)
    assert [x["ruleId"] for x in log["runs"][0]["results"]] == [f["code"] for f in doc["findings"]]
    ET.fromstring((tmp_path / "r.xml").read_text())
    text = run_cli("verify", ckpt, "--color", "always").stdout
    assert (tmp_path / "r.txt").read_text() == re.sub(r"\x1b\[[0-9;]*m", "", text)  # no colour
    assert len(parse_github((tmp_path / "r.gh").read_text())[0]) == len(doc["findings"])
    assert not list(tmp_path.glob(".*gptqfmt-tmp"))


def test_output_is_written_when_the_command_fails(run_cli, tmp_path):
    r = run_cli("inspect", tmp_path / "missing", "--output", f"json={tmp_path / 'r.json'}")
    assert r.exit_code == 2
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["status"] == "error" and doc["exit_code"] == 2


@pytest.mark.parametrize("spec,why", [
    ("sarif", "expected FORMAT=FILE"), ("xml=r.xml", "expected FORMAT=FILE"),
    ("json=", "expected FORMAT=FILE"), ("json={tmp}/no/such/dir/r.json", "existing directory"),
    ("json={tmp}", "existing directory")])
def test_a_bad_output_is_a_usage_error_before_anything_runs(run_cli, tmp_path, spec, why):
    r = run_cli("verify", PASSING, "--output", spec.format(tmp=tmp_path))
    assert r.exit_code == 2 and why in r.output


def test_the_same_output_file_twice_is_refused(run_cli, tmp_path):
    f = tmp_path / "r.json"
    r = run_cli("verify", PASSING, "--output", f"json={f}", "--output", f"sarif={f}")
    assert r.exit_code == 2 and "named twice" in r.output
