"""Locate the data directories shipped with the package (schemas/, kernels/).

Installed wheels carry them inside the package (gptqfmt/schemas, gptqfmt/kernels); a source
checkout keeps them at the repository's top level.
"""
from __future__ import annotations

import json

import jsonschema
import referencing
from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gptqfmt data directory '{name}' not found beside {_PKG}")


@lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """A JSON Schema from schemas/, e.g. schema('inspect')."""
    return json.loads((data_dir("schemas") / f"{name}.schema.json").read_text("utf-8"))


@lru_cache(maxsize=None)
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator for schema `name` that resolves references to the other shipped schemas."""
    resources = []
    for p in sorted(data_dir("schemas").glob("*.schema.json")):
        doc = schema(p.name.removesuffix(".schema.json"))
        resources.append((doc["$id"], referencing.Resource.from_contents(doc)))
    registry = referencing.Registry().with_resources(resources)
    return jsonschema.Draft202012Validator(schema(name), registry=registry)
