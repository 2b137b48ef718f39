"""No crash is ever a verdict, no input is ever half-read, no write is ever half-done.

Each test runs the command a user would and checks three things: the exit code (never 1
for anything but a regression), one line on stderr naming the file and field, and every
input file byte-identical afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import perfguard.storage.archive
from perfguard.cli import main
from perfguard.errors import EXIT_INTERNAL, EXIT_TERMINATED, EXIT_USAGE
from tests.helpers import H100, PG
from tests.helpers import history_report as _report  # a real report made by the library

FAST_PIPES = """
import torch
from perfguard.device.timer import stage, step


def _work():
    return sum(range(200))


def pipeline(case, platform):
    def run():
        for name in ("InputValidationStage", "TextEncodingStage"):
            with stage(name):
                _work()
        with stage("DenoisingStage"):
            for i in range(case.steps):
                with step(i):
                    _work()
        with stage("DecodingStage"):
            _work()
        return torch.zeros(2)

    return run
"""


def one_error_line(err: str, *needles: str) -> str:
    """The single `perfguard: error: ...` line of `err`, which names every needle."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perfguard: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(*paths: Path) -> dict[Path, bytes | None]:
    return {p: p.read_bytes() if p.exists() else None for p in paths}


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def baseline_file(tmp_path: Path, pg: PG) -> Path:
    """A real perfguard baseline: sglang's h100 excerpt imported."""
    dst = tmp_path / "baseline.json"
    code, _, err = pg("baselines", "import-sglang", str(H100), "--out", str(dst))
    assert code == 0, err
    return dst


