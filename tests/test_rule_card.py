"""The rule card is one text: the decision package's docstring, copied word for word into
docs/verdicts.md, and every constant it names exists under that name."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import perfguard.decision as decision

ROOT = Path(__file__).resolve().parent.parent
MODULES = (
    "answer", "comparison", "contention", "estimate", "gate", "options", "paired", "resolution",
    "stats", "tolerances", "verdict",
)  # fmt: skip


def card() -> str:
    doc = decision.__doc__ or ""
    return doc[doc.index("The stored check") : doc.index("`--rigorous` measures more")].rstrip()


def test_docs_verdicts_holds_the_docstrings_card_word_for_word() -> None:
    text = (ROOT / "docs" / "verdicts.md").read_text(encoding="utf-8")
    block = text.split("```text\n", 1)[1].split("```", 1)[0].rstrip()
    assert block == card()


def test_every_constant_the_card_names_exists() -> None:
    names = set(re.findall(r"\b[A-Z][A-Z_]{3,}[A-Z]\b", card()))
    assert {"SAME_ALPHA", "SAME_PROCESSES", "SAME_PRECISION", "SESSION_SD"} <= names
    known: set[str] = set()
    for name in MODULES:
        module = importlib.import_module(f"perfguard.decision.{name}")
        known |= set(vars(module))
    from perfguard.measurement import relative  # the relative check's time budget

    known |= set(vars(relative))
    assert sorted(names - known) == []
