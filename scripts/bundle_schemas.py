#!/usr/bin/env python3
"""Make every schema in schemas/ self-contained, so that a plain validator given one file needs
no registry, no neighbouring file and no network:

    jsonschema.validate(doc, json.load(open("schemas/convert.schema.json")))
    check-jsonschema --schemafile schemas/convert.schema.json out.json

A definition is written once, in its home schema (finding, tool, convention, ... in
report.schema.json's `$defs`; bits, group_size, pack_dtype in quantize_config.schema.json's).
Each schema that uses one carries a copy in its own `$defs`, under the same name, with local
references (`#/$defs/finding`), and with a `$comment` naming its home. The copies are written
here, never by hand:

    python3 scripts/bundle_schemas.py --write   # rewrite every copy from its home
    python3 scripts/bundle_schemas.py --check   # exit 1, naming each stale file

To use another schema's definition, reference it where it lives
(`"$ref": "report.schema.json#/$defs/finding"`, or `"report.schema.json"` for the whole of it)
and run --write: the reference becomes local and the copy appears, with the copies of whatever
it references in turn. A copy no schema needs any longer is removed. Only the `$ref`s and the
copies change in a file: the rest keeps its text and layout (the schema's own definitions keep
theirs, one to a line, before the copies).
tests/cli/test_schemas.py runs --check's comparison.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
SUFFIX = ".schema.json"
SCRIPT = "scripts/bundle_schemas.py"
MARK = re.compile(r"^Copy of (\S+) by scripts/bundle_schemas\.py")
# a $ref to another schema file of the folder, with or without a fragment
FOREIGN_REF = re.compile(r'("\$ref"\s*:\s*")([^"#/]+' + re.escape(SUFFIX) + r')(#[^"]*)?"')

# Subschema keywords of draft 2020-12: a single schema, a list of schemas, a map of schemas.
ONE = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "contains",
       "propertyNames", "not", "if", "then", "else")
MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")


class BundleError(Exception):
    """A schema the copies cannot be written for (a dangling reference, a name taken twice)."""


def mark(source: str) -> str:
    """The `$comment` of a copy of `source` ("report.schema.json#/$defs/finding")."""
    return (f"Copy of {source} by {SCRIPT}: edit it there, then run "
            f"`python3 {SCRIPT} --write`.")


def copied_from(body: Any) -> str | None:
    """The home of a copy (the pointer its `$comment` names); None for a definition of its own."""
    if not isinstance(body, dict):
        return None
    found = MARK.match(str(body.get("$comment", "")))
    return found.group(1) if found else None


def subschemas(schema: Any, skip_copies: bool = False) -> Iterator[dict]:
    """`schema` and every schema object inside it (a copy in `$defs` left out with
    `skip_copies`)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for kw in ONE:
        yield from subschemas(schema.get(kw), skip_copies)
    for kw in MANY:
        for sub in schema.get(kw, []) if isinstance(schema.get(kw), list) else []:
            yield from subschemas(sub, skip_copies)
    for kw in MAP:
        members = schema.get(kw)
        for sub in members.values() if isinstance(members, dict) else []:
            if not (skip_copies and kw == "$defs" and copied_from(sub)):
                yield from subschemas(sub, skip_copies)


def refs(schema: Any, here: str, skip_copies: bool = False) -> Iterator[tuple[str, str]]:
    """(file, fragment) of every `$ref` inside `schema`, which is written in file `here`."""
    for sub in subschemas(schema, skip_copies):
        ref = sub.get("$ref")
        if isinstance(ref, str):
            yield split(ref, here)


def split(ref: str, here: str) -> tuple[str, str]:
    """(file, fragment) of a `$ref` made in file `here`."""
    target, _, fragment = ref.partition("#")
    return target or here, fragment


def name_of(source: str) -> str:
    """The name a copy of `source` takes in `$defs`: the definition's own, or for a whole
    schema its file's stem ("report")."""
    target, fragment = split(source, "")
    if fragment == "":
        return target.removesuffix(SUFFIX)
    parts = fragment.split("/")
    if len(parts) != 3 or parts[:2] != ["", "$defs"]:
        raise BundleError(f"$ref {source!r}: only a schema file or one of its $defs can be "
                          "copied (#/$defs/NAME)")
    return parts[2]