@pytest.fixture
def fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with eight cases and a fast fake pipeline (`--factory`)."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "common.toml").write_text(
        "".join(
            f'[[case]]\nid = "c{i}"\nworkload = "qwen_image"\npreset = "tiny"\nsteps = 2\n\n'
            for i in range(8)
        )
    )
    (tmp_path / "pg_fast_pipes.py").write_text(FAST_PIPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return tmp_path


GEN = ("gen-baselines", "--platform", "cpu", "--repeats", "2", "--warmup", "0")
FACTORY = ("--factory", "pg_fast_pipes:pipeline")


# ---- 1. one exit path ------------------------------------------------------------------------


def test_a_baseline_nested_100000_deep_is_exit_2_not_a_recursion_error(
    tmp_path: Path, pg: PG
) -> None:
    """Was: RecursionError traceback and exit 1, which CI reads as a regression."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    before = snapshot(deep)
    for args in (
        ("baselines", "show", str(deep)),
        ("report", "render", str(deep)),
        ("judge", "--baseline", str(deep), "--results", str(deep)),
    ):
        code, _, err = pg(*args)
        assert code == EXIT_USAGE, (args, err)
        one_error_line(err, str(deep), "nested deeper than 32 levels")
    assert snapshot(deep) == before


@pytest.mark.parametrize("error", [ZeroDivisionError("division by zero"), MemoryError()])
def test_an_unexpected_exception_is_exit_70_with_one_line_and_a_traceback_file(
    tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """Any exception that is not a PerfguardError: a bug, or a library raising something
    unexpected. Never 0, 1, 2 or 3."""
    import perfguard.storage.baseline

    def broken(path: object) -> None:
        raise error

    monkeypatch.setattr(perfguard.storage.baseline, "load", broken)
    monkeypatch.setenv("PERFGUARD_TRACEBACK_DIR", str(tmp_path / "tb"))
    code, _, err = pg("baselines", "show", str(tmp_path / "b.json"))
    assert code == EXIT_INTERNAL == 70
    (line,) = err.strip().splitlines()
    assert line.startswith("perfguard: internal error (exit 70, not a verdict): ")
    assert type(error).__name__ in line and "Traceback" not in err
    (saved,) = (tmp_path / "tb").iterdir()
    assert str(saved) in line
    text = saved.read_text()
    assert "Traceback (most recent call last)" in text and "in broken" in text

    code, _, err = pg("--debug", "baselines", "show", str(tmp_path / "b.json"))
    assert code == 70
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.strip().splitlines()[-1].startswith("perfguard: internal error")


def test_an_unwritable_traceback_dir_still_ends_in_exit_70(
    tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perfguard.storage.baseline

    monkeypatch.setattr(perfguard.storage.baseline, "load", lambda p: 1 / 0)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PERFGUARD_TRACEBACK_DIR", str(tmp_path / "file" / "sub"))
    code, _, err = pg("baselines", "show", "b.json")
    assert code == 70 and "traceback not saved" in err and len(err.strip().splitlines()) == 1


def test_sigterm_during_a_write_is_exit_143_and_leaves_the_old_file_whole(
    baseline_file: Path, tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler raises, so the atomic write removes its temporary file and the file
    being replaced is untouched; the previous SIGTERM handler is back afterwards."""
    before = snapshot(baseline_file)
    real_fsync = os.fsync

    def terminated_mid_write(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", terminated_mid_write)
    handler = signal.getsignal(signal.SIGTERM)
    code, _, err = pg("baselines", "import-sglang", str(H100), "--out", str(baseline_file))
    assert code == EXIT_TERMINATED == 143, err
    assert "terminated" in err
    assert snapshot(baseline_file) == before
    assert listing(tmp_path) == ["baseline.json"]  # no lock file left beside it
    assert signal.getsignal(signal.SIGTERM) is handler


def test_ctrl_c_during_a_write_is_exit_130_and_leaves_the_old_file_whole(
    baseline_file: Path, tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(baseline_file)

    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    code, _, err = pg("baselines", "import-sglang", str(H100), "--out", str(baseline_file))
    assert code == 130 and "interrupted" in err
    assert snapshot(baseline_file) == before
    assert listing(tmp_path) == ["baseline.json"]  # no lock file left beside it


def test_the_exit_code_table_is_in_help_and_the_readme() -> None:
    from perfguard.errors import EXIT_CODES_HELP

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|")[1].strip() for r in table.splitlines() if r.startswith("| ")]
    assert rows[1:] == ["0", "1", "2", "3", "4", "70", "130", "143"]
    for code in rows[1:]:
        assert f" {code} " in f" {EXIT_CODES_HELP} "


def test_help_shows_the_exit_codes(pg: PG) -> None:
    code, out, _ = pg("--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "70 internal error" in flat and "143 terminated" in flat and "--debug" in flat


# ---- 2. strict readers ---------------------------------------------------------------------


def _mutated_baseline(src: Path, dst: Path, edit: Any) -> Path:
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return dst


def _first(data: dict[str, Any]) -> dict[str, Any]:
    scen = data["scenarios"][sorted(data["scenarios"])[0]]
    return scen["stages"]["DenoisingStage"]  # type: ignore[no-any-return]


FIELD = r"$.scenarios.flux_image_t2i.stages.DenoisingStage.median"


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("number as string", lambda d: _first(d).update(median="12.5"), "'12.5' is not of type"),
        ("boolean", lambda d: _first(d).update(median=True), "True is not of type 'number'"),
        ("negative time", lambda d: _first(d).update(median=-1.0), "-1.0 is less than"),
        ("zero time", lambda d: _first(d).update(median=0.0), "a time of 0 ms is not a"),
    ],
)
def test_semantic_defects_are_one_line_naming_file_and_field(
    baseline_file: Path, tmp_path: Path, pg: PG, name: str, edit: Any, message: str
) -> None:
    bad = _mutated_baseline(baseline_file, tmp_path / "bad.json", edit)
    first = sorted(json.loads(bad.read_text())["scenarios"])[0]
    code, _, err = pg("baselines", "show", str(bad))
    assert code == 2
    one_error_line(err, str(bad), f"$.scenarios.{first}.stages.DenoisingStage", message)


def test_a_key_written_twice_is_an_error_naming_the_key_and_file(
    baseline_file: Path, tmp_path: Path, pg: PG
) -> None:
    """Was: the last one won; an appended `"scenarios": {}` turned every case into
    missing-baseline, which passes without --fail-on-missing."""
    text = baseline_file.read_text().rstrip()
    assert text.endswith("}")
    merged = tmp_path / "merged.json"
    merged.write_text(text[:-1] + ', "scenarios": {}}\n')
    before = snapshot(merged)
    code, _, err = pg("baselines", "show", str(merged))
    assert code == 2
    one_error_line(err, str(merged), '$.scenarios: duplicate key "scenarios"')
    assert snapshot(merged) == before


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty file"),
        (b"  \n", "empty file"),
        (b'\xef\xbb\xbf{"kind": "perfguard.baseline"}', "byte-order mark"),
        (b'{"kind": "perfguard.baseline", "x": "\xff"}', "byte 37: not UTF-8 (b'\\xff')"),
        (b'{"a": "\\ud800"}', "$.a: holds a lone UTF-16 surrogate"),
        (b'{"a": NaN}', "$.a: NaN is not a valid number here"),
        (b'{"a": [Infinity]}', "$.a[0]: Infinity is not a valid number here"),
        (b'{"a": 1e400}', "$.a: 1e400 is not a finite number"),
        (b'{"a": ' + b"9" * 5000 + b"}", "is a number of 5000 characters (limit 40)"),
        (b'{"a": {"a": 1, "a": 2}}', '$.a.a: duplicate key "a"'),
        (b'{"a": 1}{"b": 2}', "malformed JSON at line 1 column 9"),
        (b"[" * 40 + b"]" * 40, "nested deeper than 32 levels"),
    ],
)
def test_every_json_reader_refuses_bad_bytes_with_one_line(
    tmp_path: Path, pg: PG, raw: bytes, message: str
) -> None:
    """The same refusal through each command that reads JSON (baseline, report, sglang
    baseline); the input is never changed and nothing is written."""
    bad = tmp_path / "in.json"
    bad.write_bytes(raw)
    out = tmp_path / "out.json"
    for args in (
        ("baselines", "show", str(bad)),
        ("report", "render", str(bad)),
        ("baselines", "import-sglang", str(bad), "--out", str(out)),
        ("merge", str(bad), "--out", str(out)),
    ):
        code, _, err = pg(*args)
        assert code == 2, (args, err)
        one_error_line(err, str(bad), message)
    assert bad.read_bytes() == raw and not out.exists()


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perfguard.storage.jsonio

    monkeypatch.setattr(perfguard.storage.jsonio, "MAX_BYTES", 1024)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"a": ["x" * 100] * 20}))
    code, _, err = pg("baselines", "show", str(big))
    assert code == 2
    one_error_line(err, str(big), "bytes is over the 0 MiB limit")


