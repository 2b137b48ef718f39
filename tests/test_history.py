"""History: the SQLite archive, change points at the right commit, spikes ignored, plots."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from perfguard.cli import cli
from perfguard.errors import PerfguardError
from perfguard.presentation.changepoints import detect
from perfguard.presentation.history import changes, load
from perfguard.storage.archive import add_reports
from tests.helpers import history_report


def _noisy(n: int, seed: int, level: float = 100.0, noise: float = 0.02) -> np.ndarray:
    return level * (1 + noise * np.random.default_rng(seed).standard_normal(n))


def test_a_known_step_is_found_at_its_commit() -> None:
    series = _noisy(30, seed=1)
    series[18:] *= 1.12
    found = detect(series)
    assert [c.index for c in found] == [18]
    assert found[0].direction == "slower" and found[0].ratio == pytest.approx(1.12, rel=0.03)


def test_a_single_spike_is_not_a_change_point() -> None:
    series = _noisy(30, seed=2)
    series[11] *= 1.9
    assert detect(series) == []


def test_a_flat_noisy_series_has_no_change_points() -> None:
    for seed in range(10):
        assert detect(_noisy(40, seed=100 + seed, noise=0.03)) == []


def test_an_improvement_is_reported_as_faster() -> None:
    series = _noisy(24, seed=3)
    series[8:] *= 0.8
    (change,) = detect(series)
    assert change.index == 8 and change.direction == "faster"


def test_short_series_have_no_change_points() -> None:
    assert detect([1.0, 2.0, 3.0]) == []


def test_pelt_over_cumulative_sums_decides_as_ruptures_pelt() -> None:
    """`pelt_l2` must return what ruptures' PELT returns (it replaces it for speed)."""
    rpt = pytest.importorskip("ruptures")
    from perfguard.presentation.changepoints import pelt_l2

    for seed in range(300):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(6, 90))
        x = rng.standard_normal(n)
        if seed % 3 == 0:
            x[n // 2 :] += 3.0
        if seed % 5 == 0:
            x = np.round(x)  # ties between candidates
        size, pen = int(rng.integers(1, 5)), float(rng.uniform(0.3, 25))
        if n < 2 * size:
            continue
        want = rpt.Pelt(model="l2", min_size=size, jump=1).fit(x.reshape(-1, 1)).predict(pen=pen)
        assert pelt_l2(x, pen, size) == want, (seed, n, size, pen)


def test_archive_finds_the_commit_where_denoising_slowed(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    levels = [20.0] * 12 + [23.0] * 10
    for i, level in enumerate(levels):
        rep = history_report(tmp_path / f"r{i}.json", level, seed=i)
        add_reports(db, [rep], commit=f"c{i:03d}", date=f"2026-11-{i + 1:02d}")
    frame = load(db, case="qwen_image_t2i_smoke", metric="stage:DenoisingStage")
    assert list(frame["commit_sha"]) == [f"c{i:03d}" for i in range(len(levels))]
    found = changes(frame)
    assert len(found) == 1
    change = found[0]
    assert change["commit"] == "c012" and change["case"] == "qwen_image_t2i_smoke"
    assert change["metric"] == "stage:DenoisingStage"
    assert change["ratio"] == pytest.approx(1.15, rel=0.02) and change["direction"] == "slower"
    assert {"case", "metric", "commit", "before", "after", "ratio"} <= set(change)
    # decoding never changed: no change point there
    assert not changes(load(db, metric="stage:DecodingStage"))


def test_the_same_report_is_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    rep = history_report(tmp_path / "r.json", 20.0, seed=0)
    assert add_reports(db, [rep]) == (1, 0)
    assert add_reports(db, [rep, rep]) == (0, 2)
    assert len(load(db, metric="e2e")) == 1


@pytest.mark.parametrize(
    "content", ["", "{", "[]", '{"kind": "perfguard.report"}', json.dumps({"cases": 1})]
)
def test_a_malformed_report_is_refused_and_nothing_is_written(tmp_path: Path, content: str) -> None:
    db = tmp_path / "h.sqlite"
    good = history_report(tmp_path / "good.json", 20.0, seed=0)
    add_reports(db, [good])
    before = db.read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    other = history_report(tmp_path / "other.json", 21.0, seed=1)
    with pytest.raises(PerfguardError, match=r"bad\.json"):
        add_reports(db, [other, bad])
    assert db.read_bytes() == before
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reports").fetchone() == (1,)


def test_history_cli_end_to_end_with_real_smoke_reports(  # type: ignore[no-untyped-def]
    tmp_path: Path, monkeypatch, no_contention_wait: None
) -> None:
    """Reports of the real smoke suite go in; show, changes and both plots come out (the
    checks' own outcomes are not asserted: a contended one is measured again at once)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFGUARD_CASES", str(Path(__file__).resolve().parent.parent / "cases"))
    runner = CliRunner()

    def pg(*args: str) -> tuple[int, str]:
        res = runner.invoke(cli, list(args), standalone_mode=False, catch_exceptions=False)
        return (res.return_value or 0), res.output

    common = ("--platform", "cpu", "--case", "qwen_image_t2i_smoke", "--repeats", "2")
    assert pg("gen-baselines", *common, "--baseline", "b.json", "--processes", "1")[0] == 0
    for i in range(2):
        pg("check", *common, "--baseline", "b.json", "--report", f"real{i}.json")
    synthetic = [
        history_report(tmp_path / f"s{i}.json", 20.0 if i < 8 else 26.0, seed=i) for i in range(14)
    ]
    for i, path in enumerate(synthetic):
        assert (
            pg(
                "history",
                "add",
                str(path),
                "--db",
                "h.sqlite",
                "--commit",
                f"s{i:02d}",
                "--date",
                f"2026-10-{i + 1:02d}",
            )[0]
            == 0
        )
    code, out = pg("history", "add", "real0.json", "real1.json", "--db", "h.sqlite")
    assert code == 0 and "2 report(s) added" in out
    code, out = pg(
        "history", "show", "--db", "h.sqlite", "--metric", "stage:DecodingStage", "--json"
    )
    rows = json.loads(out)
    assert len(rows) == 16 and {"commit_sha", "median", "verdict"} <= set(rows[0])
    code, out = pg(
        "history",
        "changes",
        "--db",
        "h.sqlite",
        "--metric",
        "stage:DenoisingStage",
        "--since",
        "2026-10-01",
        "--json",
    )
    found = json.loads(out)
    assert any(c["commit"] == "s08" and c["direction"] == "slower" for c in found)
    code, out = pg("history", "show", "--db", "h.sqlite", "--csv")
    assert code == 0 and out.splitlines()[0].startswith("date,commit_sha")
    pytest.importorskip("matplotlib")
    assert (
        pg(
            "history",
            "plot",
            "--db",
            "h.sqlite",
            "--case",
            "qwen_image_t2i_smoke",
            "--metric",
            "stage:DenoisingStage",
            "--hardware",
            "test-cpu",
            "--out",
            "trend.png",
        )[0]
        == 0
    )
    assert pg("report", "plot", "real0.json", "--out", "stages.png")[0] == 0
    for png in ("trend.png", "stages.png"):
        data = Path(png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_show_on_a_missing_database_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(PerfguardError, match="no such history database"):
        load(tmp_path / "none.sqlite")


@pytest.mark.parametrize("kind", ["foreign_sqlite", "not_sqlite"])
def test_show_on_another_file_is_a_usage_error_that_leaves_it_alone(
    tmp_path: Path, kind: str
) -> None:
    db = tmp_path / "other.sqlite"
    if kind == "foreign_sqlite":
        with closing(sqlite3.connect(db)) as conn, conn:
            conn.execute("CREATE TABLE notes (text TEXT)")
    else:
        db.write_text("not a database\n" * 100)
    before = db.read_bytes()
    with pytest.raises(PerfguardError, match="not a perfguard history database"):
        load(db)
    assert db.read_bytes() == before


def test_the_trend_plot_draws_and_labels_the_baseline_and_never_repeats_a_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: an unlabelled line at the series' level, no baseline, the same commit twice."""
    pytest.importorskip("matplotlib")
    import perfguard.presentation.plots as plots

    db = tmp_path / "h.sqlite"
    for i in range(3):  # the second and third reports measured the same commit
        rep = history_report(tmp_path / f"r{i}.json", 20.0, seed=i)
        add_reports(db, [rep], commit="abcdef123" if i else "0123456789", date=f"2026-01-0{i + 1}")
    seen: dict[str, list[str]] = {}

    def keep(plt, fig, out):  # type: ignore[no-untyped-def]
        (ax,) = fig.axes
        seen["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        seen["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
        plt.close(fig)
        return Path(out)

    monkeypatch.setattr(plots, "_save", keep)
    series = load(db, case="qwen_image_t2i_smoke", metric="DenoisingStage")
    plots.plot_trend(series, [], case="c", metric="stage:DenoisingStage", out=tmp_path / "t.png")
    assert {"baseline", "baseline band", "median", "level between change points"} <= set(
        seen["legend"]
    )
    assert seen["ticks"] == ["0123456", "abcdef1", "abcdef1 #2"]


def test_bad_date_is_a_usage_error(tmp_path: Path) -> None:
    rep = history_report(tmp_path / "r.json", 20.0, seed=0)
    res = CliRunner().invoke(
        cli,
        ["history", "add", str(rep), "--db", str(tmp_path / "h.sqlite"), "--date", "soon"],
        standalone_mode=False,
    )
    assert isinstance(res.exception, PerfguardError) and "--date" in str(res.exception)
    assert not (tmp_path / "h.sqlite").exists()
