"""The warm pool a measuring command's workers start from, begun before torch is imported.

`gen-baselines` and `check` start workers (baseline processes, confirmations) forked
from a warm server (`perfguard.measurement.launch.WarmServer`). This module only
decides when that server starts: first thing, beside this process's own imports, not
after them. Standard library only at import time, like `launch`, so that importing the
library API (`perfguard.api`) imports no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def in_warm_pool(wanted: Callable[[Any, dict[str, Any]], bool]) -> Any:
    """Give a measuring command the `warm` pool its workers start from (unless the
    caller passes one), ended when the command returns or raises. When
    `wanted(options, keywords)` (the command will start workers), the pool's server is
    started before this process imports torch (`perfguard.measurement.launch.early_server`),
    so that its imports and this process's run side by side, not one after the other."""

    def decorate(command: Any) -> Any:
        @functools.wraps(command)
        def wrapper(selection: Any, options: Any, **kw: Any) -> Any:
            if kw.get("warm") is not None:
                return command(selection, options, **kw)
            from perfguard.measurement.launch import early_server

            early = early_server(options, wanted(options, kw))  # before torch
            from perfguard.measurement.worker_handle import WarmPool

            with WarmPool(early) as warm:
                return command(selection, options, **{**kw, "warm": warm})

        return wrapper

    return decorate
