"""Property tests, one per reader: any mutation of a real file loads, or fails with exit 2
and one line naming the file. Never a traceback, and the input is never modified.

The files are real: sglang's own `perf_baselines.json` files (the shared fixtures) and
the baselines, results, reports, performance.log, case registry and history archive
that perfguard itself writes. The mutations are those of careless edits, merges and
broken disks: bytes flipped, deleted, inserted or duplicated, a file cut short, and any
value replaced by a string, a boolean, a negative, a zero, a huge or a nested value.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfguard.errors import PerfguardError
from perfguard.interop import sglang
from perfguard.presentation import history
from perfguard.results import Results
from perfguard.storage import baseline as store
from perfguard.storage.archive import add_reports
from perfguard.storage.cases import load_registry
from perfguard.storage.reports import read_report, read_results, write_results
from tests.helpers import H100, NPU, record, write_log
from tests.helpers import history_report as _report  # a real report made by the library

SETTINGS = settings(
    max_examples=int(os.environ.get("PERFGUARD_HYPOTHESIS_EXAMPLES", "30")),  # 400 to search harder
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ---- mutations -----------------------------------------------------------------------------

ODD_BYTES = [b"\x00", b"\xff", b"\xef\xbb\xbf", b'"', b",", b"{", b"]", b"\\", b"NaN", b"1e999"]


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """One to three edits at random places: flip, delete, insert, duplicate, truncate."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "delete", "insert", "duplicate", "truncate"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        size = draw(st.integers(1, 64))
        if kind == "flip" and out:
            out[at] = draw(st.integers(0, 255))
        elif kind == "delete":
            del out[at : at + size]
        elif kind == "insert":
            out[at:at] = draw(st.sampled_from(ODD_BYTES) | st.binary(min_size=1, max_size=8))
        elif kind == "duplicate":
            out[at:at] = out[at : at + size]
        else:
            del out[at:]
    return bytes(out)


HOSTILE_VALUES = st.sampled_from(
    ["12.5", True, False, None, -1, 0, 0.0, 1e308, -1e-300, [], {}, "", "[bold]x", [[[]]]]
) | st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _places(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _places(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _places(value, (*path, i))
    return out


@st.composite
def value_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """A value somewhere in the document replaced, or a key of an object dropped."""
    doc = json.loads(data)
    places = _places(doc)[1:]
    path = places[draw(st.integers(0, len(places) - 1))]
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(HOSTILE_VALUES)
    return json.dumps(doc).encode()


def json_mutation(data: bytes) -> st.SearchStrategy[bytes]:
    return byte_mutation(data) | value_mutation(data)


# ---- the check -----------------------------------------------------------------------------


def check_reader(read: Callable[[Path], Any], path: Path, raw: bytes, names: str) -> None:
    """`read(path)` on `raw`: loads, or one exit-2 line naming `names`; `raw` unchanged."""
    path.write_bytes(raw)
    try:
        read(path)
    except PerfguardError as exc:
        message = str(exc)
        assert exc.exit_code == 2, message
        assert "\n" not in message and names in message, message
    assert path.read_bytes() == raw


# ---- the real files --------------------------------------------------------------------------


@functools.cache
def real_files() -> dict[str, bytes]:
    """Files perfguard wrote (and sglang's), as bytes. (A function, not a fixture, so that
    hypothesis does not print them with each failing example.)"""
    tmp = Path(tempfile.mkdtemp(prefix="pg-real-"))
    base = tmp / "baseline.json"
    store.save(base, sglang.import_file(H100))
    rep = _report(tmp / "report.json", 22.0, seed=1)
    res_path = tmp / "results.json"
    report = json.loads(rep.read_text())
    from perfguard.results import CaseResult

    case = CaseResult(case_id="qwen_image_t2i_smoke", repeats=3)
    case.samples = {"e2e": [5.0, 5.1, 5.2], "stage:DenoisingStage": [3.0, 3.1, 3.0]}
    write_results(
        res_path, Results(environment=report["environment"], settings={}, cases={"x": case})
    )
    log = write_log(tmp / "performance.log", [record("qwen_image_t2i", s) for s in (1, 1.01)])
    db = tmp / "h.sqlite"
    add_reports(db, [rep])
    files = {
        "baseline": base.read_bytes(),
        "sglang_h100": H100.read_bytes(),
        "sglang_npu": NPU.read_bytes(),
        "report": rep.read_bytes(),
        "results": res_path.read_bytes(),
        "log": log.read_bytes(),
        "cases": (Path(__file__).resolve().parents[1] / "cases" / "common.toml").read_bytes(),
        "db": db.read_bytes(),
    }
    shutil.rmtree(tmp)
    return files


JSON_READERS = {
    "baseline": (store.load, "b.json"),
    "report": (read_report, "r.json"),
    "results": (read_results, "res.json"),
}


@pytest.mark.parametrize("which", list(JSON_READERS))
@SETTINGS
@given(data=st.data())
def test_json_file_reader(tmp_path: Path, data: st.DataObject, which: str) -> None:
    """The baseline, report and results readers on mutations of a real file of theirs."""
    read, name = JSON_READERS[which]
    raw = data.draw(json_mutation(real_files()[which]))
    check_reader(read, tmp_path / name, raw, name)


@SETTINGS
@given(data=st.data(), which=st.sampled_from(["sglang_h100", "sglang_npu"]))
def test_sglang_baseline_reader(tmp_path: Path, data: st.DataObject, which: str) -> None:
    raw = data.draw(json_mutation(real_files()[which]))
    check_reader(sglang.import_file, tmp_path / "perf_baselines.json", raw, "perf_baselines.json")


@SETTINGS
@given(data=st.data())
def test_perf_log_reader(tmp_path: Path, data: st.DataObject) -> None:
    raw = data.draw(byte_mutation(real_files()["log"]))
    check_reader(sglang.read_perf_log, tmp_path / "performance.log", raw, "performance.log")


@SETTINGS
@given(data=st.data())
def test_case_registry_reader(tmp_path: Path, data: st.DataObject) -> None:
    raw = data.draw(byte_mutation(real_files()["cases"]))
    reg = tmp_path / "reg"
    shutil.rmtree(reg, ignore_errors=True)
    reg.mkdir()
    check_reader(lambda p: load_registry("cpu", p.parent), reg / "common.toml", raw, "reg")


@SETTINGS
@given(data=st.data())
def test_history_reader_and_writer(tmp_path: Path, data: st.DataObject) -> None:
    """Reading never changes the archive; a failed `add` leaves it byte-identical."""
    raw = data.draw(byte_mutation(real_files()["db"]))
    db = tmp_path / "h.sqlite"
    for extra in ("-journal", "-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    check_reader(history.load, db, raw, "h.sqlite")
    rep = tmp_path / "new.json"
    if not rep.exists():
        _report(rep, 30.0, seed=7)
    db.write_bytes(raw)
    try:
        add_reports(db, [rep])
    except PerfguardError as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc) and "h.sqlite" in str(exc)
        assert db.read_bytes() == raw
