"""The range `perfguard bisect` walks: its first-parent commits, each checked out in a
temporary `git worktree` of its own (the user's tree and index are never touched; every
worktree is removed on every way out, Ctrl-C and SIGTERM included), with its own cases.

A commit's side imports its own perfguard and code (its import directory first on
`PYTHONPATH` and as its working directory, as the relative check's base does), and its
cases come from its own registry (`cases/` of that commit), so a regression made in a
case definition is found like one made in the code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perfguard.errors import PerfguardError
from perfguard.measurement.checkout import git, temporary_worktree
from perfguard.storage.cases import Case, Selection

GOOD, BAD, SKIPPED = "good", "bad", "skipped"
"""A measured commit's verdict: as GOOD, worse than GOOD, or not measurable."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]


def resolve(rev: str, repo: Path, what: str) -> str:
    """The commit `rev` names in `repo`; one line and exit 2 when there is none."""
    found = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo)
    if found.returncode != 0 or not found.stdout.strip():
        raise PerfguardError(f"bisect: {what} {rev}: no such commit in {repo}")
    return found.stdout.strip()


def commit_range(good: str, bad: str, repo: Path) -> list[Commit]:
    """The first-parent commits after GOOD up to BAD, oldest first (BAD last)."""
    if git(["merge-base", "--is-ancestor", good, bad], repo).returncode != 0:
        raise PerfguardError(
            f"bisect: GOOD {good[:12]} is not an ancestor of BAD {bad[:12]}: "
            "name the older revision first"
        )
    listed = git(["log", "--first-parent", "--reverse", "--format=%H %s", f"{good}..{bad}"], repo)
    commits = []
    for line in listed.stdout.splitlines():
        sha, _, subject = line.partition(" ")
        commits.append(Commit(sha, subject))
    if not commits:
        raise PerfguardError(f"bisect: GOOD and BAD are the same commit ({good[:12]})")
    return commits


def subject_of(sha: str, repo: Path) -> str:
    return git(["log", "-1", "--format=%s", sha], repo).stdout.strip()


def refuse_dirty(rev: str, sha: str, repo: Path) -> None:
    """A revision naming the checked-out commit of a tree with uncommitted changes:
    bisect measures commits, so those changes would be left out; say so (exit 2)."""
    head = git(["rev-parse", "HEAD"], repo).stdout.strip()
    if sha != head:
        return
    status = git(["status", "--porcelain", "--untracked-files=no"], repo).stdout.strip()
    if status:
        raise PerfguardError(
            f"bisect: {rev} is the checked-out commit of {repo}, whose working tree has "
            "uncommitted changes that bisect would not measure: commit or stash them "
            "yourself, or name a commit"
        )


@contextlib.contextmanager
def checked_out(sha: str, repo: Path) -> Iterator[Path]:
    """A temporary worktree of `sha` (always removed), its path."""
    with temporary_worktree(sha, repo) as path:
        yield path


def commit_cases(
    root: Path, platform: str, selection: Selection, cases_dir: str | None
) -> list[Case]:
    """The selected cases of the commit checked out at `root`, from its own registry."""
    from perfguard.storage.cases import load_registry

    where = root / (cases_dir or "cases")
    chosen = Selection(
        cases_dir=str(where), case_ids=selection.case_ids, match=selection.match,
        tags=selection.tags,
    )  # fmt: skip
    cases = chosen.of(load_registry(platform, str(where)))
    if not cases:
        raise PerfguardError(f"no case of {where} matches the selection")
    return cases