def test_a_perf_log_refuses_bad_bytes_and_hostile_stage_names(tmp_path: Path) -> None:
    from perfguard.errors import PerfguardError
    from perfguard.interop.sglang import read_perf_log

    good = {
        "stages": [{"name": "DenoisingStage", "execution_time_ms": 5.0}],
        "total_duration_ms": 6,
    }
    cases = [
        (b"\xef\xbb\xbf" + json.dumps(good).encode(), "byte-order mark"),
        (json.dumps(good).encode() + b"\n\xfe\n", "not UTF-8"),
        (json.dumps(good).encode() + b'\n{"a": 1, "a": 2}\n', 'log:2: $.a: duplicate key "a"'),
        (
            json.dumps({**good, "stages": [{"name": "[bold]x", "execution_time_ms": 1}]}).encode(),
            "stages[0].name: '[bold]x' is not a stage name",
        ),
        (
            json.dumps({**good, "total_duration_ms": "6"}).encode(),
            "total_duration_ms: expected a non-negative number, found '6'",
        ),
        (
            json.dumps({**good, "total_duration_ms": True}).encode(),
            "total_duration_ms: expected a non-negative number, found True",
        ),
        (b"\n\n", "no records"),
    ]
    for raw, message in cases:
        log = tmp_path / "performance.log"
        log.write_bytes(raw)
        with pytest.raises(PerfguardError) as info:
            read_perf_log(log)
        assert message in str(info.value) and "\n" not in str(info.value), (raw, info.value)
        assert info.value.exit_code == 2 and str(log) in str(info.value)
        assert log.read_bytes() == raw


