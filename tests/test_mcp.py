"""`popkit mcp` started as a subprocess and driven by the MCP SDK's own stdio client, as an agent host drives it.

The loop's documents are compared with the CLI's `--json` (timestamps and durations aside); cheats fail by
name; bad requests are tool errors after which the server still serves; a cancelled bench leaves no process
and no folder; concurrent calls all complete, runs one at a time on the one device of a CPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'popkit[mcp]' (CI installs it with .[dev])")

import anyio  # noqa: E402  (the MCP SDK's dependency)
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from typer.testing import CliRunner

from popkit.cli import app
from popkit.mcpserver.tools import TOOLS

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")
GOOD = FIX / "submissions" / "good.py"
VOLATILE = {"started_at", "created_at", "duration_s", "eval_s"}  # eval_s: seconds of each A/B eval


def steady(doc):
    """`doc` without what differs from one run to the next: timestamps and durations."""
    if isinstance(doc, dict):
        return {k: steady(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [steady(v) for v in doc]
    return doc


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A fresh history, temporary folder and working folder, shared by the server and the CLI of a test."""
    env = {"POPKIT_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1"}
    (tmp_path / "tmp").mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@asynccontextmanager
async def session(place: Path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "POPKIT_HOME": os.environ["POPKIT_HOME"], "TMPDIR": os.environ["TMPDIR"], "OMP_NUM_THREADS": "1"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "popkit", "mcp"], env=env, cwd=str(place))
    with open(place / "server.log", "w") as log:
        async with stdio_client(params, errlog=log) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client


