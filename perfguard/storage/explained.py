"""The files `perfguard explain` and `perfguard bisect` write, checked before writing.

An attribution section has one schema wherever it appears: `$defs/attribution` of
`report.schema.json`, which a check's report holds under `attribution`; the explain
file (`attribution.json`) and the bisect report hold the same section, validated
against the same definition, so one reader reads all three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jsonschema

from perfguard.errors import PerfguardError
from perfguard.storage.jsonio import json_path, schema, write_json_atomic

BISECT_KIND = "perfguard-bisect"
BISECT_SCHEMA_VERSION = 1


def validate_attribution(data: Mapping[str, Any], source: str) -> None:
    """Check an attribution section against `report.schema.json#/$defs/attribution`."""
    defs = schema("report")["$defs"]
    validator = jsonschema.Draft202012Validator({"$ref": "#/$defs/attribution", "$defs": defs})
    errors = list(validator.iter_errors(dict(data)))
    if errors:
        err = max(errors, key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
        where = json_path(["attribution", *err.absolute_path])
        raise PerfguardError(f"{source}: {where}: {err.message}")


def write_bisect_report(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write a bisect report atomically, its attribution (if any) validated first."""
    if not data.get("kind") == BISECT_KIND:
        raise ValueError("not a bisect report")
    first = data.get("first_bad") or {}
    if first.get("attribution"):
        validate_attribution(first["attribution"], f"{path} (about to be written)")
    write_json_atomic(path, dict(data))
