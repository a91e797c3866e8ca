"""How the popkit process ends: exit codes and output as SystemExit would give, without module teardown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures"


def popkit(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "popkit", *args], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "POPKIT_HOME": str(home), "NO_COLOR": "1"})


@pytest.mark.parametrize("code,out,err", [(None, "", ""), (3, "", ""), ("bye", "", "bye\n")])
def test_leave_ends_as_systemexit_would(code, out, err):
    script = f"import sys; sys.stdout.write('x' * 100000); from popkit.cli import leave; leave({code!r})"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        {None: 0, 3: 3, "bye": 1}[code], "x" * 100000 + out, err)


@pytest.mark.slow
def test_a_run_and_its_ledger_are_complete_when_the_process_has_ended(tmp_path):
    """The report reaches a pipe whole, and the run's history row is committed, though teardown is skipped."""
    done = popkit("test", str(FIX / "submissions" / "good.py"), "--task", str(FIX / "tasks" / "double"), "--json",
                  home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "passed"
    listed = popkit("history", "--json", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "good.py" in listed.stdout


def test_a_usage_error_keeps_its_code_and_message(tmp_path):
    done = popkit("no-such-command", home=tmp_path)
    assert done.returncode == 2 and "No such command" in done.stderr


def _cases() -> list[list[str]]:
    from popkit.cli import app
    import typer.main

    found = []
    for name, command in typer.main.get_command(app).commands.items():
        found += [[name, "--help"], [name, "--bogus-option"], [name, "--json", "--bogus-option"]]
        found += [[name, sub, "--help"] for sub in getattr(command, "commands", {})]
    return found + [["--help"], ["--version"], ["tset"], ["--json", "test"], []]


@pytest.mark.parametrize("args", _cases(), ids=lambda args: " ".join(args) or "(none)")
def test_the_app_narrowed_to_one_command_says_and_exits_as_the_whole_app(args):
    """main() hands Typer only the command the line names (Typer builds every command it holds first): help,
    usage errors and their --json documents, exit codes are those of the whole app."""
    from typer.testing import CliRunner

    from popkit.cli import app, narrowed

    whole = CliRunner().invoke(app, args, prog_name="popkit", env={"NO_COLOR": "1", "POPKIT_WIDTH": "100"})
    one = CliRunner().invoke(narrowed(args), args, prog_name="popkit", env={"NO_COLOR": "1", "POPKIT_WIDTH": "100"})
    assert (one.exit_code, one.output) == (whole.exit_code, whole.output)


def test_each_command_is_registered_by_the_module_the_table_names():
    """main() imports only the module COMMAND_MODULES names for the command on the line: a command missing from
    the table, or listed under another module, would be 'No such command' for users."""
    import subprocess
    import sys

    from popkit.cli import COMMAND_MODULES, MODULES

    code = ("import importlib, sys; from typer.main import get_command_name; "
            "importlib.import_module('popkit.cli.' + sys.argv[1]); from popkit.cli.app import app; "
            "print(' '.join([c.name or get_command_name(c.callback.__name__) for c in app.registered_commands]"
            " + [g.name for g in app.registered_groups]))")
    every = set()
    for module in MODULES:  # a module may import another's (tune takes bench's options), never fewer
        done = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert {n for n, m in COMMAND_MODULES.items() if m == module} <= set(done.stdout.split()), module
        every |= set(done.stdout.split())
    assert every == set(COMMAND_MODULES)


def test_a_command_imports_its_own_module_alone():
    import subprocess
    import sys

    code = ("import sys; from popkit.cli import narrowed; narrowed(['test', 'x.py']); "
            "print(sorted(m for m in sys.modules if m.startswith('popkit.cli.') and m != 'popkit.cli.app'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['popkit.cli.running']"


@pytest.mark.parametrize("args", [["bench", "x.py", "--budget", "nan"], ["bench", "x.py", "--budget=inf"],
                                  ["bench", "x.py", "--budget=-1"], ["tune", "x.py", "--budget", "nan"],
                                  ["tune", "x.py", "--ab-budget", "inf"], ["compile", "x.py", "--timeout", "nan"]])
def test_seconds_that_are_not_a_finite_number_are_refused(args):
    """`--budget nan` was taken (click's min and max let nan and inf through): exit 2 naming the option."""
    from typer.testing import CliRunner

    from popkit.cli import app

    result = CliRunner().invoke(app, args, prog_name="popkit", env={"NO_COLOR": "1", "POPKIT_WIDTH": "100"})
    assert result.exit_code == 2, result.output
    assert "--budget" in result.output or "--ab-budget" in result.output or "--timeout" in result.output
