"""`perfguard report ...` and `perfguard merge`: report files read, rendered as JSON and
combined; nothing is measured and torch is never imported."""

from __future__ import annotations

from perfguard.storage.reports import Report, read_report


def merge_reports(paths: tuple[str, ...], out: str) -> Report:
    """Combine the reports of shards (disjoint case sets) at `paths` into one, written
    to `out`."""
    from perfguard.storage import reports

    merged = reports.merge([read_report(p) for p in paths], sources=list(paths))
    reports.write_report(out, merged)
    return merged
