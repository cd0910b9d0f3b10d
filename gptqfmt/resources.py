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
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012

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
    return referencing.Registry().with_resources(
        (f"{n}{SCHEMA_SUFFIX}", DRAFT202012.create_resource(schema(n))) for n in schema_names())


@lru_cache(maxsize=None)
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for schema `name` (each is self-contained; with the registry, a `$ref` to a
    shipped schema by file name resolves too)."""
    return jsonschema.Draft202012Validator(schema(name), registry=registry())
