"""Every relative link in the repository's Markdown leads somewhere: the file exists, and
an anchor (`file.md#section`) names one of that file's headings, as GitHub spells them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "node_modules", "test-artifacts"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not SKIP.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:, file:
            continue
        name, _, anchor = target.partition("#")
        dest = (path.parent / name).resolve() if name else path
        if not dest.exists():
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_the_slug_is_githubs() -> None:
    assert slug("Settling open cases (`check --settle`)") == "settling-open-cases-check---settle"
    assert slug("The runner's speed: what it can and cannot excuse") == (
        "the-runners-speed-what-it-can-and-cannot-excuse"
    )


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Here\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here) [gone](c.md) [moved](b.md#there)\n", encoding="utf-8")
    assert broken_links(page) == ["a.md: c.md (no such file)", "a.md: b.md#there (no such heading)"]


def test_every_relative_link_in_the_docs_resolves() -> None:
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "verdicts.md" in files
    assert [bad for path in files for bad in broken_links(path)] == []
