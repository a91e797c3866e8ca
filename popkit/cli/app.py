"""The Typer app the command modules register on, and the one place where a PopkitError becomes a
message and an exit code."""

from __future__ import annotations

import difflib
import math
import os
import signal
from typing import Annotated

import typer
from typer.core import TyperGroup

from typer import _click

from popkit import __version__
from popkit.errors import ExitCode, Interrupted, PopkitError, UsageError
from popkit.views import common


_JSON_KEY = "popkit.json"  # ctx.meta: whether --json is anywhere on the command line


def finite(value: float) -> float:
    """An option's callback: seconds must be a number (click's min and max let nan and inf through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number of seconds")
    return value


class _PopkitGroup(TyperGroup):
    def make_context(self, info_name, args, parent=None, **extra):
        # The top-level parse (unknown command, unknown option before it) happens here, before invoke.
        json_requested = "--json" in args
        try:
            ctx = super().make_context(info_name, list(args), parent=parent, **extra)
        except _click.ClickException as exc:
            _close_matches_only(exc)
            if json_requested:
                _usage_error_as_json(exc)
            raise
        ctx.meta[_JSON_KEY] = json_requested
        return ctx

    def format_commands(self, ctx, formatter) -> None:
        """Each command with the first sentence of its help whole, wrapped to the terminal (click cuts it to the
        width left at 80 columns, mid-sentence)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                text = " ".join((cmd.short_help or cmd.help or "").split())
                end = text.find(". ")
                rows.append((name, text[:end + 1] if end >= 0 else text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _click.ClickException as exc:  # a sub-command's usage error: click prints it, unless --json
            _close_matches_only(exc)
            if ctx.meta.get(_JSON_KEY):
                _usage_error_as_json(exc)
            raise
        except PopkitError as exc:
            common.print_error(exc)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP turned into Interrupted by cli.main()
            signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
            common.err_console().print(f"popkit: stopped by {signal.Signals(signum).name}; its child processes "
                                       "were killed and its working files removed")
            raise typer.Exit(128 + signum) from None
        except Exception as exc:  # a popkit bug: one line, no traceback unless asked for
            # Usage errors, --help and exits belong to click (vendored inside typer since 0.26):
            # typer's own handling prints them and sets exit code 2.
            if _is_cli_framework(exc) or os.environ.get("POPKIT_DEBUG"):
                raise
            common.print_internal_error(exc)
            raise typer.Exit(int(ExitCode.INTERNAL)) from None


SUGGEST_CUTOFF = 0.8  # click suggests from 0.6: `--bogus` got `--gpus`; a typo (`--jsn`, `--leaderbord`) scores higher


def _close_matches_only(exc: "_click.ClickException") -> None:
    """An unknown option's suggestions kept only where they are close (difflib ratio >= SUGGEST_CUTOFF)."""
    possibilities = getattr(exc, "possibilities", None)
    name = getattr(exc, "option_name", None)
    if possibilities and name:
        exc.possibilities = difflib.get_close_matches(name, list(possibilities), cutoff=SUGGEST_CUTOFF)  # type: ignore[attr-defined]


def _usage_error_as_json(exc: "_click.ClickException") -> None:
    """`--json` anywhere on the command line: a usage error is a popkit/error/1 document too."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "popkit"
    common.set_json(True)
    common.print_error(UsageError(exc.format_message(), f"`{command} --help` lists the arguments and options",
                                  exit_code=ExitCode(exc.exit_code)))
    raise typer.Exit(exc.exit_code)


def _is_cli_framework(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("click", "typer")


app = typer.Typer(
    cls=_PopkitGroup,
    name="popkit",
    help="Run GPU MODE leaderboard tasks locally, exactly as the leaderboard runner does.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h on popkit and on every command
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"popkit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", "-V", is_eager=True, callback=_version,
                                                help="Print popkit's version and exit.")] = False) -> None:
    """Run GPU MODE leaderboard tasks locally, exactly as the leaderboard runner does."""