class Folder:
    """The schemas of one folder, parsed, and the copies each one needs."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.texts = {p.name: p.read_text("utf-8") for p in sorted(folder.glob(f"*{SUFFIX}"))}
        self.docs = {n: json.loads(t) for n, t in self.texts.items()}

    def home(self, file: str, fragment: str) -> str:
        """The pointer to where the definition at file#fragment is written (following a copy to
        its home)."""
        if file not in self.docs:
            raise BundleError(f"$ref to {file}: no such schema in {self.folder}")
        source = file if fragment == "" else f"{file}#{fragment}"
        if fragment:
            body = self.docs[file].get("$defs", {}).get(name_of(source))
            if body is None:
                raise BundleError(f"$ref {source!r}: {file} has no such definition")
            return copied_from(body) or source
        return source

    def body(self, source: str) -> dict:
        """The definition at its home, as written there (a whole schema without its `$schema`
        and `$defs`: those are copied one by one)."""
        file, fragment = split(source, "")
        doc = self.docs[file]
        if fragment == "":
            return {k: v for k, v in doc.items() if k not in ("$schema", "$defs")}
        return doc["$defs"][name_of(source)]

    def needed(self, name: str) -> dict[str, str]:
        """{copy name: home pointer} of every copy schema `name` needs: those its own text
        references (by a foreign `$ref`, or a local one to a copy it has), and theirs in turn."""
        doc = self.docs[name]
        own = {k for k, v in doc.get("$defs", {}).items() if not copied_from(v)}

        def mine(file: str, fragment: str) -> bool:
            """Whether a reference of `name`'s own text stays as it is: to itself, to one of
            its own definitions, or to any other place inside it."""
            return file == name and (not fragment.startswith("/$defs/")
                                     or fragment.split("/")[2] in own)

        todo = [self.home(f, frag) for f, frag in refs(doc, name, skip_copies=True)
                if not mine(f, frag)]
        out: dict[str, str] = {}
        while todo:
            source = todo.pop(0)
            copy_name = name_of(source)
            if copy_name in own:
                raise BundleError(f"{name}: its own $defs/{copy_name} has the name the copy "
                                  f"of {source} needs; rename one of them")
            if out.get(copy_name, source) != source:
                raise BundleError(f"{name}: both {out[copy_name]} and {source} would be copied "
                                  f"as $defs/{copy_name}; rename one of them")
            if copy_name in out:
                continue
            out[copy_name] = source
            home = split(source, "")[0]
            todo += [self.home(f, frag) for f, frag in refs(self.body(source), home)]
        return dict(sorted(out.items()))

    def copy_of(self, source: str) -> dict:
        """The copy of `source`: its `$comment`, then its body with every reference local."""
        home_file = split(source, "")[0]
        body = copy.deepcopy(self.body(source))
        if "$comment" in body:
            raise BundleError(f"{source}: a definition to be copied carries a $comment of its "
                              "own, where the copy's mark goes")
        for sub in subschemas(body):
            if isinstance(sub.get("$ref"), str):
                file, fragment = split(sub["$ref"], home_file)
                sub["$ref"] = f"#/$defs/{name_of(self.home(file, fragment))}"
        return {"$comment": mark(source), **body}

    def bundled(self, name: str) -> str:
        """The text schema `name` should have: its foreign `$ref`s made local, and its copies
        written from their homes, at the end of its `$defs`."""
        names = self.needed(name)
        text = FOREIGN_REF.sub(
            lambda m: f'{m.group(1)}#/$defs/'
                      f'{name_of(self.home(m.group(2), (m.group(3) or "#")[1:]))}"',
            self.texts[name])
        copies = {n: self.copy_of(s) for n, s in names.items()}
        out = _with_copies(text, copies)
        left = [ref for ref in refs(json.loads(out), name) if ref[0] != name]
        if left:
            raise BundleError(f"{name}: $ref to {left[0][0]} not written as "
                              f'"$ref": "FILE{SUFFIX}#/$defs/NAME"; the script cannot make it '
                              "local")
        return out


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _members(text: str, start: int) -> tuple[list[tuple[str, int, int, int]], int]:
    """([(key, start of the key, start of the value, end of the value)], index of the closing
    brace) of the JSON object whose `{` is at text[start]."""
    decoder = json.JSONDecoder()
    out: list[tuple[str, int, int, int]] = []
    i = _ws(text, start + 1)
    if text[i] == "}":
        return out, i
    while True:
        key, end = decoder.raw_decode(text, i)
        colon = _ws(text, end)
        assert text[colon] == ":", text[colon:colon + 40]
        value = _ws(text, colon + 1)
        _, value_end = decoder.raw_decode(text, value)
        out.append((key, i, value, value_end))
        i = _ws(text, value_end)
        if text[i] == "}":
            return out, i
        assert text[i] == ",", text[i:i + 40]
        i = _ws(text, i + 1)


def _column(text: str, i: int) -> int:
    return i - (text.rfind("\n", 0, i) + 1)


def _with_copies(text: str, copies: dict[str, dict]) -> str:
    """`text` (one schema object) with the copies in its `$defs` replaced by `copies`: its own
    definitions keep their text and order, the copies follow them."""
    members, _ = _members(text, _ws(text, 0))
    indent = " " * (_column(text, members[0][1]) if members else 2)
    defs = next((m for m in members if m[0] == "$defs"), None)
    if defs is None:
        if not copies:
            return text
        end = members[-1][3]
        block = _defs_text([], copies, indent, indent * 2)
        return f'{text[:end]},\n{indent}"$defs": {block}{text[end:]}'
    _, key_start, brace, value_end = defs
    inner, _ = _members(text, brace)
    own = [text[k:e] for _, k, v, e in inner if not copied_from(json.loads(text[v:e]))]
    if len(own) == len(inner) and not copies:
        return text     # no copy, before or after
    if not own and not copies:   # nothing left in $defs: no $defs
        before = [m[3] for m in members if m[3] < key_start]
        after = [m[1] for m in members if m[1] > value_end]
        if before:
            return text[:before[-1]] + text[value_end:]
        return text[:key_start] + text[after[0]:] if after else text[:key_start] + text[
            _ws(text, value_end):]
    inner_indent = " " * _column(text, inner[0][1]) if inner else indent * 2
    return text[:brace] + _defs_text(own, copies, indent, inner_indent) + text[value_end:]


def _defs_text(own: list[str], copies: dict[str, dict], indent: str, inner: str) -> str:
    """A `$defs` object: the schema's own definitions as written, then the copies."""
    parts = own + [f"{json.dumps(n)}: {_dump(body, inner)}" for n, body in copies.items()]
    return "{" + ",".join(f"\n{inner}{p}" for p in parts) + f"\n{indent}}}"


