"""What a new user reads first: the README's setup and its description of the output."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from perfguard.presentation import render
from perfguard.presentation.summary import summary_line
from tests.helpers import reasons_report as _report

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_setup_command_installs_the_cpu_wheel() -> None:
    """On the default package index `torch==2.13.0` on Linux is the CUDA build: the
    README's setup must say how to get the CPU wheel (its command stays the one CI's
    machines run, which take the CPU wheel from their wheel folder)."""
    setup = README[README.index("## Set up and test") :]
    block = re.search(r"```bash\n(.*?)```", setup, re.S)
    assert block is not None
    first = block.group(1).splitlines()[0]
    assert first.startswith("pip install torch==2.13.0 ")
    prose = " ".join(setup[block.end() : setup.index("##", block.end())].split())
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in prose


def test_the_readme_says_where_the_verdict_is_printed() -> None:
    """The verdict is the table's title, its first line: the README must not say that
    the output ends with it."""
    assert "ends with the verdict" not in README
    assert "titled by the verdict and its exit code (the first line)" in " ".join(README.split())
    out = io.StringIO()
    report = _report([201.0] * 5, [1.0] * 5)
    render.render_table(report, Console(file=out, width=200, no_color=True))
    assert out.getvalue().splitlines()[0].strip() == summary_line(report)


def test_every_perfguard_path_the_baselines_readme_cites_exists() -> None:
    text = (ROOT / "baselines" / "README.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"`(perfguard/[A-Za-z0-9_./-]+)`", text))
    assert cited, "the baselines README cites the schema it is checked against"
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert missing == []


def test_the_readme_gives_the_suites_measured_duration() -> None:
    """It said about 2 minutes when 3 m 19 s was measured: the line must give a test count
    and a measured time on 2 quiet cores."""
    import re

    line = next(
        x
        for x in README.splitlines()
        if x.startswith("python -m pytest -q -n 2 ") and "# the suite" in x
    )
    assert re.search(r"\d+ tests: [\d.]+ min on 2 quiet cores", line), line
    assert "about 2 minutes" not in line
