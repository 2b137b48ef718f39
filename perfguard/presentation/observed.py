"""What a diffusers case's adapter saw of the pipeline, as the report's case line says it.

`CaseVerdict.observed` (`perfguard.interop.diffusers.DiffusersCase.observed`): the seam
that timed the denoising steps, or the one line that says why there are none, and for a
video output its frame count, with `e2e` per frame beside `e2e` itself: a video
pipeline's cost is read per frame, and a case that renders more frames is slower for a
reason its report should show.
"""

from __future__ import annotations

from typing import Any

from perfguard.decision.verdict import CaseVerdict


def observed_facts(case: CaseVerdict) -> list[str]:
    """The case line's words for `case.observed` (none for a case without it)."""
    seen: dict[str, Any] = dict(case.observed or {})
    out = []
    if seen.get("step_seam"):
        out.append(f"steps timed at {seen['step_seam']}")
    elif seen.get("no_steps"):
        out.append(f"no steps: {seen['no_steps']}")
    frames = seen.get("frames")
    if isinstance(frames, int) and frames > 0:
        e2e = next((m for m in case.metrics if m.metric == "e2e" and m.measured), None)
        if e2e is None or e2e.measured is None:
            out.append(f"video: {frames} frames")
        else:
            ms = e2e.measured.median
            out.append(f"video: {frames} frames, e2e {ms:.2f} ms, {ms / frames:.2f} ms per frame")
    return out