# ---- history -------------------------------------------------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """An archive whose denoising stage steps up 30 % at the 11th report."""
    db = tmp_path / "h.sqlite"
    levels = [20.0] * 10 + [26.0] * 10
    reports = [_report(tmp_path / f"r{i}.json", lv, seed=i) for i, lv in enumerate(levels)]
    for i, rep in enumerate(reports):
        code = perfguard.storage.archive.add_reports(
            db, [rep], commit=f"c{i:02d}", date=f"2026-01-{i + 1:02d}"
        )
        assert code == (1, 0)
    return db


def test_history_changes_with_a_bare_stage_name_finds_the_step(archive: Path, pg: PG) -> None:
    """Was: `--metric DenoisingStage` printed [] on an archive with a clear +30 % step."""
    full = pg(
        "history", "changes", "--db", str(archive), "--metric", "stage:DenoisingStage", "--json"
    )
    bare = pg("history", "changes", "--db", str(archive), "--metric", "DenoisingStage", "--json")
    assert full[0] == bare[0] == 0
    found = json.loads(bare[1])
    assert found == json.loads(full[1])
    assert [(c["metric"], c["commit"], c["direction"]) for c in found] == [
        ("stage:DenoisingStage", "c10", "slower")
    ]
    code, out, _ = pg(
        "history", "show", "--db", str(archive), "--metric", "DenoisingStage", "--json"
    )
    assert code == 0 and {r["metric"] for r in json.loads(out)} == {"stage:DenoisingStage"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--metric", "DenoisngStage"),
            "no rows match --metric 'DenoisngStage'; metrics stored: e2e",
        ),
        (("--case", "nope"), "no rows match --case 'nope'; cases stored: qwen_image_t2i_smoke"),
        (("--since", "2027-01-01"), "no rows match --since '2027-01-01T00:00:00'"),
    ],
)
@pytest.mark.parametrize("command", ["show", "changes"])
def test_a_history_filter_that_matches_nothing_says_so(
    archive: Path, pg: PG, command: str, args: tuple[str, ...], message: str
) -> None:
    code, out, err = pg("history", command, "--db", str(archive), *args, "--json")
    assert code == 2 and out == ""
    one_error_line(err, str(archive), message)


def _not_a_history(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("hello, not a database\n"), "not an SQLite database"),
        (_not_a_history, "not a perfguard history database (its tables: notes)"),
        (
            lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x10\x00" + b"\xab" * 4000),
            "not a usable perfguard history database",
        ),
    ],
)
def test_history_add_to_a_file_that_is_not_an_archive_is_exit_2_and_leaves_it(
    tmp_path: Path, pg: PG, make: Any, message: str
) -> None:
    """Was: a traceback (sqlite3.DatabaseError) with exit 1, or perfguard's tables added
    to someone else's database."""
    db = tmp_path / "other.sqlite"
    make(db)
    before = snapshot(db)
    rep = _report(tmp_path / "r.json", 20.0, seed=0)
    code, _, err = pg("history", "add", str(rep), "--db", str(db))
    assert code == 2
    one_error_line(err, str(db), message, "left unchanged")
    assert snapshot(db) == before
    assert listing(tmp_path) == ["other.sqlite", "r.json"]


