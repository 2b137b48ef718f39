"""Debian's headless chromium driven by Playwright, for the HTML pages' tests.

Playwright's own browser download is never used: the browser is `/usr/bin/chromium`
(Debian's package; .ci/run installs it when missing), started with the flags a closed
network needs. Each page load records its console errors, uncaught exceptions, every
request whose URL is not `file://` or `data:`, and dialogs (a hostile string that ran
would open one).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(os.environ.get("PERFGUARD_ARTIFACTS", "test-artifacts"))
"""Where the screenshots go (CI uploads this folder)."""


def chromium_path() -> str | None:
    """Debian's /usr/bin/chromium; elsewhere (a CI image) the Chromium or Chrome on PATH."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Visit:
    """What happened while a page loaded and was used."""

    page: Any
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


@contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    assert path, "chromium is not installed"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def visit(
    b: Any, url: str, *, width: int = 1280, height: int = 900, root: Path | None = None
) -> Visit:
    """Open `url` in a fresh page, recording errors, outside requests and dialogs.

    Outside: every request whose URL is not `file://`, `data:`, `blob:` or `about:`, and
    with `root`, every `file://` request for a path not under `root` (the page's folder:
    a page that reads `../../etc/passwd` or a sibling's files is caught too).
    """
    page = b.new_page(viewport={"width": width, "height": height})
    v = Visit(page=page)
    page.on(
        "console",
        lambda m: v.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: v.errors.append(f"pageerror: {e}"))
    inside = None if root is None else Path(root).resolve()

    def on_request(req: Any) -> None:
        if not req.url.startswith(("file://", "data:", "blob:", "about:")):
            v.outside.append(req.url)
        elif inside is not None and req.url.startswith("file://"):
            from urllib.parse import unquote, urlsplit

            path = Path(unquote(urlsplit(req.url).path)).resolve()
            if not path.is_relative_to(inside):
                v.outside.append(req.url)

    page.on("request", on_request)

    def on_dialog(d: Any) -> None:
        v.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.goto(url, wait_until="load")
    return v


def screenshot(v: Visit, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / name
    v.page.screenshot(path=str(out), full_page=False)
    return out
