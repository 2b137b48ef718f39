"""Measurement: platforms, the stage timer, the runner and its worker processes.

The one layer (with `perfguard.workloads`) that imports torch. Its modules import it at
module level, so import them only where a command measures something.
"""
