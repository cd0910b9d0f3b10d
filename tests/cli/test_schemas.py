"""The schemas work without gptqfmt: each file is self-contained, so that a plain validator
given that one file (jsonschema.validate with the file as loaded; check-jsonschema with one
--schemafile, no neighbour, no network) accepts the real JSON output of every command and
rejects a broken document. A definition shared between schemas is written once, in its home, and
copied by scripts/bundle_schemas.py; a copy that differs from its home fails here. Every
property is described."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import jsonschema
import pytest
import referencing
from click.testing import CliRunner
from referencing.jsonschema import DRAFT202012

from gptqfmt.cli import main
from gptqfmt.resources import validator
from tests.support import CKPT, FIXTURES, ROOT, load_script

SCHEMAS = ROOT / "schemas"
BUNDLE = load_script(ROOT / "scripts" / "bundle_schemas.py")
SUFFIX = ".schema.json"
# Which schema each command's --format json output must satisfy (README, gptqfmt/cli/*.py).
OUTPUT_SCHEMAS = ("inspect", "report", "equivalence", "convert", "doctor", "scan")

# Subschema keywords of draft 2020-12: a single schema, a list of schemas, a map of schemas.
ONE = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "contains",
       "propertyNames", "not", "if", "then", "else")
MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")


def schema_files() -> list[Path]:
    return sorted(SCHEMAS.glob(f"*{SUFFIX}"))


def load(p: Path) -> dict:
    return json.loads(p.read_text("utf-8"))


def walk(schema, where="#"):
    """(JSON pointer, subschema, parent keyword) for every schema object inside `schema`."""
    yield where, schema, None
    for kw in ONE:
        if isinstance(schema.get(kw), dict):
            for w, s, k in walk(schema[kw], f"{where}/{kw}"):
                yield w, s, k or kw
    for kw in MANY:
        for i, sub in enumerate(schema.get(kw, [])):
            for w, s, k in walk(sub, f"{where}/{kw}/{i}"):
                yield w, s, k or kw
    for kw in MAP:
        for name, sub in schema.get(kw, {}).items():
            if isinstance(sub, dict):
                for w, s, k in walk(sub, f"{where}/{kw}/{name}"):
                    yield w, s, k or kw


def pointer(doc, fragment: str):
    """Resolve a JSON pointer fragment ('/$defs/finding') in `doc`; KeyError when it does not."""
    for part in filter(None, fragment.split("/")):
        doc = doc[part.replace("~1", "/").replace("~0", "~")]
    return doc


# ------------------------------------------------------------------ the schemas themselves
def test_every_shipped_schema_is_found():
    assert {p.name.removesuffix(SUFFIX) for p in schema_files()} == {
        "convert", "doctor", "equivalence", "fix_label", "index", "inspect", "quantize_config",
        "report", "scan"}


def undescribed(schema: dict) -> list[str]:
    """Pointers of the properties without a description of at least two words."""
    missing = []
    for where, sub, parent in walk(schema):
        if parent == "if":
            continue  # a condition restates properties described elsewhere
        for name, prop in sub.get("properties", {}).items():
            text = prop.get("description", "") if isinstance(prop, dict) else ""
            if len(str(text).split()) < 2:
                missing.append(f"{where}/properties/{name}")
    return missing


@pytest.mark.parametrize("path", schema_files(), ids=lambda p: p.name)
def test_every_property_has_a_description(path):
    assert undescribed(load(path)) == [], f"{path.name}: properties without a description"


def test_the_description_check_finds_nested_and_bare_properties():
    schema = {"properties": {"a": {"description": "Described here."},
                             "b": {"type": "object", "properties": {"c": {"type": "string"}}},
                             "d": {"description": "d"}},
              "$defs": {"e": {"items": {"properties": {"f": {"$ref": "#"}}}}},
              "if": {"properties": {"g": {"const": 1}}},
              "then": {"properties": {"h": True}}}
    assert sorted(undescribed(schema)) == ["#/$defs/e/items/properties/f", "#/properties/b",
                                           "#/properties/b/properties/c", "#/properties/d",
                                           "#/then/properties/h"]


@pytest.mark.parametrize("path", schema_files(), ids=lambda p: p.name)
def test_every_ref_is_local_and_resolves(path):
    doc = load(path)
    ids = [w for w, sub, _ in walk(doc) if "$id" in sub]
    assert ids == [], "an $id re-roots the references (to a URL: offline they fail)"
    jsonschema.Draft202012Validator.check_schema(doc)
    refs = [(w, s["$ref"]) for w, s, _ in walk(doc) if "$ref" in s]
    for where, ref in refs:
        assert ref.startswith("#/"), f"{where}: $ref {ref!r} leaves the file; reference the " \
            "definition where it lives and run `python3 scripts/bundle_schemas.py --write`"
        pointer(doc, ref[1:])  # KeyError: dangling


def test_every_copy_is_its_home_as_written_there():
    """What --check checks: editing a definition in its home and forgetting to run --write
    fails here, naming the schemas whose copies are stale."""
    assert BUNDLE.stale(SCHEMAS) == {}, "stale copies: run `python3 scripts/bundle_schemas.py " \
        "--write`"


def test_each_definition_lives_in_one_place():
    own, copies = [], []
    for p in schema_files():
        for name, body in load(p).get("$defs", {}).items():
            home = BUNDLE.copied_from(body)
            (copies if home else own).append((p.name, name, body, home))
    names = [n for _, n, _, _ in own]
    assert len(names) == len(set(names)), sorted(names)
    bodies = [json.dumps({k: v for k, v in b.items() if k != "description"}, sort_keys=True)
              for _, _, b, _ in own]
    assert len(bodies) == len(set(bodies)), "two $defs with the same content"
    # a copy is named after its home, which is a definition of its own (or a whole schema)
    assert copies
    for file, name, body, home in copies:
        target, _, fragment = home.partition("#")
        assert target != file and (SCHEMAS / target).is_file(), (file, name, home)
        source = load(SCHEMAS / target)
        if fragment:
            assert fragment == f"/$defs/{name}" and (target, name) in {
                (f, n) for f, n, _, _ in own}, (file, name, home)
        else:
            assert name == target.removesuffix(SUFFIX)
            source = {k: v for k, v in source.items() if k not in ("$schema", "$defs")}
        if fragment:
            source = source["$defs"][name]
        # the same schema, its references made local (the names are the same in both files)
        assert {k: v for k, v in body.items() if k != "$comment"} == source


@pytest.fixture
def folder(tmp_path):
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    return tmp_path / "schemas"


def bundle(folder: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bundle_schemas.py"), mode,
                           "--folder", str(folder)], capture_output=True, text=True, timeout=60)


def test_a_home_edited_without_write_fails_check_and_write_updates_every_copy(folder):
    report = (folder / "report.schema.json").read_text()
    old = '"description": "Stable finding code, e.g. GQ401."'
    assert report.count(old) == 1
    (folder / "report.schema.json").write_text(report.replace(old, '"description": "Changed."'))
    users = {"convert", "doctor", "equivalence", "fix_label", "inspect", "scan"}  # use finding
    r = bundle(folder, "--check")
    assert r.returncode == 1 and r.stdout == ""
    assert {Path(ln.split(":")[0]).name.removesuffix(SUFFIX)
            for ln in r.stderr.splitlines()} == users
    assert all("run `python3 scripts/bundle_schemas.py --write`" in ln
               for ln in r.stderr.splitlines())
    before = {p.name: p.read_text() for p in folder.iterdir()}
    assert bundle(folder, "--write").returncode == 0
    assert bundle(folder, "--check").returncode == 0
    for name in users:
        doc = json.loads((folder / f"{name}{SUFFIX}").read_text())
        assert doc["$defs"]["finding"]["properties"]["code"]["description"] == "Changed."
    # only the copies changed: every file's text before its $defs is as it was
    for p in folder.iterdir():
        head = before[p.name].split('"$defs"')[0]
        assert p.read_text().startswith(head), p.name


def test_a_reference_to_another_schema_becomes_local_with_its_copy(folder):
    """Using a definition of another schema is referencing it where it lives and running
    --write: the reference becomes local, the copy appears with the copies it needs in turn,
    and goes when no reference is left."""
    path = folder / "convert.schema.json"
    text = path.read_text()
    anchor = '"properties": {\n'
    added = ('"properties": {\n    "runtimes_seen": {"description": "A made-up key.", '
             '"$ref": "report.schema.json#/$defs/runtimes"},\n')
    path.write_text(text.replace(anchor, added, 1))
    assert bundle(folder, "--check").returncode == 1
    assert bundle(folder, "--write").returncode == 0
    doc = json.loads(path.read_text())
    assert doc["properties"]["runtimes_seen"]["$ref"] == "#/$defs/runtimes"
    # runtimes references runtime_verdict, which references path_verdict and rule_failed
    assert {"runtimes", "runtime_verdict", "path_verdict", "rule_failed"} <= set(doc["$defs"])
    assert BUNDLE.copied_from(doc["$defs"]["runtimes"]) == "report.schema.json#/$defs/runtimes"
    # the reference removed: so are the copies only it needed
    path.write_text(path.read_text().replace(
        '    "runtimes_seen": {"description": "A made-up key.", "$ref": "#/$defs/runtimes"},\n',
        ""))
    assert bundle(folder, "--write").returncode == 0
    assert path.read_text() == text


def test_the_script_refuses_a_dangling_reference(folder):
    path = folder / "convert.schema.json"
    path.write_text(path.read_text().replace('"#/$defs/tool"', '"report.schema.json#/$defs/nope"'))
    r = bundle(folder, "--check")
    assert r.returncode == 2 and "report.schema.json has no such definition" in r.stderr


# ------------------------------------------------------------------ check-jsonschema, offline
def check_jsonschema_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "check_jsonschema"]


def offline_env(cache: Path) -> dict:
    """No network: every HTTP(S) request goes to a closed local port and fails at once; an empty
    cache, so nothing downloaded before can stand in for a reference."""
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
           "https_proxy": dead, "XDG_CACHE_HOME": str(cache)}
    for k in ("NO_PROXY", "no_proxy"):
        env.pop(k, None)
    return env


def check(schema_file: Path, docs: list[Path], cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*check_jsonschema_cmd(), "--output-format", "json", "--color",
                           "never", "--schemafile", str(schema_file), *map(str, docs)],
                          capture_output=True, text=True, timeout=120, env=offline_env(cache))


def errors_by_file(r: subprocess.CompletedProcess) -> dict[str, list[str]]:
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1 is findings; else it did not run
    try:
        out = json.loads(r.stdout)
    except ValueError:
        pytest.fail(f"check-jsonschema did not validate (exit {r.returncode}):\n{r.stderr}")
    found: dict[str, list[str]] = {}
    for e in out["errors"] + out.get("parse_errors", []):
        found.setdefault(e["filename"], []).append(f"{e.get('path', '')}: {e['message']}")
    assert (r.returncode == 0) == (not found), r.stdout
    return found


def gptqfmt(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


SINGLE = CKPT / "b4-sym-noact-gptq-single"
MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"
LOSSY_SRC = CKPT / "b4-asym-noact-gptq_v2-single"  # Z = 0 fields: gptq cannot hold them
NO_CONFIG = FIXTURES / "invalid" / "no-config-at-all"  # one warning (GQ206), no error

# (case id, schema, argv with {tmp} for the scratch folder, exit code, status). In order: the
# --against cases read what the convert cases wrote. Run in-process (CliRunner) but for the
# cases in PROCESS: a usage error that click finds is turned into JSON by the console entry point
# (gptqfmt.cli.run), which only a real process goes through.
CASES = [
    ("inspect-ok", "inspect", ["inspect", SINGLE], 0, "ok"),
    ("inspect-fail", "inspect", ["inspect", MISLABELLED], 1, "fail"),
    ("inspect-missing-path", "inspect", ["inspect", "{tmp}/missing"], 2, "error"),
    ("inspect-unreadable", "inspect", ["inspect", FIXTURES / "hostile" / "header-not-json"],
     1, "fail"),
    ("inspect-usage-unknown-option", "inspect", ["inspect", SINGLE, "--bogus"], 2, "error"),
    ("verify-ok", "report", ["verify", SINGLE, "--quiet"], 0, "ok"),
    ("verify-fail", "report", ["verify", MISLABELLED], 1, "fail"),
    ("verify-strict", "report", ["verify", NO_CONFIG, "--strict"], 1, "fail"),
    ("verify-missing-path", "report", ["verify", "{tmp}/missing"], 2, "error"),
    ("verify-usage-bad-value", "report", ["verify", SINGLE, "--reference", "fp16"], 2, "error"),
    ("convert-ok", "convert", ["convert", SINGLE, "{tmp}/v2", "--backend", "cpu"], 0, "ok"),
    ("convert-dry-run", "convert", ["convert", SINGLE, "{tmp}/dry", "--dry-run",
                                    "--backend", "cpu"], 0, "ok"),
    ("convert-lossy-allowed", "convert", ["convert", LOSSY_SRC, "{tmp}/lossy", "--to", "gptq",
                                          "--allow-lossy", "--backend", "cpu"], 0, "ok"),
    ("convert-refused-label", "convert", ["convert", MISLABELLED, "{tmp}/no1"], 1, "fail"),
    ("convert-refused-lossy", "convert", ["convert", LOSSY_SRC, "{tmp}/no2", "--to", "gptq"],
     1, "fail"),
    ("convert-dst-exists", "convert", ["convert", SINGLE, "{tmp}/v2", "--backend", "cpu"],
     2, "error"),
    ("convert-usage-bad-value", "convert", ["convert", SINGLE, "{tmp}/no3", "--to", "gptq_v3"],
     2, "error"),
    ("against-ok", "equivalence", ["verify", SINGLE, "--against", "{tmp}/v2",
                                   "--backend", "cpu"], 0, "ok"),
    ("against-differs", "equivalence", ["verify", LOSSY_SRC, "--against", "{tmp}/lossy",
                                        "--backend", "cpu"], 1, "fail"),
    ("against-and-reference", "equivalence", ["verify", SINGLE, "--against", "{tmp}/v2",
                                              "--reference", "fp32"], 2, "error"),
    ("reference-ok", "equivalence", ["verify", SINGLE, "--reference", "fp32",
                                     "--backend", "cpu"], 0, "ok"),
    ("reference-fail", "equivalence", ["verify", MISLABELLED, "--reference", "fp32",
                                       "--backend", "cpu"], 1, "fail"),
    ("doctor-serves", "doctor", ["doctor", SINGLE, "--runtime", "transformers"], 0, "ok"),
    ("doctor-plan", "doctor", ["doctor", MISLABELLED, "--runtime", "exllamav2"], 1, "fail"),
    ("doctor-fix", "doctor", ["doctor", MISLABELLED, "--runtime", "exllamav2", "--fix",
                              "{tmp}/fixed"], 0, "ok"),
    ("doctor-no-plan", "doctor", ["doctor", LOSSY_SRC, "--runtime", "sglang"], 1, "fail"),
    ("doctor-usage", "doctor", ["doctor", SINGLE, "--runtime", "nope"], 2, "error"),
    ("scan-usage", "scan", ["scan"], 2, "error"),
]
PROCESS = {"inspect-usage-unknown-option", "verify-usage-bad-value",
           "convert-usage-bad-value"}


def corpus_runs():
    """(case id, schema, argv) of inspect and verify over every shipped invalid/hostile case."""
    for corpus in ("invalid", "hostile"):
        for d in sorted((FIXTURES / corpus).iterdir()):
            expect = json.loads((d / "expect.json").read_text())
            target = d / expect.get("path", ".")
            yield f"{corpus}-{d.name}-inspect", "inspect", ["inspect", target]
            yield f"{corpus}-{d.name}-verify", "report", ["verify", target, *expect["args"]]


class Outputs(NamedTuple):
    runs: dict        # case -> (exit code, stdout, stderr) of the targeted CASES
    docs: Path        # <case>.json, every case's stdout
    by_schema: dict   # schema name -> [<case>.json]
    verdicts: dict    # case -> check-jsonschema's errors for its document


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Every case's output written to a file, and what check-jsonschema said about each file,
    validating with the schema file in the source tree (one run per schema)."""
    tmp = tmp_path_factory.mktemp("outputs")
    docs = tmp_path_factory.mktemp("docs")
    runs, by_schema = {}, {}
    runner = CliRunner()
    for case, schema, argv, _, _ in CASES:
        args = [str(a).format(tmp=tmp) for a in argv] + ["--format", "json"]
        if case in PROCESS:
            r = gptqfmt(*args)
            runs[case] = (r.returncode, r.stdout, r.stderr)
        else:
            r = runner.invoke(main, args, catch_exceptions=False)
            runs[case] = (r.exit_code, r.stdout, r.stderr)
        (docs / f"{case}.json").write_text(runs[case][1])
        by_schema.setdefault(schema, []).append(docs / f"{case}.json")
    for case, schema, argv in corpus_runs():
        r = runner.invoke(main, [*map(str, argv), "--format", "json"], catch_exceptions=False)
        (docs / f"{case}.json").write_text(r.stdout)
        by_schema.setdefault(schema, []).append(docs / f"{case}.json")
    cache = tmp_path_factory.mktemp("cache")
    verdicts = {}
    for schema, files in by_schema.items():
        found = errors_by_file(check(SCHEMAS / f"{schema}{SUFFIX}", files, cache))
        verdicts.update({f.stem: found.get(str(f), []) for f in files})
    return Outputs(runs, docs, by_schema, verdicts)


