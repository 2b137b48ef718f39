"""`perfguard server status|stop`: the resident servers measuring commands fork from
(`perfguard.measurement.resident`)."""

from __future__ import annotations

from perfguard.measurement.resident import servers, stop_all

__all__ = ["servers", "stop_all"]
