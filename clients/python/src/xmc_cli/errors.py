"""The errors `xmc` reports: one line on stderr and an exit code (see `xmc_cli.main`)."""
from __future__ import annotations

#: Exit codes, the same for every command (docs/cli.md).
EXIT_OK = 0
EXIT_FAILED = 1  # watch: a work unit failed; stop/restart: an operation failed
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_STOPPED = 3  # watch: finished with stopped work units and no failed one
EXIT_ERROR = 4  # not logged in, not found, no permission, server unreachable, refused request


class CliError(Exception):
    """Anything that ends a command with one clear line."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, *, status: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Unauthenticated(CliError):
    pass


class NotFound(CliError):
    pass


class UsageError(CliError):
    exit_code = EXIT_USAGE