def _dump(value: Any, indent: str) -> str:
    """JSON text of `value` for a line indented by `indent`: an object one member a line, a
    list of plain values on one line."""
    if isinstance(value, dict) and value:
        inner = indent + "  "
        members = [f"{json.dumps(k, ensure_ascii=False)}: {_dump(v, inner)}"
                   for k, v in value.items()]
        return "{" + ",".join(f"\n{inner}{m}" for m in members) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        inner = indent + "  "
        return "[" + ",".join(f"\n{inner}{_dump(v, inner)}" for v in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)


def stale(folder: Path = SCHEMAS) -> dict[str, str]:
    """{file name: the text it should have} of every schema whose text is not what --write
    writes (a copy that differs from its home, a foreign $ref, a copy missing or unneeded)."""
    f = Folder(folder)
    want = {n: f.bundled(n) for n in f.texts}
    return {n: t for n, t in want.items() if t != f.texts[n]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the stale schemas")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 naming each stale schema; write nothing")
    p.add_argument("--folder", type=Path, default=SCHEMAS, help="the schemas' folder")
    args = p.parse_args(argv)
    try:
        todo = stale(args.folder)
    except BundleError as e:
        print(f"bundle_schemas: error: {e}", file=sys.stderr)
        return 2
    for name, text in todo.items():
        path = args.folder / name
        if args.write:
            path.write_text(text, "utf-8")
            print(f"{path}: copies rewritten")
        else:
            print(f"{path}: its copies of other schemas' definitions are stale; run "
                  f"`python3 {SCRIPT} --write`", file=sys.stderr)
    return 1 if todo and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
