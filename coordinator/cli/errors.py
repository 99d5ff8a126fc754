"""Turn validation and data errors into one line that names the field, and a non-zero exit."""

from __future__ import annotations

import sys

import click
from pydantic import ValidationError

from parties.logs import os_error_line

__all__ = ["EXIT_USAGE", "format_validation_error", "os_error_line", "run_guarded"]

EXIT_USAGE = 2


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def run_guarded(cli: click.Group) -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:  # one line, as every other error (the usage is under --help)
        click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ValidationError as exc:
        click.echo(f"error: {format_validation_error(exc)}", err=True)
        sys.exit(EXIT_USAGE)
    except (ValueError, FileNotFoundError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except OSError as exc:  # a file that cannot be read or written, an address that cannot be bound
        click.echo(f"error: {os_error_line(exc)}", err=True)
        sys.exit(EXIT_USAGE)
