"""JSON files: strict reading, deterministic text, atomic writes with ordinary permissions."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfguard.errors import PerfguardError
from perfguard.storage.jsonio import read_json, write_json_atomic


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.usefixtures("umask_022")
def test_a_new_file_gets_the_umask_permissions_not_mkstemps_0600(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "baseline.json"
    write_json_atomic(path, {"b": 1, "a": [1.5]})
    assert _mode(path) == 0o644
    assert path.read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert [p.name for p in path.parent.iterdir()] == ["baseline.json"]  # no temp file left


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.usefixtures("umask_022")
def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_json_atomic(path, {"a": 1})
    assert _mode(path) == 0o640
    assert read_json(path) == {"a": 1}


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.json"
    write_json_atomic(path, {"a": 1})

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(PerfguardError, match=rf"^{re.escape(str(path))}: cannot write: No space"):
        write_json_atomic(path, {"a": 2})
    assert read_json(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize("text", ["", "{", "[1]", "1" * 5000])
def test_bad_json_is_a_one_line_usage_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(PerfguardError, match=r"bad\.json") as info:
        read_json(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": {"b": [1.0, NaN]}}', r"\$\.a\.b\[1\]: NaN is not a valid number here"),
        ('{"a": -Infinity}', r"\$\.a: -Infinity is not a valid number here"),
        ('{"a": [{"median": 1e400}]}', r"\$\.a\[0\]\.median: 1e400 is not a finite number"),
        ("-1e999", r"\$: -1e999 is not a finite number"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_with_its_json_path(
    tmp_path: Path, text: str, message: str
) -> None:
    """Refused at parse time (later comparisons with NaN or inf are quietly false), yet
    named like a schema violation: the file, then the field."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(PerfguardError, match=rf"^{re.escape(str(path))}: {message}$"):
        read_json(path, expect_object=False)
