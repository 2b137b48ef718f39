"""The history of reports, read back as pandas frames: series, the latest report, change points.

The archive itself (SQLite or PostgreSQL, its schema and its transactions) is
`perfguard.storage.archive`; this module is what the history commands and the published
site read from it. A series is (platform, hardware, case, metric): reports from different
hardware are never mixed into one line, nor into one change-point search.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from perfguard.storage.archive_query import FRAME_COLUMNS, Filter, read_rows

__all__ = [
    "SERIES",
    "changes",
    "latest_report",
    "load",
    "metric_names",
    "short_series",
]

SERIES = ["platform", "hardware", "case", "metric"]
"""What identifies a series: the same case and metric on other hardware is another line."""


def load(
    db: str | Path,
    *,
    case: str | None = None,
    metric: str | None = None,
    since: str | None = None,
) -> pd.DataFrame:
    """One row per report, case and metric (`FRAME_COLUMNS`), oldest first (by date, then
    insertion). A filter that matches nothing is an error naming what the archive holds."""
    flt = Filter(
        case=case,
        metrics=tuple(metric_names(metric)) if metric else None,
        since=since,
        metric_asked=metric,
    )
    return pd.DataFrame.from_records(read_rows(db, flt), columns=list(FRAME_COLUMNS))


def latest_report(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest report of each (platform, hardware): what `history show`
    prints when no series is asked for (every row of every report is `--all`)."""
    if frame.empty:
        return frame
    keys = frame[["platform", "hardware"]].fillna("?").astype(str).agg("/".join, axis=1)
    newest = frame.groupby(keys, sort=False)["report_id"].transform("last")
    return frame[frame["report_id"] == newest].reset_index(drop=True)


def metric_names(metric: str) -> list[str]:
    """The stored names a `--metric` filter matches: itself and, for a bare name such as
    `DenoisingStage`, `stage:DenoisingStage`."""
    return [metric] if ":" in metric else [metric, f"stage:{metric}"]


MIN_SEGMENT = 3
"""The fewest reports a level must hold to count as one (`changepoints.detect`'s
`min_size`): a change needs a level on each side, so a series needs twice as many."""


def short_series(frame: pd.DataFrame, *, min_size: int = MIN_SEGMENT) -> tuple[int, int] | None:
    """(the longest series' length, the length a change point needs) when every series in
    `frame` is too short to hold a change point; None when one is long enough."""
    needed = 2 * min_size
    if frame.empty:
        return (0, needed)
    lengths = frame.dropna(subset=["median"]).groupby(SERIES, dropna=False).size()
    longest = int(lengths.max()) if len(lengths) else 0
    return None if longest >= needed else (longest, needed)


def changes(
    frame: pd.DataFrame,
    *,
    min_size: int = MIN_SEGMENT,
    beta: float = 8.0,
    min_ratio: float = 0.02,
) -> list[dict[str, Any]]:
    """Change points of every (platform, hardware, case, metric) series in `frame` (see
    `changepoints`); `index` counts the series' points, oldest first."""
    from perfguard.presentation.changepoints import detect

    out: list[dict[str, Any]] = []
    for (platform, hardware, case_id, metric), series in frame.groupby(
        SERIES, sort=True, dropna=False
    ):
        series = series.dropna(subset=["median"]).reset_index(drop=True)
        for change in detect(
            series["median"].tolist(), min_size=min_size, beta=beta, min_ratio=min_ratio
        ):
            row = series.iloc[change.index]
            out.append(
                {
                    "platform": None if pd.isna(platform) else platform,
                    "hardware": None if pd.isna(hardware) else hardware,
                    "case": case_id,
                    "metric": metric,
                    "commit": row["commit_sha"],
                    "date": row["date"],
                    "report_id": int(row["report_id"]),
                    "index": change.index,
                    "before": change.before,
                    "after": change.after,
                    "ratio": change.ratio,
                    "direction": change.direction,
                }
            )
    return out
