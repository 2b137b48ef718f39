"""Settle kept detection checks again under this checkout's rule: the same measurements.

`benchmarks/detection.py --keep DIR --json T.json` keeps each `check --settle` report.
A settled report holds both answers of every open case: the stored verdict and the
side-by-side one (`settled.cases` keeps the stored verdict that was replaced,
`settled.unresolved` the side-by-side verdict that was not used). This script reads both
back and asks `perfguard.decision.gate.settles` of the checkout it runs from which one
counts, then prints per run and level the checks that fail (exit 1) under this rule, the
checks whose exit code differs from the one the check returned, and the cases whose
verdict differs. Checks that ended contended or in error are left out.

It replays a rule about settling only: what was measured, and which cases were open,
stay as the check saw them.

    python benchmarks/resettle.py /tmp/det15/det15.json /tmp/det16/det16.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfguard.decision.gate import settles
from perfguard.decision.verdict import REGRESSION, CaseVerdict


def resettled(report: dict) -> dict[str, str]:
    """Each case's verdict when `report`'s open cases are settled again."""
    settled = report.get("settled") or {}
    replaced, unused = settled.get("cases") or {}, settled.get("unresolved") or {}
    out = {}
    for cid, case in report["cases"].items():
        if cid in replaced:
            stored, relative = (
                CaseVerdict.from_json(cid, replaced[cid]),
                CaseVerdict.from_json(cid, case),
            )
        elif cid in unused:
            stored, relative = (
                CaseVerdict.from_json(cid, case),
                CaseVerdict.from_json(cid, unused[cid]),
            )
        else:
            out[cid] = case["verdict"]
            continue
        out[cid] = relative.verdict if settles(stored, relative) else stored.verdict
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="detection.py --json files whose reports were kept")
    args = ap.parse_args()
    for run in args.runs:
        counts: dict[int, list[int]] = {}
        for i, trial in enumerate(json.loads(Path(run).read_text())["trials"]):
            if not trial.get("report") or trial["exit"] not in (0, 1):
                continue
            report = json.loads(Path(trial["report"]).read_text())
            now = resettled(report)
            code = 1 if REGRESSION in now.values() else 0
            n = counts.setdefault(trial["pct"], [0, 0, 0])
            n[0], n[1], n[2] = n[0] + 1, n[1] + code, n[2] + (code != trial["exit"])
            if code != trial["exit"]:
                print(f"{run} check {i} (+{trial['pct']} %): exit {trial['exit']} -> {code}")
            for cid, verdict in now.items():
                if verdict != report["cases"][cid]["verdict"]:
                    was = report["cases"][cid]["verdict"]
                    print(f"{run} check {i} (+{trial['pct']} %): {cid} {was} -> {verdict}")
        for pct, (checks, failed, changed) in sorted(counts.items()):
            print(f"{run}: +{pct} %: exit 1 in {failed}/{checks}, {changed} exit code(s) changed")


if __name__ == "__main__":
    main()
