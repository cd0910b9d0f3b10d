"""Locate the data directories shipped with the package (schemas/, kernels/).

Installed wheels carry them inside the package (gptqfmt/schemas, gptqfmt/kernels); a source
checkout keeps them at the repository's top level.

Each schema file is self-contained: every `$ref` is local (`#/$defs/finding`), and a definition
shared with another schema is a copy of it, written from its one home (report.schema.json,
quantize_config.schema.json) by scripts/bundle_schemas.py. So a plain validator given the one
file needs nothing else: `jsonschema.validate(doc, json.load(f))`, `check-jsonschema
--schemafile .../convert.schema.json`, with no registry, no neighbour and no network.
registry() still holds every shipped schema under its file name (no `$id`), for a schema of the
caller's that references one of them ("report.schema.json#/$defs/finding").

jsonschema is imported where a validator is first built: its import (with referencing and
attrs) costs more than a tenth of a second, and the documents every command reads (a
checkpoint's config) are most often plainly valid (plainly_valid), which a command learns
without it.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema
    import referencing

_PKG = Path(__file__).resolve().parent
SCHEMA_SUFFIX = ".schema.json"


def data_dir(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gptqfmt data directory '{name}' not found beside {_PKG}")


def kernel_constant(name: str) -> int:
    """A `#define NAME <integer>` of kernels/gptq_dequant.h: the kernels' limits stated once,
    where the C code needs them."""
    text = (data_dir("kernels") / "gptq_dequant.h").read_text("utf-8")
    found = re.search(rf"^#define {re.escape(name)} (\d+)$", text, re.MULTILINE)
    if found is None:
        raise LookupError(f"kernels/gptq_dequant.h defines no integer {name}")
    return int(found.group(1))


def schema_names() -> list[str]:
    """Names of the shipped schemas, e.g. ['convert', 'equivalence', ...]."""
    return sorted(p.name.removesuffix(SCHEMA_SUFFIX)
                  for p in data_dir("schemas").glob(f"*{SCHEMA_SUFFIX}"))


@lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """A JSON Schema from schemas/, e.g. schema('inspect')."""
    return json.loads((data_dir("schemas") / f"{name}{SCHEMA_SUFFIX}").read_text("utf-8"))


@lru_cache(maxsize=None)
def registry() -> referencing.Registry:
    """Every shipped schema, keyed by its file name (what a relative `$ref` to it from a schema
    without a base URI resolves to)."""
    import referencing
    from referencing.jsonschema import DRAFT202012
    return referencing.Registry().with_resources(
        (f"{n}{SCHEMA_SUFFIX}", DRAFT202012.create_resource(schema(n))) for n in schema_names())


@lru_cache(maxsize=None)
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for schema `name` (each is self-contained; with the registry, a `$ref` to a
    shipped schema by file name resolves too)."""
    import jsonschema
    return jsonschema.Draft202012Validator(schema(name), registry=registry())


def best_error(name: str, doc: Any) -> jsonschema.ValidationError | None:
    """jsonschema's most telling error of `doc` against schema `name` (None: valid)."""
    import jsonschema
    return jsonschema.exceptions.best_match(validator(name).iter_errors(doc))


def schema_errors(name: str, doc: Any) -> list[jsonschema.ValidationError]:
    """Every error of `doc` against schema `name`: none where it is plainly valid, else
    the validator's."""
    return [] if plainly_valid(name, doc) else list(validator(name).iter_errors(doc))


# JSON's types as Python's json module reads them; an integral float ("4.0"), which draft
# 2020-12 counts as an integer, is left to the validator
_TYPES = {"object": lambda v: type(v) is dict, "array": lambda v: type(v) is list,
          "string": lambda v: type(v) is str, "boolean": lambda v: type(v) is bool,
          "null": lambda v: v is None, "integer": lambda v: type(v) is int,
          "number": lambda v: type(v) in (int, float)}
_ANNOTATIONS = frozenset({"$schema", "$defs", "title", "description"})
_PLAIN = frozenset({"type", "enum", "const", "minimum", "properties", "additionalProperties",
                    "anyOf", "$ref"}) | _ANNOTATIONS


def plainly_valid(name: str, doc: Any) -> bool:
    """Whether `doc` is valid against schema `name`, where that is plain to see: True only
    where the validator would find no error. A schema's keywords of the few kinds the shipped
    schemas use (type, enum, const, minimum, properties, additionalProperties, anyOf, a local
    $ref) are applied as draft 2020-12 defines them, and with less latitude where Python's
    values and JSON's differ (1.0 is no integer here, True no 1); any other keyword, or
    value, is not plain. False: invalid, or not plain; the validator says which.

    >>> plainly_valid("quantize_config", {"bits": 4, "group_size": 128, "sym": True})
    True
    >>> plainly_valid("quantize_config", {"bits": 4.0})   # valid, but not plainly so
    False
    """
    root = schema(name)
    return _plain(root, doc, root)


def _plain(s: Any, v: Any, root: dict) -> bool:
    if isinstance(s, bool):
        return s
    if not isinstance(s, dict) or not s.keys() <= _PLAIN:
        return False
    t = s.get("type")
    if t is not None and not any(x in _TYPES and _TYPES[x](v)
                                 for x in ([t] if isinstance(t, str) else t)):
        return False
    if "enum" in s and not any(_same(v, e) for e in s["enum"]):
        return False
    if "const" in s and not _same(v, s["const"]):
        return False
    m = s.get("minimum")
    if m is not None and type(v) in (int, float) and not v >= m:   # NaN: not plain
        return False
    if "anyOf" in s and not any(_plain(x, v, root) for x in s["anyOf"]):
        return False
    ref = s.get("$ref")
    if ref is not None:
        if not (isinstance(ref, str) and ref.startswith("#/$defs/")) or \
                not _plain(root["$defs"].get(ref.removeprefix("#/$defs/"), False), v, root):
            return False
    if type(v) is dict:
        props = s.get("properties", {})
        more = s.get("additionalProperties", True)
        return all(_plain(props[k], x, root) if k in props else _plain(more, x, root)
                   for k, x in v.items())
    return True


def _same(v: Any, e: Any) -> bool:
    """JSON's equality of scalars, with Python's types kept apart (True is not 1)."""
    return type(e) in (str, int, float, bool, type(None)) and type(v) is type(e) and v == e
