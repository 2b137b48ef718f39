"""`perfguard bisect`: the first commit where a work counter grew, found in a real
repository of 16 commits (a copy of this project's package and registry), stepping over
a commit that cannot be imported; the inputs it refuses; nothing left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PG

from perfguard.measurement.bisect import next_index

ROOT = Path(__file__).resolve().parents[1]
K = 11  # the commit that switches the Qwen-Image modulation cache off (reference path)
BROKEN = 8  # the commit whose perfguard cannot be imported (the next one repairs it)


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def make_repo(dest: Path, commits: int = 16, k: int = K, broken: int = BROKEN) -> Path:
    """Commit 1 is this project's package and registry; commits 2..16 change a notes
    file, except `k` (a smoke case turns a reference optimization's toggle off) and
    `broken` (an import that fails in the runner, repaired by the next commit)."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "perfguard", dest / "perfguard", ignore=skip)
    (dest / "cases").mkdir()
    shutil.copy(ROOT / "cases" / "common.toml", dest / "cases" / "common.toml")
    git("init", "-q", "-b", "main", cwd=dest)
    git("config", "user.email", "bisect@example.com", cwd=dest)
    git("config", "user.name", "bisect test", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "commit 1: the good one", cwd=dest)
    runner = dest / "perfguard" / "measurement" / "runner.py"
    registry = dest / "cases" / "common.toml"
    for i in range(2, commits + 1):
        (dest / "NOTES").write_text(f"{i}\n", encoding="utf-8")
        subject = f"commit {i}: notes"
        if i == k:
            text = registry.read_text(encoding="utf-8")
            toggled = text.replace(
                'tags = ["smoke", "qwen"]',
                'tags = ["smoke", "qwen"]\ntoggles = { qwen_modulation_cache = false }',
            )
            assert toggled != text
            registry.write_text(toggled, encoding="utf-8")
            subject = f"commit {i}: modulation cache off"
        if i == broken:
            text = runner.read_text(encoding="utf-8")
            runner.write_text(
                text.replace("import torch\n", "import torch\nimport no_such_module\n", 1),
                encoding="utf-8",
            )
            subject = f"commit {i}: breaks import"
        if i == broken + 1:
            text = runner.read_text(encoding="utf-8")
            runner.write_text(text.replace("import no_such_module\n", ""), encoding="utf-8")
            subject = f"commit {i}: repairs import"
        git("add", "-A", cwd=dest)
        git("commit", "-q", "-m", subject, cwd=dest)
    return dest


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("bisect") / "repo")


def test_the_next_commit_tried_is_the_nearest_untried_to_the_middle() -> None:
    assert next_index(-1, 14, {14}) == 6
    assert next_index(-1, 14, {14, 6}) == 7
    assert next_index(-1, 14, {14, 6, 7}) == 5
    assert next_index(5, 7, {6}) is None


@pytest.mark.slow
def test_bisect_finds_the_commit_that_turned_an_optimization_off(
    repo: Path, tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target: commit K found on work counters, the broken commit skipped and
    named, at most 7 measured commits, under a minute; nothing left on disk but the
    report (no worktree registered, no temporary directory)."""
    monkeypatch.chdir(repo)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    out = tmp_path / "bisect.json"
    code, stdout, stderr = pg(
        "bisect", "HEAD~15", "HEAD", "--case", "qwen_image_t2i_smoke", "--json", str(out)
    )
    assert code == 0, stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    first = report["first_bad"]
    assert first["subject"] == f"commit {K}: modulation cache off"
    assert first["commit"] == git("rev-parse", f"HEAD~{16 - K}", cwd=repo)
    assert [s["subject"] for s in report["skipped"]] == [f"commit {BROKEN}: breaks import"]
    assert "no_such_module" in report["skipped"][0]["reason"]
    assert report["measured"] <= 7
    assert report["seconds"] < 60
    grown = first["details"]["op_changes"]["qwen_image_t2i_smoke"]["DenoisingStage"]
    assert "aten::silu" in grown
    assert f"first bad commit: {first['commit']} commit {K}" in stdout
    assert f"skipped {report['skipped'][0]['commit'][:12]} commit {BROKEN}" in stdout
    assert "bisect [2] BAD" in stderr  # each step printed as it goes
    assert git("worktree", "list", "--porcelain", cwd=repo).count("worktree ") == 1
    # torch's own compile cache may appear in TMPDIR; no perfguard worktree or scratch does
    assert [p.name for p in scratch.iterdir() if p.name.startswith("perfguard")] == []
    assert git("status", "--porcelain", cwd=repo) == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope", "HEAD"), "GOOD nope: no such commit"),
        (("HEAD~15", "nope"), "BAD nope: no such commit"),
        (("HEAD", "HEAD~15"), "is not an ancestor of BAD"),
        (("HEAD", "HEAD"), "the same commit"),
    ],
)
def test_bad_revisions_exit_2_before_anything_is_measured(
    repo: Path, pg: PG, monkeypatch: pytest.MonkeyPatch, args: tuple[str, str], message: str
) -> None:
    monkeypatch.chdir(repo)
    code, _, stderr = pg("bisect", *args, "--case", "qwen_image_t2i_smoke")
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1


def test_a_dirty_tree_named_as_bad_is_refused(
    repo: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    notes = repo / "NOTES"
    before = notes.read_text(encoding="utf-8")
    notes.write_text("uncommitted\n", encoding="utf-8")
    try:
        code, _, stderr = pg("bisect", "HEAD~15", "HEAD", "--case", "qwen_image_t2i_smoke")
    finally:
        notes.write_text(before, encoding="utf-8")
    assert code == 2 and "uncommitted changes" in stderr
    assert notes.read_text(encoding="utf-8") == before


@pytest.mark.slow
def test_a_metric_no_case_has_and_an_unchanged_range_exit_2(
    repo: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    code, _, stderr = pg(
        "bisect", "HEAD~15", "HEAD", "--case", "qwen_image_t2i_smoke", "--metric", "ops:NoStage"
    )
    assert code == 2 and "--metric ops:NoStage: no selected case counts it" in stderr
    # commits 1..6 change no count: BAD is not worse than GOOD, nothing to find
    code, _, stderr = pg("bisect", "HEAD~15", "HEAD~10", "--case", "qwen_image_t2i_smoke")
    assert code == 2 and "is not worse than GOOD" in stderr