def test_history_add_to_a_locked_archive_is_exit_2_and_leaves_it(
    archive: Path, pg: PG, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(perfguard.storage.archive, "LOCK_TIMEOUT_S", 0.05)
    rep = _report(tmp_path / "new.json", 30.0, seed=99)
    with closing(sqlite3.connect(archive, isolation_level=None)) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        before = snapshot(archive)
        code, _, err = pg("history", "add", str(rep), "--db", str(archive))
        assert code == 2
        one_error_line(err, str(archive), "locked by another process (waited 0.05 s)")
        assert snapshot(archive) == before
        holder.execute("ROLLBACK")
    assert pg("history", "add", str(rep), "--db", str(archive))[0] == 0


# ---- 3. registries ---------------------------------------------------------------------------


def _registry(tmp_path: Path) -> Path:
    reg = tmp_path / "reg"
    shutil.copytree(Path(__file__).resolve().parents[1] / "cases", reg)
    return reg


MINE = '[[case]]\nid = "mine"\nworkload = "qwen_image"\npreset = "tiny"\n'


def test_a_registry_file_with_another_name_and_no_platforms_is_an_error(
    tmp_path: Path, pg: PG
) -> None:
    """Was: cases/my_team.toml was ignored in silence; its cases never ran."""
    reg = _registry(tmp_path)
    (reg / "my_team.toml").write_text(MINE)
    code, _, err = pg("list-cases", "--platform", "cpu", "--cases", str(reg))
    assert code == 2
    one_error_line(err, "my_team.toml: platforms: missing")


def test_a_registry_file_that_declares_its_platforms_is_read_and_listed(
    tmp_path: Path, pg: PG
) -> None:
    reg = _registry(tmp_path)
    (reg / "my_team.toml").write_text('platforms = ["cpu"]\n' + MINE)
    (reg / "gpu_team.toml").write_text(
        'platforms = ["cuda", "rocm"]\n' + MINE.replace("mine", "gpu")
    )
    code, out, err = pg("list-cases", "--platform", "cpu", "--cases", str(reg), "--case", "mine")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "│ mine " in out and "my_team.toml" in out
    read = flat.split("read: ", 1)[1].split(" for other platforms: ")
    assert [Path(p).name for p in read[0].split(", ")] == [
        "common.toml",
        "cpu.toml",
        "my_team.toml",
    ]
    assert [Path(p).name for p in read[1].split(", ")] == [
        "cuda.toml",
        "gpu_team.toml",
        "npu.toml",
        "rocm.toml",
    ]


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("cpu.toml", b'platforms = ["cpu"]\n' + MINE.encode(), "cpu.toml: platforms: not allowed"),
        ("x.toml", b'platforms = ["gpu"]\n' + MINE.encode(), "x.toml: platforms: ['gpu'] is not"),
        ("x.toml", b"platforms = []\n" + MINE.encode(), "x.toml: platforms: [] is not"),
        ("cpu.toml", b"", "cpu.toml: no [[case]] table"),
        ("cpu.toml", b"# nothing yet\n", "cpu.toml: no [[case]] table"),
        ("cpu.toml", b"\xef\xbb\xbf" + MINE.encode(), "cpu.toml: starts with a byte-order mark"),
        ("cpu.toml", MINE.encode().replace(b"tiny", b"t\xe9ny"), "cpu.toml: byte 56: not UTF-8"),
        ("cpu.toml", (MINE + 'preset = "small"\n').encode(), "cpu.toml: malformed TOML"),
        ("cpu.toml", (MINE + "guidance_scale = nan\n").encode(), "guidance_scale: nan is not a"),
        ("cpu.toml", (MINE + "steps = " + "9" * 5000 + "\n").encode(), "malformed TOML: Exceeds"),
        ("cpu.toml", b"x = " + b"[" * 50_000 + b"]" * 50_000, "malformed TOML: nested too deep"),
        ("cpu.toml", (MINE + "steps = 1979-05-27\n").encode(), "steps: datetime.date(1979"),
        ("cpu.toml", MINE.replace('"tiny"', "1").encode(), "preset: 1 is not one of"),
        ("cpu.toml", (MINE + 'steps = "4"\n').encode(), "steps: '4' is not of type 'integer'"),
        ("cpu.toml", (MINE + "steps = true\n").encode(), "steps: True is not of type 'integer'"),
    ],
)
def test_bad_registry_files_are_one_line_naming_the_file(
    tmp_path: Path, pg: PG, name: str, raw: bytes, message: str
) -> None:
    reg = _registry(tmp_path)
    (reg / name).write_bytes(raw)
    code, _, err = pg("list-cases", "--platform", "cpu", "--cases", str(reg))
    assert code == 2, err
    one_error_line(err, message)
    assert (reg / name).read_bytes() == raw


