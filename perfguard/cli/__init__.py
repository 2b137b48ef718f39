"""The `perfguard` command line: each command parses, calls the library, renders the result.

One module per command group (`run`, `check`, `calibrate`, `baselines`, `report`,
`history`, `cases`); the options they share are declared once in `common`; `app` holds
the group and `main()`, the one place that maps errors to exit codes.
"""

from perfguard.cli.app import cli, main

__all__ = ["cli", "main"]