@pytest.mark.parametrize(("case", "schema", "argv", "exit_code", "status"), CASES,
                         ids=[c[0] for c in CASES])
def test_command_output_satisfies_its_schema_file(outputs, case, schema, argv, exit_code,
                                                  status):
    code, stdout, stderr = outputs.runs[case]
    assert code == exit_code, stdout + stderr
    doc = json.loads(stdout)  # exactly one JSON document
    assert doc["status"] == status
    assert doc["exit_code"] == exit_code  # every document carries it
    assert outputs.verdicts[case] == [], f"{case} vs {schema}{SUFFIX}: {outputs.verdicts[case]}"


def test_a_plain_validator_given_the_file_alone_accepts_every_output(outputs):
    """jsonschema.validate(doc, schema) with the schema file as loaded: no registry, no
    neighbouring file, no network."""
    for schema, files in outputs.by_schema.items():
        raw = json.loads((SCHEMAS / f"{schema}{SUFFIX}").read_text("utf-8"))
        for f in files:
            jsonschema.validate(json.loads(f.read_text()), raw)


def test_corpus_outputs_satisfy_their_schema_files(outputs):
    assert set(outputs.by_schema) == set(OUTPUT_SCHEMAS)
    runs = list(corpus_runs())
    assert len(runs) >= 2 * 70  # both corpora were found
    bad = {case: outputs.verdicts[case] for case, _, _ in runs if outputs.verdicts[case]}
    assert not bad, bad


