"""Measurement: the runner, the counted run, worker processes and the relative check.

It imports torch (as `perfguard.device` and `perfguard.workloads` below it do) at module
level, so import it only where a command measures something.
"""
