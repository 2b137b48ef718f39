"""The GitHub workflows: actionlint-clean, in step with .ci/run, using real perfguard flags.

actionlint (with shellcheck on every `run:` script) comes from the dev extra; CI must have
it, so there its absence fails instead of skipping.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from perfguard.cli import cli

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
CONFIG = ROOT / ".github" / "actionlint.yaml"
MARKER = "<!-- perfguard-report -->"


def tool(name: str) -> str:
    """The dev extra's binary: next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' installs it")
    pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")


def actionlint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    cmd = [tool("actionlint"), "-no-color", "-config-file", str(CONFIG)]
    cmd += ["-shellcheck", tool("shellcheck"), *map(str, files)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def load(name: str) -> dict[Any, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def run_scripts(workflow: dict[Any, Any]) -> list[str]:
    return [s["run"] for job in workflow["jobs"].values() for s in job["steps"] if "run" in s]


def commands(script: str) -> list[list[str]]:
    """The shell commands of a script, continuation lines joined, expressions blanked."""
    text = re.sub(r"\$\{\{.*?\}\}", "EXPR", script).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


# ---- actionlint ----------------------------------------------------------------------------


def test_the_workflows_pass_actionlint_and_shellcheck() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "perf.yml", "refresh-baselines.yml"}
    result = actionlint(*files)
    assert result.returncode == 0, result.stdout + result.stderr


BREAKAGES = {
    "an undefined matrix property": (
        '--shard "$SHARD/$SHARDS"',
        '--shard "${{ matrix.shards }}/$SHARDS"',
        'property "shards" is not defined',
    ),
    "a job that needs a job that does not exist": (
        "needs: check",
        "needs: chek",
        'needs job "chek" which does not exist',
    ),
    "a shell script with an unclosed if": (
        'if [ ! -f "report-$SHARD.json" ]; then exit "$code"; fi',
        'if [ ! -f "report-$SHARD.json" ]; then exit "$code"',
        "shellcheck reported issue",
    ),
    "a runner label nobody configured": (
        'runs-on: [self-hosted, "${{ matrix.runner }}"]',
        "runs-on: [self-hosted, h200-typo]",
        'label "h200-typo" is unknown',
    ),
}


@pytest.mark.parametrize("what", sorted(BREAKAGES))
def test_actionlint_fails_a_broken_workflow(what: str, tmp_path: Path) -> None:
    before, after, message = BREAKAGES[what]
    text = (WORKFLOWS / "perf.yml").read_text()
    assert text.count(before) == 1, f"perf.yml changed: update the {what!r} breakage"
    broken = tmp_path / ".github" / "workflows" / "perf.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(before, after))
    result = actionlint(broken, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stdout, result.stdout


# ---- ci.yml --------------------------------------------------------------------------------


def normalize(cmd: list[str]) -> list[str]:
    """A command without `--quiet`: how much pip prints is not what is installed."""
    return [t for t in cmd if t != "--quiet"]


def is_install_lint_or_test(cmd: list[str]) -> bool:
    if cmd[:4] == ["python", "-m", "pip", "install"]:
        return "--upgrade" not in cmd  # upgrading pip itself is not part of the recipe
    return cmd[:1] == ["ruff"] or cmd[:3] == ["python", "-m", "pytest"]


def test_ci_installs_and_tests_exactly_as_ci_run() -> None:
    """Each install, lint and test command of .ci/run is a command of ci.yml."""
    recipe = [c for c in commands((ROOT / ".ci" / "run").read_text()) if is_install_lint_or_test(c)]
    assert len(recipe) >= 4, recipe
    workflow = [normalize(c) for s in run_scripts(load("ci.yml")) for c in commands(s)]
    for cmd in recipe:
        assert normalize(cmd) in workflow, f"ci.yml lacks {shlex.join(cmd)!r} from .ci/run"


def test_ci_tests_python_3_10_to_3_12() -> None:
    job = load("ci.yml")["jobs"]["test"]
    assert job["strategy"]["matrix"]["python"] == ["3.10", "3.11", "3.12"]


def test_ci_runs_the_work_check_on_every_push_and_pull_request() -> None:
    """perfguard gated by perfguard: ci.yml's `work` job checks the smoke cases' work
    against the committed file, by path (not by this runner's CPU), with the libraries it
    was counted with (torch's CPU build), and its Markdown reaches the job summary."""
    ci = load("ci.yml")
    assert "pull_request" in ci["on"] and ci["on"]["push"]["branches"] == ["main"]
    job = ci["jobs"]["work"]
    assert "if" not in job and "needs" not in job
    cmds = [normalize(c) for s in run_scripts({"jobs": {"work": job}}) for c in commands(s)]
    (check,) = [c for c in cmds if c[:1] == ["perfguard"]]
    assert check[:2] == ["perfguard", "check-work"]
    assert check[check.index("--baseline") + 1] == "baselines/cpu/smoke-work.json"
    assert (ROOT / "baselines" / "cpu" / "smoke-work.json").is_file()
    assert "--markdown" in check  # perfguard appends it to $GITHUB_STEP_SUMMARY itself
    installs = [c for c in cmds if c[:4] == ["python", "-m", "pip", "install"]]
    torch = next(c for c in installs if "torch==2.13.0" in c)
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    constrained = ["python", "-m", "pip", "install", "-e", ".", "-c", ".ci/work-constraints.txt"]
    assert constrained in installs


# ---- perf.yml ------------------------------------------------------------------------------


def test_perf_runs_on_pull_requests_and_a_rigorous_nightly_without_a_profile() -> None:
    """The nightly differs from a PR by its gate (stored baselines, not the merge base)
    and by sampling more, not by a profile: on a measured baseline `long_term` and
    `pr_test` judge alike (tests/test_verdict.py)."""
    perf = load("perf.yml")
    assert "pull_request" in perf["on"] and perf["on"]["schedule"]
    scripts = "\n".join(run_scripts(perf))
    assert "perfguard check --rigorous --isolate" in scripts and "--profile" not in scripts
    assert "PROFILE" not in perf.get("env", {})


@pytest.mark.parametrize(
    ("codes", "overall"),
    [((0, 0), 0), ((4, 0), 4), ((4, 3), 3), ((3, 4), 3), ((4, 1, 3), 1), ((2, 4), 2), ((1, 2), 1)],
)
def test_perf_merges_shard_codes_in_perfguards_order(codes: tuple[int, ...], overall: int) -> None:
    """1 (slower) over 3 (a failure) over 4 (can't tell) over 0, as `judgement.overall`."""
    perf = load("perf.yml")
    (script,) = [s for s in run_scripts(perf) if "worse()" in s]
    start = script.index("status=0")
    functions = script[start : script.index("gate=", start)]
    calls = "".join(f"worse {c}\n" for c in codes)
    out = subprocess.run(
        ["bash", "-c", functions + calls + 'echo "$status"'], capture_output=True, text=True
    )
    assert out.stdout.strip() == str(overall), out.stderr


def test_perf_shards_runners_and_labels_agree() -> None:
    perf = load("perf.yml")
    matrix = perf["jobs"]["check"]["strategy"]["matrix"]
    assert matrix["shard"] == list(range(1, int(perf["env"]["SHARDS"]) + 1))
    assert perf["jobs"]["report"]["env"]["RUNNERS"].split() == matrix["runner"]
    platforms = {i["runner"]: i["platform"] for i in matrix["include"]}
    assert platforms == {"h100": "cuda", "mi300": "rocm", "ascend-a2": "npu"}
    labels = yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"]
    assert set(matrix["runner"]) <= set(labels)


def test_perf_checks_shards_merges_and_comments_once() -> None:
    perf = load("perf.yml")
    scripts = "\n".join(run_scripts(perf))
    assert '--shard "$SHARD/$SHARDS"' in scripts and '--report "report-$SHARD.json"' in scripts
    assert "perfguard merge" in scripts and "$GITHUB_STEP_SUMMARY" in scripts
    assert MARKER in scripts
    (comment,) = [
        s for s in perf["jobs"]["report"]["steps"] if "github-script" in s.get("uses", "")
    ]
    script = comment["with"]["script"]
    assert MARKER in script and "updateComment" in script and "createComment" in script
    assert perf["jobs"]["report"]["permissions"]["pull-requests"] == "write"
    assert perf["jobs"]["report"]["steps"][-1]["run"].strip().endswith('exit "$CODE"')


def test_every_perfguard_command_in_the_workflows_exists_with_those_flags() -> None:
    used = 0
    for name in ("ci.yml", "perf.yml", "refresh-baselines.yml"):
        for script in run_scripts(load(name)):
            for cmd in commands(script):
                if cmd[0] != "perfguard":
                    continue
                used += 1
                command: click.Command = cli
                words = iter(cmd[1:])
                for word in words:
                    if not isinstance(command, click.Group):
                        break
                    sub = command.get_command(click.Context(command), word)
                    assert sub is not None, f"{name}: no command {word!r} in {shlex.join(cmd)!r}"
                    command = sub
                known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
                for token in cmd:
                    flag = token.split("=", 1)[0]
                    if flag.startswith("--"):
                        assert flag in known, f"{name}: {shlex.join(cmd)!r}: unknown {flag}"
    assert used >= 8


def test_pull_requests_check_against_the_merge_base_and_the_nightly_keeps_history() -> None:
    """PRs: a relative check against the merge base (a worktree, so the full history is
    fetched); the schedule: the stored baselines, and its reports enter the archive."""
    perf = load("perf.yml")
    steps = perf["jobs"]["check"]["steps"]
    (checkout,) = [s for s in steps if s.get("uses", "").startswith("actions/checkout")]
    assert checkout["with"]["fetch-depth"] == 0
    script = next(s["run"] for s in steps if "perfguard compare" in s.get("run", ""))
    assert 'git merge-base HEAD "origin/$BASE_REF"' in script
    gates = re.findall(r"^\s*perfguard (compare|check) (.*)$", script, flags=re.M)
    assert [g[0] for g in gates] == ["compare", "check"]
    assert gates[0][1].startswith('--against "$base"') and "--rigorous" in gates[1][1]
    report = {s.get("name"): s for s in perf["jobs"]["report"]["steps"]}
    add = report["Add the nightly reports to the history"]
    assert add["if"] == "github.event_name == 'schedule'" and "perfguard history add" in add["run"]
    assert report["Save the history archive"]["with"]["path"] == "history.sqlite"


# ---- refresh-baselines.yml -----------------------------------------------------------------


def test_refresh_is_started_by_hand_for_a_label_perf_yml_knows_with_its_platform() -> None:
    refresh, perf = load("refresh-baselines.yml"), load("perf.yml")
    assert set(refresh["on"]) == {"workflow_dispatch"}
    inputs = refresh["on"]["workflow_dispatch"]["inputs"]
    check = perf["jobs"]["check"]["strategy"]["matrix"]
    assert inputs["runner"]["options"] == check["runner"]
    assert inputs["shards"]["type"] == "number"
    # The label -> platform map is an expression; it must say what perf.yml's matrix says.
    mapping = re.search(r"fromJSON\('(\{.*?\})'\)", refresh["env"]["PLATFORM"])
    assert mapping is not None
    platforms = {i["runner"]: i["platform"] for i in check["include"]}
    assert yaml.safe_load(mapping.group(1)) == platforms
    assert refresh["jobs"]["measure"]["runs-on"] == ["self-hosted", "${{ inputs.runner }}"]


def test_refresh_measures_shards_merges_them_and_opens_one_pull_request() -> None:
    refresh = load("refresh-baselines.yml")
    jobs = refresh["jobs"]
    assert jobs["measure"]["strategy"]["matrix"]["shard"] == (
        "${{ fromJSON(needs.plan.outputs.shards) }}"
    )
    measure = [c for s in run_scripts({"jobs": {"m": jobs["measure"]}}) for c in commands(s)]
    (gen,) = [c for c in measure if c[:2] == ["perfguard", "gen-baselines"]]
    assert "--shard" in gen and "--tighten" not in gen  # a refresh replaces figures
    merge = [c for s in run_scripts({"jobs": {"m": jobs["merge"]}}) for c in commands(s)]
    (joined,) = [c for c in merge if c[:3] == ["perfguard", "baselines", "merge"]]
    assert joined[joined.index("--prefer") + 1] == "newest"
    (diff,) = [c for c in merge if c[:3] == ["perfguard", "baselines", "diff"]]
    assert diff[diff.index("--format") + 1] == "md"
    (pr,) = [s for s in jobs["merge"]["steps"] if "create-pull-request" in s.get("uses", "")]
    assert pr["with"]["branch"] == "perfguard/refresh-baselines-${{ inputs.runner }}"
    assert pr["with"]["body-path"] == "body.md"
    assert jobs["merge"]["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert refresh["permissions"] == {"contents": "read"}


def test_the_nightly_publishes_the_history_site_to_pages_from_the_secret_archive_or_sqlite() -> (
    None
):
    perf = load("perf.yml")
    report = perf["jobs"]["report"]
    assert report["env"]["HISTORY_URL"] == "${{ secrets.PERFGUARD_HISTORY_URL }}"
    steps = {s.get("name"): s for s in report["steps"]}
    add = steps["Add the nightly reports to the history"]["run"]
    assert "db=${HISTORY_URL:-history.sqlite}" in add
    assert 'perfguard history publish --db "$db" --out site' in add
    for name in ("Restore the history archive", "Save the history archive"):
        assert steps[name]["if"] == "github.event_name == 'schedule' && env.HISTORY_URL == ''"
    upload = steps["Upload the history site"]
    assert upload["uses"].startswith("actions/upload-pages-artifact@")
    assert upload["with"]["path"] == "site"
    pages = perf["jobs"]["pages"]
    assert pages["needs"] == "report" and "schedule" in pages["if"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert pages["environment"]["name"] == "github-pages"
    (deploy,) = pages["steps"]
    assert deploy["uses"].startswith("actions/deploy-pages@")
    merged = "\n".join(run_scripts(perf))
    assert '--format html --out "merged-$runner.html"' in merged


def test_ci_keeps_the_browser_screenshots() -> None:
    job = load("ci.yml")["jobs"]["test"]
    (upload,) = [s for s in job["steps"] if s.get("name") == "Upload the browser screenshots"]
    assert upload["with"]["path"] == "test-artifacts/" and upload["if"] == "always()"