def broken(doc: dict) -> dict:
    """`doc` with one finding whose severity no schema allows."""
    finding = {"code": "GQ401", "severity": "fatal", "file": None, "tensor": None,
               "message": "made up"}
    return {**doc, "findings": [finding, *doc["findings"]]}


@pytest.mark.parametrize(("schema", "case"), [("inspect", "inspect-fail"),
                                              ("report", "verify-fail"),
                                              ("convert", "convert-ok"),
                                              ("equivalence", "against-ok")])
def test_a_broken_finding_is_rejected(outputs, tmp_path, schema, case):
    doc = json.loads((outputs.docs / f"{case}.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken(doc)))
    found = errors_by_file(check(SCHEMAS / f"{schema}{SUFFIX}", [bad], tmp_path / "cache"))
    assert found == {str(bad): ["$.findings[0].severity: "
                                "'fatal' is not one of ['error', 'warning', 'info']"]}
    in_process = [e.message for e in validator(schema).iter_errors(broken(doc))]
    assert in_process == ["'fatal' is not one of ['error', 'warning', 'info']"]


def test_a_lone_schema_file_validates_by_itself(outputs, tmp_path):
    """As a user copies it, or as the wheel ships it (site-packages/gptqfmt/schemas): the file
    alone, in a folder with no other schema, resolves every reference."""
    doc = outputs.docs / "inspect-fail.json"
    assert json.loads(doc.read_text())["findings"]  # the finding $ref is followed
    for name in OUTPUT_SCHEMAS:
        lone = tmp_path / name
        lone.mkdir()
        shutil.copy(SCHEMAS / f"{name}{SUFFIX}", lone)
        r = check(lone / f"{name}{SUFFIX}", outputs.by_schema[name][:3], tmp_path / "cache")
        assert errors_by_file(r) == {}, name
    r = check(tmp_path / "inspect" / f"inspect{SUFFIX}", [doc], tmp_path / "cache")
    assert errors_by_file(r) == {} and "Unresolvable" not in r.stderr


def closed(schema: dict) -> dict:
    """`schema` where every object that lists its properties allows no other key (conditions and
    branches, which list some properties only, are left as they are)."""
    schema = json.loads(json.dumps(schema))
    for _, sub, parent in walk(schema):
        if ("properties" in sub and parent not in ("if", "then", "else", "allOf", "anyOf",
                                                   "oneOf", "not")
                and "additionalProperties" not in sub):
            sub["additionalProperties"] = False
    return schema


def test_every_key_the_commands_emit_is_a_described_property(outputs):
    """The descriptions document the output only if every key that appears is a property."""
    registry = referencing.Registry().with_resources(
        (p.name, DRAFT202012.create_resource(closed(load(p)))) for p in schema_files())
    undocumented = set()
    for schema, files in outputs.by_schema.items():
        v = jsonschema.Draft202012Validator(closed(load(SCHEMAS / f"{schema}{SUFFIX}")),
                                            registry=registry)
        for f in files:
            undocumented |= {f"{schema}: {e.json_path}: {e.message}"
                             for e in v.iter_errors(json.loads(f.read_text()))}
    assert not undocumented, sorted(undocumented)


def test_the_key_check_finds_an_undescribed_key():
    schema = {"type": "object", "properties": {"a": {"description": "A key.",
                                                      "properties": {"b": {"description": "B."}}}},
              "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["a"]}}
    v = jsonschema.Draft202012Validator(closed(schema))
    found = sorted((e.json_path, e.message)
                   for e in v.iter_errors({"a": {"b": 1, "c": 2}, "d": 3}))
    assert found == [("$", "Additional properties are not allowed ('d' was unexpected)"),
                     ("$.a", "Additional properties are not allowed ('c' was unexpected)")]
