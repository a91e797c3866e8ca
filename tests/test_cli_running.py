"""`popkit test`, `popkit bench` and `popkit tasks` driven in-process, on fixture tasks."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from popkit.cli import app

FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")




def sub(name: str) -> str:
    return str(FIX / "submissions" / name)


def test_test_passes_and_prints_leaderboard_lines(cli):
    result = cli("test", sub("good.py"), "--task", DOUBLE, "--no-history")
    assert result.exit_code == 0, result.output
    assert "✅ size: 3; seed: 1; flag: True" in result.output
    assert "PASSED" in result.output
    assert "Traceback" not in result.output


def test_bench_leaderboard_prints_score_public_and_secret(cli):
    result = cli("bench", sub("good.py"), "--task", DOUBLE, "--leaderboard", "--secret-seed", "17", "--no-history")
    assert result.exit_code == 0, result.output
    assert "⏱ 10.0 ± 0.00 µs" in result.output  # 10000 ns ± 3 ns: µs above 2000 ns; v < 100: 1 decimal, error 2
    assert "score (geom, public): 20.0 µs" in result.output
    assert "secret seed 17: passed, 20.0 µs" in result.output


def test_json_is_one_document_with_schema(cli):
    result = cli("bench", sub("good.py"), "--task", DOUBLE, "--json", "--no-history")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/run/1" and doc["outcome"] == "passed"
    assert doc["runs"][0]["benchmarks"][2]["mean_ns"] == 40000.0
    assert doc["score_public_s"] == pytest.approx(20e-6)


@pytest.mark.parametrize("name,code,line", [
    ("wrong.py", 1, "check failed: benchmark, benchmark size: 10; seed: 3: expected 20, got 21"),
    ("crash.py", 6, "crashed: benchmark was killed by signal SIGABRT"),
])
def test_failures_are_one_categorized_line_and_an_exit_code(cli, name, code, line):
    result = cli("bench", sub(name), "--task", DOUBLE, "--no-history", "--no-precompile")
    assert result.exit_code == code, result.output
    assert line in result.output
    assert "Traceback (most recent call last)" not in result.output.split("stderr")[0]


@pytest.mark.parametrize("args,code,message", [
    (["test", "missing.py", "--task", DOUBLE], 4, "submissions/missing.py: no such file"),
    (["test", "syntax.py", "--task", DOUBLE], 4, "syntax error: expected ':'"),
    (["test", "noentry.py", "--task", DOUBLE], 4, "no `custom_kernel` defined at module level"),
    (["test", "wrong.py"], 2, "no `#!POPCORN leaderboard NAME` directive and no --task"),
    (["test", "good.py", "--task", "nosuchtask"], 3, "no task named `nosuchtask`"),
    (["test", "good.py", "--task", DOUBLE, "--harness", "other"], 2, "unknown harness `other`"),
    (["bench", "good.py", "--task", DOUBLE, "--leaderboard", "--profile"], 2, "--leaderboard and --profile"),
    (["test", "good.py", "--task", DOUBLE, "--python", "/no/such/python"], 2,
     "--python /no/such/python: no such interpreter"),
    (["bench", "good.py", "--task", DOUBLE, "--python", str(FIX)], 2,
     f"--python {FIX}: a folder, not an interpreter"),
    (["bench", "good.py", "--task", DOUBLE, "--python", str(FIX / "tasks" / "double" / "task.yml")], 2,
     f"--python {FIX / 'tasks' / 'double' / 'task.yml'}: not executable"),
])
def test_bad_input_is_one_line_with_hint(cli, args, code, message):
    args = [sub(a) if a.endswith(".py") else a for a in args]
    result = cli(*args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "hint:" in result.output
    assert "Traceback" not in result.output


def test_errors_are_json_in_json_mode(cli):
    result = cli("test", sub("missing.py"), "--task", DOUBLE, "--json")
    assert result.exit_code == 4
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/error/1" and doc["exit_code"] == 4 and "no such file" in doc["message"]


def _double_in(root: Path) -> str:
    """The fixture task `double` (and the eval it names, ../common) copied into `root`: a problem set names
    task folders inside its own folder. Returns the folder name a set's `directory` gives."""
    shutil.copytree(DOUBLE, root / "double")
    shutil.copytree(Path(DOUBLE).parent / "common", root / "common")
    return "double"


def test_tasks_list_and_show(cli, tmp_path):
    double = _double_in(tmp_path)
    (tmp_path / "set.yaml").write_text(f"name: s\nproblems:\n  - {{directory: {double}, name: dbl, gpus: [H100]}}\n")
    result = cli("tasks", "--tasks-root", str(tmp_path / "set.yaml"), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["leaderboard"]: r for r in json.loads(result.stdout)["tasks"]}
    assert rows["dbl"]["tests"] == 2 and rows["dbl"]["benchmarks"] == 3 and rows["dbl"]["gpus"] == ["H100"]
    shown = cli("tasks", "show", "dbl", "--tasks-root", str(tmp_path / "set.yaml"))
    assert shown.exit_code == 0, shown.output
    assert "Double a number." in shown.output and "size: 40; seed: 5" in shown.output
    assert "timeouts: test 20 s, benchmark 20 s, ranked 20 s" in shown.output


@pytest.mark.parametrize("args", [["test", "--bogus"], ["bench"], ["tasks", "show"]])
def test_usage_errors_exit_2_with_clicks_message(cli, args):
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output
    assert "Usage: popkit" in result.output


def test_profile_shows_each_profiler_table_and_no_false_failure(cli):
    # The standard evals write only `benchmark.I.report` in profile mode (base64 with the "+*" alphabet).
    result = cli("bench", sub("good.py"), "--task", DOUBLE, "--profile", "--no-history")
    assert result.exit_code == 0, result.output
    assert "no timing reported" not in result.output
    for size in (10, 20, 40):
        assert f"double_kernel  {size} us ???" in result.output
    assert "PASSED" in result.output


