"""Reading and writing perfguard's JSON files: strict on the way in, atomic on the way out.

Every reader error is a `PerfguardError` (exit 2) whose one line names the file and, for
schema violations and non-finite numbers, the JSON path of the offending field. NaN,
Infinity and literals that overflow to infinity (`1e400`) are refused: `json` accepts them
by default, but a timing that is not a finite number is a bug upstream, and letting it
through would make every comparison with it quietly false.

The readers are strict where `json` is lenient, because a file that half-parses is worse
than one that fails: a key written twice (`json` keeps the last one, so a careless merge
that appends `"scenarios": {}` empties a baseline), a byte-order mark, bytes that are not
UTF-8, a lone surrogate escape (`"\\ud800"`, which no UTF-8 writer can write back) and
an empty file are each an error naming the file. The limits below turn what would be a
crash (`RecursionError`, `MemoryError`, `ValueError` from a 5000-digit integer) into the
same one-line error; they sit far above anything perfguard or sglang writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import stat
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from perfguard.errors import PerfguardError

MAX_BYTES = 64 * 2**20
"""The largest file perfguard reads (64 MiB). A baseline with every sample of a 50-step
case is about 100 kB; a 16-shard merged report a few MB."""
MAX_DEPTH = 32
"""The deepest nesting of arrays and objects accepted. perfguard's files nest 7 deep;
`json` itself would overflow the stack (`RecursionError`) somewhere near 1000."""
MAX_NUMBER_CHARS = 40
"""The longest number literal accepted: 17 significant digits, a sign, a point and an
exponent fit in 25. Python refuses integers over 4300 digits with a `ValueError`."""

_UTF8_BOM = b"\xef\xbb\xbf"
_SURROGATE = re.compile("[\ud800-\udfff]")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_:./*?-]+$")


class _NotFinite:
    """Stands in for `NaN`, `Infinity` or a literal that overflows (`1e400`) while parsing,
    so that the error can name the field: `json` hands its hooks the token, not the path."""

    __slots__ = ("reason", "token")

    def __init__(self, token: str, reason: str) -> None:
        self.token = token
        self.reason = reason


def read_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The text of `path`: at most `MAX_BYTES`, UTF-8 without a byte-order mark.

    Shared by every reader (JSON, TOML, sglang's performance.log), so that each refuses
    the same inputs with the same one line naming the file.
    """
    path = Path(path)
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            # A FIFO, socket or device would block the read (or never end): refuse it
            # before opening, so a wrong argument is one line, not a hung CI job.
            raise PerfguardError(
                f"{path}: not a regular file (a pipe or device?), expected a {what}"
            )
        size = info.st_size
        if size > MAX_BYTES:
            raise PerfguardError(
                f"{path}: {size} bytes is over the {MAX_BYTES // 2**20} MiB limit for a {what}"
            )
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise PerfguardError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise PerfguardError(f"{path}: is a directory, expected a {what}") from exc
    except OSError as exc:
        raise PerfguardError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BYTES:  # grew between stat and read (a pipe, a file being written)
        raise PerfguardError(f"{path}: over the {MAX_BYTES // 2**20} MiB limit for a {what}")
    if raw.startswith(_UTF8_BOM):
        raise PerfguardError(f"{path}: starts with a byte-order mark (save it as UTF-8 without)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PerfguardError(
            f"{path}: byte {exc.start}: not UTF-8 ({raw[exc.start : exc.start + 1]!r})"
        ) from exc


def _problem(data: Any, duplicates: dict[int, str]) -> tuple[list[Any] | None, str] | None:
    """The first defect in parsed `data` (document order), as (path, message), or None:
    nesting over `MAX_DEPTH`, a duplicate key, a refused number, a lone surrogate.

    Iterative, so that it cannot overflow the stack itself.
    """
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return None, f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, _NotFinite):
            return path, f"{value.token} {value.reason}"
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path, "holds a lone UTF-16 surrogate escape (not a character)"
        elif isinstance(value, dict):
            if id(value) in duplicates:
                key = duplicates[id(value)]
                return [*path, key], f"duplicate key {json.dumps(key, ensure_ascii=False)}"
            children = []
            for key, child in value.items():
                if _SURROGATE.search(key):
                    return [*path, key], "key holds a lone UTF-16 surrogate escape"
                children.append((child, [*path, key]))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend((child, [*path, i]) for i, child in reversed(list(enumerate(value))))
    return None


