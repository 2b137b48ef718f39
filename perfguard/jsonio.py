"""Reading and writing perfguard's JSON files: strict on the way in, atomic on the way out.

Every reader error is a `PerfguardError` (exit 2) whose one line names the file and, for
schema violations and non-finite numbers, the JSON path of the offending field. NaN,
Infinity and literals that overflow to infinity (`1e400`) are refused: `json` accepts them
by default, but a timing that is not a finite number is a bug upstream, and letting it
through would make every comparison with it quietly false.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from perfguard.errors import PerfguardError


class _NotFinite:
    """Stands in for `NaN`, `Infinity` or a literal that overflows (`1e400`) while parsing,
    so that the error can name the field: `json` hands its hooks the token, not the path."""

    __slots__ = ("reason", "token")

    def __init__(self, token: str, reason: str) -> None:
        self.token = token
        self.reason = reason


def _path_to(data: Any, target: object) -> list[Any] | None:
    """The keys and indices from `data` down to the very object `target`, if it is there."""
    if data is target:
        return []
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = _path_to(value, target)
        if found is not None:
            return [key, *found]
    return None


def loads(text: str, source: str) -> Any:
    """Parse JSON text from `source` (a file name for messages)."""
    if not text.strip():
        raise PerfguardError(f"{source}: empty file, expected a JSON object")
    refused: list[_NotFinite] = []

    def refuse(token: str, reason: str) -> _NotFinite:
        refused.append(_NotFinite(token, reason))
        return refused[-1]

    def parse_float(token: str) -> Any:
        value = float(token)  # 1e400 overflows to inf without complaint
        return refuse(token, "is not a finite number") if math.isinf(value) else value

    try:
        data = json.loads(
            text,
            parse_constant=lambda token: refuse(token, "is not a valid number here"),
            parse_float=parse_float,
        )
    except json.JSONDecodeError as exc:
        raise PerfguardError(
            f"{source}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise PerfguardError(f"{source}: {exc}") from exc
    if refused:
        first = refused[0]
        raise PerfguardError(
            f"{source}: {json_path(_path_to(data, first) or [])}: {first.token} {first.reason}"
        )
    return data


def read_json(path: str | os.PathLike[str], *, expect_object: bool = True) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PerfguardError(f"{path}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfguardError(f"{path}: cannot read: {exc}") from exc
    data = loads(text, str(path))
    if expect_object and not isinstance(data, dict):
        raise PerfguardError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


@cache
def schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped in `perfguard/schemas/<name>.schema.json`."""
    text = resources.files("perfguard").joinpath(f"schemas/{name}.schema.json").read_text()
    return json.loads(text)


def json_path(parts: Any) -> str:
    """`["scenarios", "x", "stages_ms"]` -> `$.scenarios.x.stages_ms`."""
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def validate(data: Any, schema_name: str, source: str) -> None:
    """Validate against a shipped schema; the first error (deepest path first) is raised."""
    validator = jsonschema.Draft202012Validator(schema(schema_name))
    errors = list(validator.iter_errors(data))
    if errors:
        err = max(errors, key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
        raise PerfguardError(f"{source}: {json_path(err.absolute_path)}: {err.message}")


def dumps(data: Any) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """`write_text_atomic` of `dumps(data)`."""
    write_text_atomic(path, dumps(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write through a temporary file in the same directory, fsync, then `os.replace`.

    Readers never see a half-written file and a crash leaves the previous file intact.
    The file ends with the permissions a plain `open(path, "w")` gives: those of the file
    it replaces, else 0o666 less the umask. (`tempfile.mkstemp` creates 0o600, which would
    leave every baseline and report readable by its owner only.)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