def cli(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    return json.loads(result.stdout)


def drive(place: Path, scenario) -> None:
    async def main():
        async with session(place) as client:
            await scenario(client)

    anyio.run(main)


async def call(client, tool: str, progress: list | None = None, /, **arguments):
    async def seen(_step, _total, message):
        if progress is not None:
            progress.append(message)

    return await client.call_tool(tool, arguments, progress_callback=seen)


def test_the_tools_are_listed_with_their_schemas(place):
    async def scenario(client):
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == [t.name for t in TOOLS]
        assert [t.input_schema for t in listed] == [t.input_schema for t in TOOLS]

    drive(place, scenario)


@pytest.mark.slow
def test_the_loop_gives_the_clis_documents(place):
    other = place / "same.py"
    shutil.copyfile(GOOD, other)
    found = {}

    async def scenario(client):
        steps = []
        new = await call(client, "new", task="vectoradd", output=str(place / "mine.py"))
        found["new"] = new.structured_content
        found["check"] = (await call(client, "check", submission=str(place / "mine.py"))).structured_content
        test = await call(client, "test", steps, submission=str(GOOD), task=DOUBLE, harness="task")  # the CLI's default
        found["test"], found["test_steps"] = test.structured_content, list(steps)
        ab = await call(client, "bench", submission=str(GOOD), submission_b=str(other), task=DOUBLE, rounds=4,
                        budget=0, harness="task")
        found["ab"], found["ab_meta"] = ab.structured_content, ab.meta
        found["history"] = (await call(client, "history")).structured_content

    drive(place, scenario)
    assert found["new"]["schema"] == "popkit/new/1" and (place / "mine.py").is_file()
    by_cli = json.dumps(cli("new", "--task", "vectoradd", "-o", str(place / "cli.py")))
    assert json.loads(by_cli.replace(str(place / "cli.py"), str(place / "mine.py"))) == found["new"]
    assert found["check"] == cli("check", str(place / "mine.py"))
    assert found["test"]["outcome"] == "passed" and "test" in found["test_steps"]
    assert steady(found["test"]) == steady(cli("test", str(GOOD), "--task", DOUBLE))
    assert found["ab"]["schema"].startswith("popkit/ab/") and found["ab_meta"] == {"popkit/exit_code": 0}
    assert steady(found["ab"]) == steady(cli("bench", str(GOOD), str(other), "--task", DOUBLE, "--rounds", "4",
                                             "--budget", "0"))
    history = cli("history")
    assert len(history["runs"]) == 6  # MCP: test, both sides of the A/B; the CLI the same again
    assert found["history"]["runs"] == history["runs"][3:]


@pytest.mark.slow
@pytest.mark.parametrize("cheat, message", [
    ("passthrough.py", "output aliases input 0 (same storage)"),
    ("timer_patch.py", "timer patched: time.perf_counter_ns was replaced"),
])
def test_a_cheat_fails_by_name(place, cheat, message):
    path = ROOT / "submissions" / "cheats" / cheat
    found = {}

    async def scenario(client):
        found["path"] = await call(client, "test", submission=str(path), history=False)
        found["text"] = await call(client, "test", source=path.read_text(), history=False)
        found["after"] = await call(client, "tasks")

    drive(place, scenario)
    for how in ("path", "text"):
        result = found[how]
        doc = result.structured_content
        assert not result.is_error and result.meta == {"popkit/exit_code": 1}
        assert doc["outcome"] == "failed"
        errors = [c["error"] for r in doc["runs"] for c in r["tests"] if not c["passed"]]
        assert errors and all(message in e for e in errors), errors
    assert Path(found["text"].structured_content["submission"]).name.endswith(".py")
    assert not found["after"].is_error


@pytest.mark.slow
def test_bad_requests_are_tool_errors_and_the_server_goes_on(place):
    found = {}

    async def scenario(client):
        found["tool"] = await call(client, "benchmark")
        found["task"] = await call(client, "task_show", name="no-such-task")
        found["argument"] = await call(client, "history", limit="ten")
        found["file"] = await call(client, "check", submission=str(place / "missing.py"))
        found["both"] = await call(client, "check", submission="a.py", source="x = 1\n")
        found["after"] = await call(client, "task_show", name=DOUBLE)

    drive(place, scenario)
    expected = {
        "tool": ("UsageError", "no tool `benchmark`", 2),
        "task": ("TaskError", "no task named `no-such-task`", 3),
        "argument": ("UsageError", "history: argument `limit`: 'ten' is not of type 'integer'", 2),
        "file": ("SubmissionError", "missing.py: no such file", 4),
        "both": ("UsageError", "both `submission` and `source` given", 2),
    }
    for key, (kind, message, code) in expected.items():
        result = found[key]
        doc = result.structured_content
        assert result.is_error and doc["schema"] == "popkit/error/1", (key, doc)
        assert doc["error"] == kind and message in doc["message"] and doc["exit_code"] == code, (key, doc)
        assert result.content[0].text == f"error: {doc['message']}\nhint: {doc['hint']}"
        assert result.meta == {"popkit/exit_code": code}
    assert not found["after"].is_error and found["after"].structured_content["name"] == "double"


def ours(place: Path) -> list[str]:
    """Processes of this test's server: a worker, or anything whose command line or folder is in its TMPDIR."""
    tmp, found = str(place / "tmp"), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            cwd = os.readlink(entry / "cwd") if os.access(entry / "cwd", os.R_OK) else ""
        except OSError:
            continue
        if tmp in argv or cwd.startswith(tmp) or ("popkit.mcpserver.worker" in argv and str(place) in cwd):
            found.append(f"{entry.name}: {argv}")
    return found


@pytest.mark.slow
def test_a_cancelled_bench_leaves_no_process_and_no_folder(place):
    found = {}

    async def scenario(client):
        steps: list[str] = []
        running = anyio.Event()

        async def seen(_step, _total, message):
            steps.append(message)
            if message.startswith("benchmark ·"):  # the eval is running (the submission sleeps 60 s)
                running.set()

        async with anyio.create_task_group() as group:
            async def bench():
                await client.call_tool("bench", {"submission": str(FIX / "submissions" / "slow.py"),
                                                 "task": DOUBLE, "harness": "task", "precompile": False},
                                      progress_callback=seen)
                found["finished"] = True  # must not happen: the call is cancelled

            group.start_soon(bench)
            with anyio.fail_after(120):
                await running.wait()
            found["during"] = ours(place)
            group.cancel_scope.cancel()
        started = time.monotonic()
        while ours(place) and time.monotonic() - started < 30:
            await anyio.sleep(0.2)
        found["stopped_s"] = time.monotonic() - started
        found["after"] = ours(place)
        found["folders"] = sorted(p.name for p in (place / "tmp").iterdir())
        found["next"] = await call(client, "task_show", name=DOUBLE)

    drive(place, scenario)
    assert "finished" not in found
    assert any("eval.py" in p for p in found["during"]), found["during"]
    assert found["after"] == [] and found["folders"] == [], found
    assert found["stopped_s"] < 30
    assert not found["next"].is_error


@pytest.mark.slow
def test_concurrent_calls_all_complete_and_runs_take_turns(place):
    found = {}

    async def scenario(client):
        notes: dict[str, list[str]] = {"a": [], "b": []}
        async with anyio.create_task_group() as group:
            async def run(name):
                found[name] = await call(client, "test", notes[name], submission=str(GOOD), task=DOUBLE,
                                          harness="task")

            async def listing():
                found["tasks"] = await call(client, "tasks")

            group.start_soon(run, "a")
            group.start_soon(run, "b")
            group.start_soon(listing)
        found["notes"] = notes

    drive(place, scenario)
    for name in ("a", "b"):
        assert not found[name].is_error and found[name].structured_content["outcome"] == "passed"
    assert not found["tasks"].is_error
    waits = [n for notes in found["notes"].values() for n in notes if n.startswith("waiting for the CPU")]
    assert waits and "`test` of good.py has held the CPU for" in waits[0], found["notes"]


@pytest.mark.slow
def test_submit_is_a_dry_run_unless_confirmed(place):
    found = {}

    async def scenario(client):
        found["dry"] = await call(client, "submit", submission=str(ROOT / "submissions" / "vectoradd" / "pytorch.py"),
                                  gpu="H100")

    drive(place, scenario)
    doc = found["dry"].structured_content
    assert doc["schema"] == "popkit/submit/1" and doc["dry_run"] is True and doc["remote"] is None
    assert doc["plan"]["argv"][1:3] == ["submit", "--gpu"]


def test_without_the_sdk_mcp_stops_with_the_install_line(monkeypatch):
    import importlib.metadata

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    result = CliRunner().invoke(app, ["mcp"])
    assert result.exit_code == 11
    assert "popkit mcp needs the MCP Python SDK 2 or later, which is not installed" in result.output
    assert "pip install 'popkit[mcp]'" in result.output


@pytest.mark.slow
def test_tune_writes_the_fastest_variant_and_says_so(place):
    found = {}
    submission = FIX / "tune" / "chunksum.py"

    async def scenario(client):
        steps: list[str] = []
        found["tune"] = await call(client, "tune", steps, submission=str(submission),
                                   task=str(FIX / "tasks" / "chunksum"), output=str(place / "tuned.py"), rounds=4,
                                   history=False)
        found["steps"] = steps

    drive(place, scenario)
    result = found["tune"]
    doc = result.structured_content
    assert not result.is_error and doc["schema"] == "popkit/tune/1" and result.meta == {"popkit/exit_code": 0}
    variants = {v["label"]: v for v in doc["variants"]}
    assert variants["CHUNK=1000"]["outcome"] == "failed" and doc["winner_label"] not in ("CHUNK=1", "CHUNK=1000")
    assert (place / "tuned.py").is_file() and found["steps"]


def test_an_interpreter_not_on_the_servers_allow_list_is_refused(place):
    """The `python` argument ran any program as the user, outside the sandbox (doctor, tasks check, the system
    probe): only the server's interpreter and those in POPKIT_MCP_PYTHONS are taken."""
    script = place / "evil.sh"
    marker = place / "ran.txt"
    script.write_text(f"#!/bin/sh\necho ran > {marker}\n")
    script.chmod(0o755)
    found = {}

    async def scenario(client):
        found["doctor"] = await call(client, "doctor", python=str(script))
        found["tasks"] = await call(client, "tasks", check=True, python=str(script))
        found["test"] = await call(client, "test", submission=str(GOOD), task=DOUBLE, python=str(script))

    drive(place, scenario)
    for key, result in found.items():
        doc = result.structured_content
        assert result.is_error and doc["exit_code"] == 2, (key, doc)
        assert "argument `python`" in doc["message"] and "POPKIT_MCP_PYTHONS" in doc["hint"], (key, doc)
    assert not marker.exists()


def test_the_allow_list_takes_the_servers_interpreter_and_the_listed_ones(tmp_path):
    from popkit.errors import UsageError
    from popkit.mcpserver.server import allowed_pythons, check_python

    link = tmp_path / "python3"
    link.symlink_to(sys.executable)
    allowed = allowed_pythons({"POPKIT_MCP_PYTHONS": "/usr/bin/python3:relative/python"})
    check_python({"python": str(link)}, allowed)  # the server's own, by another name
    check_python({}, allowed)
    with pytest.raises(UsageError):
        check_python({"python": "/bin/sh"}, allowed)