def test_registry_platforms_are_the_platform_names() -> None:
    from perfguard.storage.cases import PLATFORM_NAMES, REGISTRY_PLATFORMS

    assert REGISTRY_PLATFORMS == PLATFORM_NAMES


# ---- 4. writes survive faults ----------------------------------------------------------------


def _fail(call: str, err: int) -> Any:
    real = getattr(os, call)

    def failing(*args: Any, **kwargs: Any) -> Any:
        # Only the temporary files of atomic writes fail: pytest's own files stay writable.
        name = str(args[0]) if args and isinstance(args[0], (str, os.PathLike)) else ""
        if call in ("fsync", "replace") or name.endswith(".tmp"):
            raise OSError(err, os.strerror(err))
        return real(*args, **kwargs)

    return failing


FAULTS = [
    ("fsync", errno.ENOSPC, "No space left on device"),
    ("open", errno.EACCES, "Permission denied"),
    ("open", errno.EROFS, "Read-only file system"),
    ("replace", errno.EXDEV, "Invalid cross-device link"),
]


@pytest.mark.parametrize(("call", "err", "message"), FAULTS)
def test_a_baseline_write_that_fails_leaves_the_old_file_byte_identical(
    baseline_file: Path,
    tmp_path: Path,
    pg: PG,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    err: int,
    message: str,
) -> None:
    before = snapshot(baseline_file)
    monkeypatch.setattr(os, call, _fail(call, err))
    code, _, stderr = pg("baselines", "import-sglang", str(H100), "--out", str(baseline_file))
    monkeypatch.undo()
    assert code == 2
    one_error_line(stderr, f"{baseline_file}: cannot write: {message}")
    assert snapshot(baseline_file) == before
    assert listing(tmp_path) == ["baseline.json"]  # no lock file left beside it


@pytest.mark.parametrize(("call", "err", "message"), FAULTS)
def test_a_report_write_that_fails_leaves_the_old_report_and_markdown_byte_identical(
    tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch, call: str, err: int, message: str
) -> None:
    shard = _report(tmp_path / "shard.json", 20.0, seed=1)
    out, md = tmp_path / "out" / "merged.json", tmp_path / "out" / "merged.md"
    assert pg("merge", str(shard), "--out", str(out), "--markdown", str(md))[0] == 0
    out.write_text(out.read_text() + " ")  # distinguishable from what merge would write
    before = snapshot(out, md, shard)
    monkeypatch.setattr(os, call, _fail(call, err))
    code, _, stderr = pg("merge", str(shard), "--out", str(out), "--markdown", str(md))
    monkeypatch.undo()
    assert code == 2
    one_error_line(stderr, f"{out}: cannot write: {message}")
    assert snapshot(out, md, shard) == before
    assert listing(out.parent) == ["merged.json", "merged.md"]