class _DuplicateKeys:
    """The `object_pairs_hook` that notes the first object holding a key twice (json keeps
    the last value silently); `_problem` reports it with its path."""

    def __init__(self) -> None:
        self.duplicates: dict[int, str] = {}
        self.keep: list[Any] = []  # the objects whose id() is a key of `duplicates` stay alive

    def pairs(self, items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not self.duplicates:
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    self.duplicates[id(obj)] = key
                    self.keep.append(obj)
                    break
                seen.add(key)
        return obj


def _too_long(token: str) -> _NotFinite | None:
    if len(token) > MAX_NUMBER_CHARS:
        return _NotFinite(
            f"{token[:12]}...",
            f"is a number of {len(token)} characters (limit {MAX_NUMBER_CHARS})",
        )
    return None


def _parse_float(token: str) -> Any:
    long = _too_long(token)
    if long is not None:
        return long
    value = float(token)  # 1e400 overflows to inf without complaint
    return _NotFinite(token, "is not a finite number") if math.isinf(value) else value


def _parse_int(token: str) -> Any:
    long = _too_long(token)
    return long if long is not None else int(token)


def loads(text: str, source: str) -> Any:
    """Parse JSON text from `source` (a file name for messages), strictly (module doc)."""
    if not text.strip():
        raise PerfguardError(f"{source}: empty file, expected a JSON object")
    if text.startswith("\ufeff"):
        raise PerfguardError(f"{source}: starts with a byte-order mark (save it without)")
    if len(text) > MAX_BYTES:
        raise PerfguardError(f"{source}: over the {MAX_BYTES // 2**20} MiB limit")
    keys = _DuplicateKeys()
    try:
        data = json.loads(
            text,
            object_pairs_hook=keys.pairs,
            parse_constant=lambda token: _NotFinite(token, "is not a valid number here"),
            parse_float=_parse_float,
            parse_int=_parse_int,
        )
    except json.JSONDecodeError as exc:
        raise PerfguardError(
            f"{source}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError as exc:
        raise PerfguardError(f"{source}: nested deeper than {MAX_DEPTH} levels") from exc
    except MemoryError as exc:
        raise PerfguardError(f"{source}: too large to parse in memory") from exc
    except ValueError as exc:  # pragma: no cover - the hooks above catch what json passes on
        raise PerfguardError(f"{source}: {exc}") from exc
    found = _problem(data, keys.duplicates)
    if found is not None:
        where = "" if found[0] is None else f"{json_path(found[0])}: "
        raise PerfguardError(f"{source}: {where}{found[1]}")
    return data


def read_json(path: str | os.PathLike[str], *, expect_object: bool = True) -> Any:
    """Read and parse `path` strictly (`read_text`, then `loads`)."""
    path = Path(path)
    data = loads(read_text(path, "JSON file"), str(path))
    if expect_object and not isinstance(data, dict):
        raise PerfguardError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


@cache
def schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped in `perfguard/storage/schemas/<name>.schema.json`."""
    text = resources.files("perfguard").joinpath(f"storage/schemas/{name}.schema.json").read_text()
    return json.loads(text)


def json_path(parts: Any) -> str:
    """`["scenarios", "x", "stages_ms"]` -> `$.scenarios.x.stages_ms`.

    A key with characters beyond those of ids and metric names is written quoted
    (`$.cases["a b"]`), so that a hostile key cannot make the path say something else;
    a key longer than `KEY_SHOWN` characters is cut, with `...` after its quotes (a
    100 kB key makes a one-line message, not a 100 kB one).
    """
    out = "$"
    for part in parts:
        key = str(part)
        if isinstance(part, int):
            out += f"[{part}]"
        elif _BARE_KEY.match(key) and len(key) <= KEY_SHOWN:
            out += f".{key}"
        else:
            cut = "..." if len(key) > KEY_SHOWN else ""
            out += f"[{json.dumps(key[:KEY_SHOWN], ensure_ascii=True)}{cut}]"
    return out


KEY_SHOWN = 80
"""How many characters of a key an error's JSON path shows."""
MESSAGE_SHOWN = 300
"""How many characters of a schema error's message are shown (its value quoted in it)."""


def validate(data: Any, schema_name: str, source: str) -> None:
    """Validate against a shipped schema; the first error (deepest path first) is raised."""
    validator = jsonschema.Draft202012Validator(schema(schema_name))
    errors = list(validator.iter_errors(data))
    if errors:
        err = max(errors, key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
        message = err.message
        if len(message) > MESSAGE_SHOWN:
            message = message[:MESSAGE_SHOWN] + f"... ({len(message)} characters)"
        raise PerfguardError(f"{source}: {json_path(err.absolute_path)}: {message}")


def dumps(data: Any) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """`write_text_atomic` of `dumps(data)`."""
    write_text_atomic(path, dumps(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """`write_bytes_atomic` of `text` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write through a temporary file in the same directory, fsync, then `os.replace`.

    Readers never see a half-written file and a crash (even SIGKILL) leaves the previous
    file intact: until `os.replace`, the new bytes live only in the temporary file. A
    failure (a full disk, a read-only directory, no permission) removes the temporary
    file and is a `PerfguardError` (exit 2) naming `path`. The file ends with the
    permissions a plain `open(path, "w")` gives: those of the file it replaces, else
    0o666 less the umask. (`tempfile.mkstemp` creates 0o600, which would leave every
    baseline and report readable by its owner only.)
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    except OSError as exc:
        raise PerfguardError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise PerfguardError(f"{path}: cannot write: {exc.strerror or exc}") from exc
        raise
