"""One command per job (`check`, `compare`, `check-work`, `judge`), at most 15 options
each, the knobs in `[tool.perfguard]`, the presets, and the old spellings refused."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from perfguard.cli import config
from perfguard.cli.app import cli
from tests.fake_pipeline import CHECK, GEN
from tests.helpers import PG

GATES = ("check", "compare", "check-work", "judge", "run", "gen-baselines", "calibrate", "ab")


@pytest.mark.parametrize("name", GATES)
def test_every_measuring_command_shows_at_most_15_options(name: str) -> None:
    cmd = cli.commands[name]
    shown = [
        p for p in cmd.params if isinstance(p, click.Option) and not p.hidden and p.name != "help"
    ]
    assert len(shown) <= 15, [p.name for p in shown]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (("--against", "x"), "compare --against"),
        (("--against-ref", "HEAD"), "compare --against REF"),
        (("--counters-only",), "check-work"),
        (("--results", "r.json"), "judge --results FILE"),
        (("--sglang-perf-log", "p.log"), "judge --sglang-perf-log FILE"),
        (("--settle",), "compare --against REF"),
    ],
)
def test_an_old_spelling_of_check_exits_2_naming_the_new_command(
    pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: tuple[str, ...], new: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = pg("check", *old, "--report", "r.json")
    assert code == 2 and f"use `perfguard {new}" in err
    assert not (tmp_path / "r.json").exists() and out == ""


def test_knobs_are_hidden_from_help_and_read_from_the_pyproject_table(
    fake: Path, pg: PG, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.perfguard]\nwarmup = 0\nrepeats = 3\n\n[tool.perfguard.run]\nrepeats = 4\n"
    )
    code, out, _ = pg("check", "--help")
    assert code == 0 and "--repeats" not in out and "--rigorous / --fast" in out
    assert pg("run", "--out", "r.json")[0] == 0  # the command's own table wins
    assert {c["repeats"] for c in json.loads(Path("r.json").read_text())["cases"].values()} == {4}
    assert pg("run", "--out", "r.json", "--repeats", "2")[0] == 0  # the command line wins
    assert {c["repeats"] for c in json.loads(Path("r.json").read_text())["cases"].values()} == {2}


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("[tool.perfguard]\nrepeat = 3\n", "tool.perfguard.repeat: not a knob of any command"),
        ("[tool.perfguard]\nrepeats = 'x'\n", "tool.perfguard.repeats"),
        ("[tool.perfguard.chek]\nrepeats = 3\n", "tool.perfguard.chek: no such command"),
        ("[tool.perfguard.ab]\nmax-reruns = 3\n", "not a knob of `perfguard ab`"),
        ("[tool.perfguard\n", "not valid TOML"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file_and_key_and_exit_2(
    pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(table)
    code, _, err = pg("check", "--report", "r.json")
    assert code == 2 and says in err and str(tmp_path / "pyproject.toml") in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()


def test_the_table_is_found_above_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.perfguard]\nmax-reruns = 3\n")
    (tmp_path / "sub").mkdir()
    mapping = config.default_map(cli, tmp_path / "sub")
    assert mapping is not None and mapping["check"] == {"max_reruns": 3}
    assert "run" not in mapping  # `run` does not confirm


def test_rigorous_samples_more_with_the_same_rule(fake: Path, pg: PG) -> None:
    """--rigorous raises the sampling knobs the command line did not set, never the
    rule. (The fake pipelines keep their clock in this process: one process here.)"""
    pg(*GEN)
    code, _, _ = pg(*CHECK, "--processes", "1", "--rigorous", "--report", "r.json")
    settings = json.loads(Path("r.json").read_text())["settings"]
    assert code == 0 and settings["max_repeats"] == 40 and settings["processes"] == 1
    assert settings["max_reruns"] == 0  # given on the command line: kept
    assert pg(*CHECK, "--report", "f.json")[0] == 0
    fast = json.loads(Path("f.json").read_text())["settings"]
    assert fast["max_repeats"] != 40 and fast["alpha"] == settings["alpha"]


def test_attribution_traces_go_where_the_variable_says_else_beside_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfguard.api.common import Outputs

    monkeypatch.delenv("PERFGUARD_TRACES_DIR", raising=False)
    assert Outputs().traces_dir() is None  # no report, no variable: no traces
    assert Outputs(report=str(tmp_path / "r.json")).traces_dir() == str(tmp_path)
    monkeypatch.setenv("PERFGUARD_TRACES_DIR", str(tmp_path / "traces"))
    assert Outputs(report=str(tmp_path / "r.json")).traces_dir() == str(tmp_path / "traces")
