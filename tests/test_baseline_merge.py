"""`baselines merge` and `baselines diff`: dedupe, conflicts, comparability, provenance.

Baselines are made by the store itself (`record_case`) from fixed samples, then edited
as JSON where a test needs a field the store would not write (another platform, an
older timestamp). The last test measures real shard baselines on a virtual clock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock
import pytest
import torch

import perfguard.cli
import perfguard.device.platform
import perfguard.measurement.runner
from perfguard.decision import changes
from perfguard.decision.stats import Summary, summarize
from perfguard.device.platform import Platform
from perfguard.device.timer import stage, step
from perfguard.errors import EXIT_USAGE, PerfguardError
from perfguard.presentation.baseline_diff import render_baseline_diff_markdown
from perfguard.results import CaseResult
from perfguard.storage import baseline as store
from perfguard.storage import baseline_merge as bm
from perfguard.storage import refresh
from tests.helpers import measured

PG = Callable[..., tuple[int, str, str]]
ENV = {"platform": "cpu", "hardware": "test-cpu", "git_commit": "a" * 40, "hostname": "h"}


def ok(case_id: str, scale: float = 1.0) -> CaseResult:
    samples = {
        "e2e": [10.0 * scale, 10.4 * scale, 10.2 * scale],
        "stage:DenoisingStage": [8.0 * scale, 8.1 * scale, 8.2 * scale],
        "step:0": [2.0 * scale, 2.1 * scale, 2.05 * scale],
        "peak_memory": [300.0, 300.0, 300.0],
    }
    return measured(case_id, samples)


def make(path: Path, **cases: float) -> Path:
    """A baseline at `path` with one scenario per keyword (case id = figures' scale)."""
    for cid, scale in cases.items():
        refresh.record_case(path, ok(cid, scale), ENV)
    return path


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def stamp(case_id: str, when: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["scenarios"][case_id]["updated"] = when

    return change


def merged(*paths: Path, prefer: str | None = None) -> store.Baseline:
    return bm.merge([bm.read_input(p) for p in paths], prefer).baseline


# ---- dedupe --------------------------------------------------------------------------------


def test_merging_a_file_with_itself_gives_the_same_bytes_back(tmp_path: Path, pg: PG) -> None:
    a = make(tmp_path / "a.json", x=1.0, y=2.0)
    before = a.read_bytes()
    assert pg("baselines", "merge", str(a), str(a), "--out", str(tmp_path / "c.json"))[0] == 0
    assert (tmp_path / "c.json").read_bytes() == before
    assert pg("baselines", "merge", str(a), str(a), "--out", str(a))[0] == 0
    assert a.read_bytes() == before


def test_identical_scenarios_in_two_files_collapse_to_one(tmp_path: Path, pg: PG) -> None:
    a = make(tmp_path / "a.json", x=1.0, y=2.0)
    copy = tmp_path / "copy.json"
    copy.write_bytes(a.read_bytes())
    code, out, _ = pg("baselines", "merge", str(a), str(copy), "--out", str(tmp_path / "c.json"))
    assert code == 0 and "2 identical in several inputs, 0 conflict(s)" in out
    assert (tmp_path / "c.json").read_bytes() == a.read_bytes()


def test_disjoint_files_merge_and_each_scenario_names_its_file(tmp_path: Path) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    b = make(tmp_path / "b.json", y=2.0)
    m = merged(a, b)
    assert set(m.scenarios) == {"x", "y"}
    assert m.scenarios["x"].source == str(a) and m.scenarios["y"].source == str(b)
    assert m.scenarios["y"].metrics["e2e"].median == pytest.approx(20.4)
    # The provenance is in the file (an additive schema field), and survives a reload.
    out = tmp_path / "c.json"
    bm.merge_files([a, b], out)
    assert json.loads(out.read_text())["scenarios"]["x"]["source"] == str(a)
    assert store.load(out).scenarios["y"].source == str(b)


def test_a_regenerated_scenario_drops_its_merge_source(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    bm.merge_files([make(tmp_path / "a.json", x=1.0), make(tmp_path / "b.json", y=1.0)], out)
    refresh.record_case(out, ok("x", 1.5), ENV)
    after = store.load(out)
    assert after.scenarios["x"].source is None and after.scenarios["y"].source is not None


def test_file_metadata_is_the_latest_inputs_with_the_earliest_created(tmp_path: Path) -> None:
    def meta(created: str, updated: str, commit: str) -> Callable[[dict[str, Any]], None]:
        def change(data: dict[str, Any]) -> None:
            data["metadata"].update(created=created, updated=updated, git_commit=commit)

        return change

    jan, feb, mar, apr = (f"2026-0{m}-01T00:00:00+00:00" for m in (1, 2, 3, 4))
    a = edit(make(tmp_path / "a.json", x=1.0), meta(jan, mar, "aaa"))
    b = edit(make(tmp_path / "b.json", y=1.0), meta(feb, apr, "bbb"))
    m = merged(a, b)
    assert m.metadata["created"] == jan
    assert (m.metadata["updated"], m.metadata["git_commit"]) == (apr, "bbb")


# ---- conflicts -----------------------------------------------------------------------------


@pytest.fixture
def conflict(tmp_path: Path) -> tuple[Path, Path]:
    """`x` in both files with different figures; `a` measured later than `b`."""
    a = edit(make(tmp_path / "a.json", x=1.0, y=1.0), stamp("x", "2026-05-02T10:00:00+00:00"))
    b = edit(make(tmp_path / "b.json", x=1.3), stamp("x", "2026-05-01T10:00:00+00:00"))
    return a, b


def test_a_conflict_is_an_error_naming_both_files_the_case_and_the_metric(
    conflict: tuple[Path, Path], tmp_path: Path, pg: PG
) -> None:
    a, b = conflict
    out = tmp_path / "c.json"
    code, _, err = pg("baselines", "merge", str(a), str(b), "--out", str(out))
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1
    assert str(a) in err and str(b) in err and "'x'" in err and "first in e2e" in err
    assert "--prefer" in err and not out.exists()


def test_prefer_first_keeps_the_first_inputs_scenario(conflict: tuple[Path, Path]) -> None:
    a, b = conflict
    for order, want in (((a, b), 1.0), ((b, a), 1.3)):
        m = merged(*order, prefer="first")
        assert m.scenarios["x"].metrics["e2e"].median == pytest.approx(10.2 * want)
        assert m.scenarios["x"].source == str(order[0])


def test_prefer_newest_keeps_the_scenario_measured_last_in_any_order(
    conflict: tuple[Path, Path], pg: PG, tmp_path: Path
) -> None:
    a, b = conflict
    for order in ((a, b), (b, a)):
        m = merged(*order, prefer="newest")
        assert m.scenarios["x"].metrics["e2e"].median == pytest.approx(10.2)
        assert m.scenarios["x"].source == str(a)
    code, out, _ = pg(
        "baselines",
        "merge",
        str(b),
        str(a),
        "--out",
        str(tmp_path / "c.json"),
        "--prefer",
        "newest",
    )
    assert code == 0 and "1 conflict(s) resolved with --prefer newest" in out
    assert f"x: kept {a}, not {b} (first in e2e)" in out


def test_prefer_newest_refuses_a_tie_it_cannot_break(conflict: tuple[Path, Path]) -> None:
    a, b = conflict
    edit(b, stamp("x", "2026-05-02T10:00:00+00:00"))
    with pytest.raises(PerfguardError, match="both were updated at 2026-05-02T10:00:00"):
        merged(a, b, prefer="newest")


def test_a_dated_scenario_is_newer_than_an_undated_one_and_files_order_the_undated(
    tmp_path: Path,
) -> None:
    def undated(file_time: str) -> Callable[[dict[str, Any]], None]:
        def change(data: dict[str, Any]) -> None:
            del data["scenarios"]["x"]["updated"]
            data["metadata"]["updated"] = file_time

        return change

    dated = edit(make(tmp_path / "dated.json", x=1.0), stamp("x", "2026-01-01T00:00:00+00:00"))
    old = edit(make(tmp_path / "old.json", x=1.1), undated("2027-01-01T00:00:00+00:00"))
    new = edit(make(tmp_path / "new.json", x=1.2), undated("2030-01-01T00:00:00+00:00"))
    # An imported figure has no time of its own; its file's time is when any case was written.
    assert merged(old, dated, prefer="newest").scenarios["x"].source == str(dated)
    assert merged(old, new, prefer="newest").scenarios["x"].source == str(new)


def test_notes_of_every_input_are_kept_and_overrides_joined(tmp_path: Path) -> None:
    def human(notes: str, overrides: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        def change(data: dict[str, Any]) -> None:
            data["scenarios"]["x"].update(notes=notes, tolerance_overrides=overrides)

        return change

    a = edit(make(tmp_path / "a.json", x=1.0), human("decode is bursty", {"e2e": {"rel": 0.5}}))
    b = tmp_path / "b.json"
    b.write_bytes(a.read_bytes())
    edit(b, human("measured on the quiet pool", {"e2e": {"abs": 1.0}, "step:0": {"rel": 2.0}}))
    s = merged(a, b).scenarios["x"]
    assert s.notes == "decode is bursty\nmeasured on the quiet pool"
    assert s.tolerance_overrides == {"e2e": {"rel": 0.5, "abs": 1.0}, "step:0": {"rel": 2.0}}
    assert s.source is None  # same figures in every input: nothing to attribute
    assert merged(a, a).scenarios["x"].notes == "decode is bursty"
    edit(a, lambda d: d["scenarios"]["x"].update(notes="line one\n\nline one"))
    assert merged(a, a).scenarios["x"].notes == "line one\n\nline one"  # agreed: as written


def test_overrides_that_conflict_are_an_error(tmp_path: Path) -> None:
    a = edit(
        make(tmp_path / "a.json", x=1.0),
        lambda d: d["scenarios"]["x"].update(tolerance_overrides={"e2e": {"rel": 0.5}}),
    )
    b = make(tmp_path / "b.json", x=1.0)
    b.write_bytes(a.read_bytes())
    edit(b, lambda d: d["scenarios"]["x"].update(tolerance_overrides={"e2e": {"rel": 0.4}}))
    with pytest.raises(
        PerfguardError, match=r"scenarios\.x\.tolerance_overrides\.e2e\.rel is 0\.4"
    ):
        merged(a, b)


# ---- comparability -------------------------------------------------------------------------


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value

    return change


INCOMPARABLE = {
    "metadata.platform": _set("metadata", "platform", value="cuda"),
    "metadata.hardware": _set("metadata", "hardware", value="other-cpu"),
    "metadata.advisory": _set("metadata", "advisory", value=True),
    "tolerances.pr_test.rel.e2e": _set("tolerances", "pr_test", "rel", "e2e", value=0.1),
    "improvement_threshold": _set("improvement_threshold", value=0.3),
    "sampling.step_fractions": _set("sampling", value={"step_fractions": [0.5]}),
}


@pytest.mark.parametrize("field", sorted(INCOMPARABLE))
def test_inputs_that_disagree_on_a_comparability_field_exit_2_naming_it(
    field: str, tmp_path: Path, pg: PG
) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    b = edit(make(tmp_path / "b.json", y=1.0), INCOMPARABLE[field])
    out = tmp_path / "c.json"
    code, _, err = pg("baselines", "merge", str(a), str(b), "--out", str(out))
    assert code == EXIT_USAGE and f"{b}: {field}:" in err and str(a) in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_thread_policy_is_compared_only_where_both_files_record_it(tmp_path: Path) -> None:
    # The schema does not know `threads` yet: compare the raw files, as a reader of a
    # newer perfguard's files would see them.
    def threads(value: Any) -> Callable[[dict[str, Any]], None]:
        return _set("metadata", "threads", value=value)

    def inp(path: Path, data_change: Callable[[dict[str, Any]], None] | None) -> bm.MergeInput:
        item = bm.read_input(path)
        data = json.loads(json.dumps(item.data))
        if data_change:
            data_change(data)
        return bm.MergeInput(item.path, item.baseline, data)

    a, b = make(tmp_path / "a.json", x=1.0), make(tmp_path / "b.json", y=1.0)
    bm.check_comparable([inp(a, threads(1)), inp(b, None)])  # unknown on one side: no verdict
    bm.check_comparable([inp(a, threads(1)), inp(b, threads(1))])
    with pytest.raises(PerfguardError, match=r"metadata\.threads: 2 != 1"):
        bm.check_comparable([inp(a, threads(1)), inp(b, threads(2))])
    # Per scenario: one case measured with two thread counts, even under --prefer.
    b2 = make(tmp_path / "b2.json", x=1.3)
    case_threads = _set("scenarios", "x", "case", "threads", value=4)
    with pytest.raises(PerfguardError, match=r"scenarios\.x: threads 4 != 1"):
        one_thread = inp(a, _set("scenarios", "x", "case", "threads", value=1))
        bm.merge([one_thread, inp(b2, case_threads)], "newest")
    assert bm.merge([inp(a, None), inp(b2, case_threads)], "first").baseline.scenarios["x"]


def test_a_newer_schema_is_named_and_refused(tmp_path: Path, pg: PG) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    b = edit(make(tmp_path / "b.json", y=1.0), _set("schema_version", value=2))
    code, _, err = pg("baselines", "merge", str(a), str(b), "--out", str(tmp_path / "c.json"))
    assert code == EXIT_USAGE and "$.schema_version: 2 is newer than this perfguard reads" in err
    assert not (tmp_path / "c.json").exists()


NOT_A_BASELINE = {
    "a report": (
        '{"kind": "perfguard.report", "schema_version": 1}',
        "is not a perfguard baseline",
    ),
    "an sglang file": ('{"scenarios": {"x": {"expected_e2e_ms": 1.0}}}', "import-sglang"),
    "not JSON": ("{", "not.json"),
    "a list": ("[]", "expected a JSON object"),
}


@pytest.mark.parametrize("what", sorted(NOT_A_BASELINE))
def test_an_input_that_is_not_a_baseline_exits_2_and_writes_nothing(
    what: str, tmp_path: Path, pg: PG
) -> None:
    text, message = NOT_A_BASELINE[what]
    a = make(tmp_path / "a.json", x=1.0)
    before = a.read_bytes()
    bad = tmp_path / "not.json"
    bad.write_text(text)
    code, _, err = pg("baselines", "merge", str(a), str(bad), "--out", str(a))
    assert code == EXIT_USAGE and message in err and len(err.strip().splitlines()) == 1
    assert a.read_bytes() == before


def test_a_missing_input_and_a_foreign_out_file_are_refused(tmp_path: Path, pg: PG) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    code, _, err = pg("baselines", "merge", str(a), str(tmp_path / "nope.json"), "--out", "c.json")
    assert code == EXIT_USAGE and "nope.json: no such file" in err
    report = tmp_path / "report.json"
    report.write_text('{"kind": "perfguard.report"}')
    code, _, err = pg("baselines", "merge", str(a), "--out", str(report))
    assert code == EXIT_USAGE and "report.json" in err
    assert report.read_text() == '{"kind": "perfguard.report"}'
    gpu = edit(make(tmp_path / "gpu.json", z=1.0), _set("metadata", "platform", value="cuda"))
    before = gpu.read_bytes()
    code, _, err = pg("baselines", "merge", str(a), "--out", str(gpu))
    assert code == EXIT_USAGE and "refusing to replace it" in err and gpu.read_bytes() == before


# ---- --out equal to an input: atomic, under the lock -------------------------------------------


def test_out_may_be_an_input_and_a_failed_write_leaves_it_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    b = make(tmp_path / "b.json", y=1.0)
    before = a.read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(perfguard.storage.jsonio.os, "replace", crash)
    with pytest.raises(PerfguardError, match="disk full"):
        bm.merge_files([a, b], a)
    assert a.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
    monkeypatch.undo()
    bm.merge_files([a, b], a)
    assert set(store.load(a).scenarios) == {"x", "y"}


def test_merge_waits_for_the_lock_that_every_baseline_write_holds(tmp_path: Path) -> None:
    a = make(tmp_path / "a.json", x=1.0)
    b = make(tmp_path / "b.json", y=1.0)
    before = a.read_bytes()
    held = filelock.FileLock(str(store.lock_path(a)))
    held.acquire()
    try:
        worker = threading.Thread(target=bm.merge_files, args=([a, b], a))
        worker.start()
        time.sleep(0.3)
        assert a.read_bytes() == before  # still waiting: nothing written under our lock
    finally:
        held.release()
    worker.join(timeout=30)
    assert not worker.is_alive() and set(store.load(a).scenarios) == {"x", "y"}


# ---- diff: credibility -----------------------------------------------------------------------


def tight(median: float, n: int = 10, spread: float = 0.005) -> Summary:
    """n samples around `median` with a relative spread of about `spread`."""
    return summarize([median * (1 + spread * ((i % 5) - 2) / 2) for i in range(n)])


@pytest.mark.parametrize(
    ("old", "new", "change"),
    [
        (tight(10.0), tight(12.0), "slower"),  # +20 %, tight on both sides
        (tight(10.0), tight(8.0), "faster"),
        (tight(10.0), tight(10.1), "small"),  # credible, but 1 % < the 3 % minimum effect
        (tight(10.0, spread=0.4), tight(11.0, spread=0.4), "noise"),  # 10 % inside the noise
        (summarize([300.0] * 5), summarize([320.0] * 5), "slower"),  # exact repeats: no noise
    ],
)
def test_diff_says_whether_a_change_is_credible(old: Summary, new: Summary, change: str) -> None:
    low, high, got = changes.judge_change("stage:DenoisingStage", old, new)  # type: ignore[misc]
    assert got == change
    assert low <= new.median / old.median <= high


def test_a_change_between_single_figures_has_no_interval() -> None:
    # Imported sglang figures: one request each, no spread on either side.
    assert changes.judge_change("e2e", Summary(10.0, 1), Summary(12.0, 1)) == (
        None,
        None,
        "unknown",
    )


def test_the_diff_interval_widens_with_the_spread_between_processes() -> None:
    old = Summary(10.0, 10, iqr=0.05, samples=(10.0,) * 10, processes=(9.0, 11.0))
    new = Summary(12.0, 10, iqr=0.05, samples=(12.0,) * 10, processes=(11.0, 13.0))
    low, high, change = changes.judge_change("e2e", old, new)  # type: ignore[misc]
    assert change == "noise" and low < 1.0 < high


def test_diff_rows_and_counts_in_json_and_markdown(tmp_path: Path, pg: PG) -> None:
    a = make(tmp_path / "a.json", x=1.0, gone=1.0, **{"a|b</details>": 1.0})
    b = make(tmp_path / "b.json", x=1.5, new=1.0, **{"a|b</details>": 0.7})
    data = json.loads(pg("baselines", "diff", str(a), str(b), "--format", "json")[1])
    rows = {(r["case"], r["metric"]): r for r in data["changed"]}
    e2e = rows[("x", "e2e")]
    assert (e2e["change"], e2e["credible"]) == ("slower", True)
    assert e2e["ratio"] == pytest.approx(1.5) and e2e["ratio_low"] < 1.5 < e2e["ratio_high"]
    assert rows[("a|b</details>", "e2e")]["change"] == "faster"
    assert data["counts"]["slower"] == 3 and data["counts"]["faster"] == 3
    assert data["confidence"] == 0.99 and (data["added"], data["removed"]) == (["new"], ["gone"])
    assert json.loads(pg("baselines", "diff", str(a), str(b), "--json")[1]) == data

    code, md, _ = pg("baselines", "diff", str(a), str(b), "--format", "md")
    assert code == 0 and "**3 slower, 3 faster**" in md
    assert "#### Slower (3)" in md and "#### Faster (3)" in md
    assert "</details><" not in md.replace("</details>\n", "") and "a\\|b&lt;/details&gt;" in md
    assert "Scenarios added (1): new." in md and "Scenarios removed (1): gone." in md
    code, table, _ = pg("baselines", "diff", str(a), str(b))
    assert code == 0 and "slower" in table and "3 slower, 3 faster" in table


def test_diff_of_a_file_with_itself_says_nothing_moved(tmp_path: Path) -> None:
    a = store.load(make(tmp_path / "a.json", x=1.0))
    d = changes.diff(a, a)
    assert d.empty and "No scenario, figure or tolerance changed." in (
        render_baseline_diff_markdown(d, "a", "a")
    )


# ---- the shard round trip ----------------------------------------------------------------------

REGISTRY = "".join(
    f'[[case]]\nid = "{cid}"\nworkload = "qwen_image"\npreset = "tiny"\n\n'
    for cid in ("c1", "c2", "c3", "c4", "c5")
)


class VirtualCPU(Platform):
    """The CPU platform whose clock moves only as the fake pipelines say."""

    now_ns = 0

    def mark(self) -> int:
        return VirtualCPU.now_ns

    def host_ns(self) -> int:  # the reference workload on the same clock: no screening
        return VirtualCPU.now_ns

    def hardware_slug(self) -> str:
        return "test-cpu"


def virtual_pipeline(case: Any, platform: Platform) -> Callable[[], torch.Tensor]:
    ms = {"c1": 4.0, "c2": 6.0, "c3": 8.0, "c4": 10.0, "c5": 12.0}[case.id]

    def advance(x: float) -> None:
        VirtualCPU.now_ns += int(x * 1e6)

    def run() -> torch.Tensor:
        with stage("TextEncodingStage"):
            advance(1.0)
        with stage("DenoisingStage"):
            for i in range(2):
                with step(i):
                    advance(ms)
        return torch.zeros(2)

    return run


@pytest.fixture
def shard_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "cpu.toml").write_text(REGISTRY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setattr(perfguard.measurement.runner, "_default_factory", virtual_pipeline)
    monkeypatch.setattr(perfguard.measurement.runner.gc, "collect", lambda *a: 0)
    monkeypatch.setattr(perfguard.device.platform, "probe", lambda name=None: VirtualCPU())
    yield tmp_path


def test_merged_shard_baselines_cover_every_case_and_check_accepts_them(
    shard_registry: Path, pg: PG
) -> None:
    # one process: the virtual clock keeps time in this process only
    run = ("--repeats", "3", "--warmup", "0", "--processes", "1")
    for k in (1, 2):
        assert pg("gen-baselines", *run, "--shard", f"{k}/2", "--baseline", f"s{k}.json")[0] == 0
    parts = [set(store.load(f"s{k}.json").scenarios) for k in (1, 2)]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    code, out, _ = pg("baselines", "merge", "s1.json", "s2.json", "--out", "merged.json")
    assert code == 0 and "5 scenario(s) from 2 file(s)" in out
    check = ("check", *run, "--max-reruns", "0", "--baseline", "merged.json")
    code, _, _ = pg(*check, "--fail-on-missing", "--report", "r.json")
    report = json.loads(Path("r.json").read_text())
    assert code == 0 and sorted(report["cases"]) == ["c1", "c2", "c3", "c4", "c5"]
    assert {c["verdict"] for c in report["cases"].values()} == {"pass"}


def test_a_refresh_from_copies_of_the_old_file_takes_each_shards_fresh_figures(
    shard_registry: Path, pg: PG
) -> None:
    """The refresh workflow: each shard updates a copy of the committed file; merge --prefer
    newest keeps what each shard measured and the old file's notes."""
    # one process: the virtual clock keeps time in this process only
    run = ("--repeats", "3", "--warmup", "0", "--processes", "1")
    assert pg("gen-baselines", *run, "--baseline", "old.json")[0] == 0

    fresh = {cid: s.metrics["stage:DenoisingStage"].median for cid, s in
             store.load("old.json").scenarios.items()}  # fmt: skip

    def age(data: dict[str, Any]) -> None:
        for s in data["scenarios"].values():
            s.update(updated="2026-01-01T00:00:00+00:00", notes="kept")
            summary = s["stages"]["DenoisingStage"]  # older figures than a shard measures
            for key in ("median", "min", "max", "iqr", "mad"):
                summary[key] *= 2
            for key in ("samples", "processes"):
                if summary.get(key):
                    summary[key] = [2 * x for x in summary[key]]

    edit(Path("old.json"), age)
    for k in (1, 2):
        Path(f"s{k}.json").write_bytes(Path("old.json").read_bytes())
        assert pg("gen-baselines", *run, "--shard", f"{k}/2", "--baseline", f"s{k}.json")[0] == 0
    code, _, err = pg("baselines", "merge", "s1.json", "s2.json", "--out", "new.json")
    assert code == EXIT_USAGE and "--prefer" in err  # the old copies conflict with fresh ones
    assert pg("baselines", "merge", "s1.json", "s2.json", "--out", "new.json",
              "--prefer", "newest")[0] == 0  # fmt: skip
    new = store.load("new.json")
    assert all(s.updated != "2026-01-01T00:00:00+00:00" for s in new.scenarios.values())
    assert {s.notes for s in new.scenarios.values()} == {"kept"}
    assert {s.source for s in new.scenarios.values()} == {"s1.json", "s2.json"}
    assert {cid: s.metrics["stage:DenoisingStage"].median for cid, s in new.scenarios.items()} == (
        fresh
    )