def _command_paths(group=None, prefix=()):
    """Every command and sub-command of `popkit`, as argument lists."""
    import typer.main

    group = group or typer.main.get_command(app)
    yield list(prefix)
    for name, command in getattr(group, "commands", {}).items():
        yield from _command_paths(command, (*prefix, name))


@pytest.mark.parametrize("path", list(_command_paths()), ids=lambda p: " ".join(p) or "popkit")
def test_usage_errors_are_json_for_every_command(cli, path):
    result = cli(*path, "--zzz", "--json")
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout) == {
        "schema": "popkit/error/1", "error": "UsageError", "message": "No such option: --zzz",
        "hint": f"`{' '.join(['popkit', *path])} --help` lists the arguments and options", "exit_code": 2}


# The words after an option's name are Typer's: typer 0.29 (pydantic) says "Input should be ...", earlier ones
# (click) "... is not in the range ...". Each pattern takes either; the option's name and the bound are popkit's.
@pytest.mark.parametrize("args,message", [
    (["bench", "--json"], r"Missing argument 'submissions'\."),
    (["history", "-n", "x", "--json"], r"Invalid value for '-n' / '--limit': .*(valid integer|valid int)"),
    (["tasks", "show", "--json"], r"Missing argument 'name'\."),
    (["nosuch", "--json"], r"No such command 'nosuch'\."),
    (["submit", "x.py", "--timeout", "inf", "--json"], r"Invalid value for '--timeout': .*(<= ?|to )86400"),
    (["compile", "x.py", "--timeout", "inf", "--json"], r"Invalid value for '--timeout': .*(<= ?|to )86400"),
    (["test", "x.py", "--secret-seed", str(2**64), "--json"],
     r"Invalid value for '--secret-seed': .*(<= ?|to )2147483647"),
    (["bench", "x.py", "--secret-seed", "-1", "--json"],
     r"Invalid value for '--secret-seed': (.*greater than or equal to 0|-1 is not in the range 0<=x)"),
    (["--json", "test", "x.py"], r"No such option: --json"),  # --json before the command: still JSON
])
def test_missing_arguments_and_bad_numbers_are_json_errors(cli, args, message):
    result = cli(*args)
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/error/1" and doc["exit_code"] == 2 and re.match(message, doc["message"]), doc


def test_a_task_with_its_own_entry_points_runs_from_the_cli(cli):
    pair = str(FIX / "tasks" / "pair")
    result = cli("test", str(FIX / "tasks" / "pair" / "template.py"), "--task", pair, "--no-history")
    assert result.exit_code == 0, result.output
    result = cli("test", sub("good.py"), "--task", pair, "--no-history")  # defines only custom_kernel
    assert result.exit_code == 4, result.output
    assert "no `forward` defined" in result.output


@pytest.mark.parametrize("width", ["0", "12", "-5", "wide", "1e3"])
def test_a_bad_popkit_width_falls_back_with_one_warning(cli, monkeypatch, width):
    monkeypatch.setenv("POPKIT_WIDTH", width)
    result = cli("tasks")
    assert result.exit_code == 0, result.output
    assert "vectoradd" in result.stdout
    assert result.stderr.count(f"warning: POPKIT_WIDTH={width} ignored: it must be a whole number of columns,"
                               " at least 40") == 1


def test_one_bad_problem_set_entry_hides_no_other_task(cli, tmp_path):
    double = _double_in(tmp_path)
    (tmp_path / "set.yaml").write_text(
        f"name: s\nproblems:\n  - {{directory: {double}, name: dbl}}\n  - {{directory: nowhere, name: ghost}}\n")
    (tmp_path / "broken.yaml").write_text("name: b\nproblems: 5\n")
    result = cli("tasks", "--tasks-root", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "dbl" in result.stdout and "vectoradd" in result.stdout
    assert f"warning: skipped `ghost` of set.yaml: {tmp_path / 'nowhere'}: not a task directory" in result.stderr
    assert "warning: skipped a problem set: broken.yaml: key `problems` must be a list (got int 5)" in result.stderr
    doc = json.loads(cli("tasks", "--tasks-root", str(tmp_path), "--json").stdout)
    assert "dbl" in [t["leaderboard"] for t in doc["tasks"]]
    assert [(s["problem_set"], s["leaderboard"]) for s in doc["skipped"]] == [
        (str(tmp_path / "broken.yaml"), None), (str(tmp_path / "set.yaml"), "ghost")]


def test_a_broken_problem_set_hides_no_name_of_another(cli, tmp_path):
    double = _double_in(tmp_path)
    (tmp_path / "set.yaml").write_text(f"name: s\nproblems:\n  - {{directory: {double}, name: dbl}}\n")
    (tmp_path / "broken.yaml").write_text('name: b\nproblems:\n  - {directory: "a\\0b", name: x}\n')
    result = cli("test", sub("good.py"), "--task", "dbl", "--tasks-root", str(tmp_path), "--no-history")
    assert result.exit_code == 0, result.output
    listed = cli("tasks", "--tasks-root", str(tmp_path))
    assert listed.exit_code == 0, listed.output
    assert ("warning: skipped a problem set: broken.yaml: key `problems[0].directory` holds a NUL character"
            " ('a\\x00b')") in listed.stderr
    missing = cli("test", sub("good.py"), "--task", "nosuch", "--tasks-root", str(tmp_path))
    assert missing.exit_code == 3
    assert "1 problem set(s) did not load, e.g. broken.yaml: key `problems[0].directory`" in missing.output