def test_a_lock_file_that_cannot_be_created_is_exit_2_naming_the_path(
    fast: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    import filelock

    def read_only(self: Any, *a: Any, **k: Any) -> None:
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    code, _, err = pg(*GEN, *FACTORY, "--case", "c0", "--baseline", "ro/b.json")
    assert code == 2
    one_error_line(err, "ro/b.json: cannot write: Read-only file system")
    assert not Path("ro/b.json").exists()


def _gen_one(i: int, path: str) -> None:
    try:
        main([*GEN, *FACTORY, "--case", f"c{i}", "--baseline", path, "--no-progress"])
    except SystemExit as exc:
        os._exit(int(exc.code or 0))
    os._exit(99)


def test_eight_concurrent_gen_baselines_writers_lose_no_case(fast: Path) -> None:
    """Each writer re-reads the file under its lock before adding its case."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    path = str(fast / "baselines" / "shared.json")
    procs = [ctx.Process(target=_gen_one, args=(i, path)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    saved = json.loads(Path(path).read_text())
    assert sorted(saved["scenarios"]) == [f"c{i}" for i in range(8)]
    assert listing(Path(path).parent) == ["shared.json"]  # the lock lives elsewhere


def _write_forever(path: str) -> None:
    from perfguard.storage.jsonio import write_json_atomic

    i = 0
    while True:
        write_json_atomic(path, {"version": i, "samples": list(range(i % 5000))})
        i += 1


def _killed_at(path: str, call: str, nth: int) -> None:
    """Write twice; SIGKILL this process at the `nth` call of `os.<call>`."""
    from perfguard.storage.jsonio import write_json_atomic

    real = getattr(os, call)
    seen = [0]

    def kill_here(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(os, call, kill_here)
    write_json_atomic(path, {"version": 1, "samples": list(range(1000))})
    write_json_atomic(path, {"version": 2, "samples": list(range(2000))})
    os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_sigkill_at_any_point_of_a_write_leaves_valid_json(tmp_path: Path) -> None:
    """Killed at each system call of two writes in turn, then at random moments of a
    writer that never stops: the file is always absent (before the first write) or one
    of the versions written, whole."""
    import multiprocessing
    import random

    from perfguard.storage.jsonio import read_json

    ctx = multiprocessing.get_context("fork")
    points = [(c, n) for c in ("open", "fsync", "replace") for n in (1, 2)] + [("chmod", 1)]
    for call, nth in points:
        path = tmp_path / f"{call}{nth}.json"
        proc = ctx.Process(target=_killed_at, args=(str(path), call, nth))
        proc.start()
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL, (call, nth, proc.exitcode)
        # Killed in the first write: no file; in the second: the first, whole. (The
        # first write calls no chmod: there is no old file whose mode to keep.)
        first_write = nth == 1 and call != "chmod"
        if first_write:
            assert not path.exists(), (call, nth)
        else:
            assert read_json(path)["version"] == 1, (call, nth)

    path = tmp_path / "busy.json"
    rng = random.Random(0)
    versions = []
    for _ in range(12):
        proc = ctx.Process(target=_write_forever, args=(str(path),))
        proc.start()
        proc.join(rng.uniform(0.05, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        if path.exists():
            data = read_json(path)
            assert data["samples"] == list(range(data["version"] % 5000))
            versions.append(data["version"])
    assert versions, "the writer never finished a write"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".busy")]
    assert all(name.endswith(".tmp") for name in leftovers)  # never a half-written target


# ---- 7. hostile content stays inert -----------------------------------------------------------


HOSTILE = "[bold red]x[/] </details> @team #1 `y` *z* | $\\alpha$ ../../../etc/passwd"


def _hostile_report(tmp_path: Path) -> Path:
    rep = _report(tmp_path / "plain.json", 30.0, seed=3)
    data = json.loads(rep.read_text())
    case = data["cases"].pop("qwen_image_t2i_smoke")
    case["notes"] = HOSTILE
    data["cases"][HOSTILE] = case
    data["environment"]["hardware"] = HOSTILE  # a commit is hex digits (the schema)
    out = tmp_path / "hostile.json"
    out.write_text(json.dumps(data))
    return out


def test_hostile_case_ids_and_commits_are_literal_in_markdown_tables_and_plots(
    tmp_path: Path, pg: PG
) -> None:
    pytest.importorskip("matplotlib")
    rep = _hostile_report(tmp_path)
    code, md, err = pg("report", "render", str(rep), "--format", "md")
    assert code == 0, err
    assert "</details> @team" not in md and "&lt;/details&gt; &#64;team &#35;1" in md
    assert "\\[bold red\\]x\\[/\\]" in md and "\\`y\\`" in md and "\\*z\\*" in md
    code, table, err = pg("report", "render", str(rep), "--format", "table")
    assert code == 0, err
    assert "[bold red]x[/]" in table  # printed as written, not as red bold text
    png = tmp_path / "plots" / "stages.png"
    code, _, err = pg("report", "plot", str(rep), "--out", str(png))
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG")
    assert listing(tmp_path / "plots") == ["stages.png"]  # the id made no path
    assert not (tmp_path / "etc").exists()


def test_hostile_commits_in_the_archive_print_literally(tmp_path: Path, pg: PG) -> None:
    db = tmp_path / "h.sqlite"
    for i in range(8):
        rep = _report(tmp_path / f"r{i}.json", 20.0 if i < 4 else 30.0, seed=i)
        assert (
            pg(
                "history",
                "add",
                str(rep),
                "--db",
                str(db),
                "--commit",
                f"[red]c{i}",
                "--date",
                f"2026-01-0{i + 1}",
            )[0]
            == 0
        )
    code, out, _ = pg("history", "show", "--db", str(db), "--metric", "DenoisingStage")
    assert code == 0 and "[red]c0" in out
    code, out, _ = pg("history", "changes", "--db", str(db), "--metric", "DenoisingStage")
    assert code == 0 and "[red]c4" in out


def test_plot_labels_escape_mathtext() -> None:
    from perfguard.presentation.plots import literal

    assert literal("a $x$ b") == r"a \$x\$ b"


def test_rich_markup_in_a_registry_path_prints_literally(
    tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = tmp_path / "[bold]reg"
    reg.mkdir()
    (reg / "cpu.toml").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    code, out, err = pg("list-cases", "--platform", "cpu", "--cases", str(reg))
    assert code == 0, err
    assert "read: [bold]reg/cpu.toml" in out and "│ [bold]reg/cpu.toml" in out


@pytest.fixture(autouse=True)
def _restore_sigterm() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


# ---- the workflow reads exit codes as documented ------------------------------------------


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash")
@pytest.mark.parametrize(
    ("code", "title"),
    [
        (0, None),
        (1, "performance regression"),
        (2, "perfguard configuration or data error (exit 2)"),
        (3, "perfguard infrastructure failure (exit 3)"),
        (4, "perfguard can't tell (exit 4)"),
        (70, "perfguard infrastructure failure (exit 70)"),
        (130, "perfguard infrastructure failure (exit 130)"),
        (143, "perfguard infrastructure failure (exit 143)"),
    ],
)
def test_perf_workflow_calls_only_exit_1_a_regression(code: int, title: str | None) -> None:
    """The report job's last step, run as GitHub would run it, for each exit code."""
    import subprocess

    import yaml

    workflow = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "perf.yml"
    step = yaml.safe_load(workflow.read_text())["jobs"]["report"]["steps"][-1]
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        env={"CODE": str(code), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == code
    # 4 (can't tell) is a warning: no verdict, not a broken runner or a regression
    kind = "::warning" if code == 4 else "::error"
    lines = done.stdout.splitlines()
    annotations = [line for line in lines if line.startswith(("::error", "::warning"))]
    if title is None:
        assert annotations == []
    else:
        (line,) = annotations
        assert line.startswith(f"{kind} title={title}::")
        assert ("not a regression" in line) == (code != 1)
