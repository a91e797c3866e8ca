"""The MCP server's parts without a server: the tool table, argument checks, device slots, results, the worker's
progress lines. tests/test_mcp.py drives the real server over stdio."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="needs the MCP SDK's jsonschema: pip install 'popkit[mcp]'")

from popkit import api
from popkit.cli import app
from popkit.documents import document
from popkit.errors import TaskError, UsageError
from popkit.mcpserver import server, slots, tools, worker


def cli_commands() -> set[str]:
    """Every command of `popkit`, as `name` or `group name`."""
    import typer.main

    group = typer.main.get_command(app)
    names = set()
    for name, command in group.commands.items():
        names.add(name)
        for sub in getattr(command, "commands", {}) or {}:
            names.add(f"{name} {sub}")
    return names


def test_every_command_is_a_tool_or_says_why_not():
    spelled = {"tasks show": "task_show"}
    commands = cli_commands()
    missing = [c for c in sorted(commands) if spelled.get(c, c) not in tools.BY_NAME and c not in tools.NOT_TOOLS]
    assert not missing, f"commands neither a tool nor in tools.NOT_TOOLS: {missing}"
    assert set(tools.NOT_TOOLS) <= commands


@pytest.mark.parametrize("tool", tools.TOOLS, ids=lambda t: t.name)
def test_each_input_schema_is_a_closed_json_schema(tool):
    schema = tool.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    assert all(p.get("description") for p in schema["properties"].values()), "every argument says what it is"


def test_file_arguments_are_a_path_or_a_text_never_both():
    assert tools.submission_of({"submission": "a.py"}) == "a.py"
    assert tools.submission_of({"source": "x = 1\n"}) == api.SourceText("x = 1\n")
    with pytest.raises(UsageError) as both:
        tools.submission_of({"submission": "a.py", "source": "x"})
    assert both.value.message == "both `submission` and `source` given"
    with pytest.raises(UsageError) as neither:
        tools.submission_of({})
    assert neither.value.message == "no `submission` and no `source`"
    assert tools.submission_of({}, "submission_b", "source_b", required=False) is None


@pytest.mark.parametrize("name, arguments, message", [
    ("test", {"submission": "a.py", "bogus": 1},
     "test: arguments: Additional properties are not allowed ('bogus' was unexpected)"),
    ("bench", {"submission": "a.py", "rounds": 2}, "bench: argument `rounds`: 2 is less than the minimum of 4"),
    ("show", {}, "show: arguments: 'run' is a required property"),
    ("test", {"submission": "a.py", "device": "first"}, "test: argument `device`: 'first' does not match '^[0-9]+$'"),
])
def test_arguments_outside_the_schema_are_usage_errors(name, arguments, message):
    with pytest.raises(UsageError) as info:
        server.check_arguments(tools.tool(name), arguments)
    assert info.value.message == message
    assert info.value.hint.startswith(f"`{name}` takes ")


def test_an_unknown_tool_names_the_tools():
    with pytest.raises(UsageError) as info:
        tools.tool("benchmark")
    assert info.value.message == "no tool `benchmark`"
    assert "tasks, task_show, new" in info.value.hint


def test_runs_hold_their_gpu_or_every_device():
    held = slots.Slots(("0", "1"))
    assert held.wanted(None) == ("0", "1") and held.wanted(["1"]) == ("1",)
    assert server.pinned_gpus({"device": "1"}) == ["1"] and server.pinned_gpus({"devices": "0,1"}) == ["0", "1"]
    assert server.pinned_gpus({}) == []
    assert tools.tool("test").device({}) and tools.tool("bench").device({}) and tools.tool("tune").device({})
    assert not tools.tool("compile").device({}) and not tools.tool("check").device({})
    assert tools.tool("submit").device({"gate": "test"}) and not tools.tool("submit").device({})


def test_slots_serve_in_order_and_say_who_they_wait_for(monkeypatch):
    monkeypatch.setattr(slots, "WAIT_NOTE_EVERY_S", 0.05)
    order, notes = [], []

    async def scenario():
        devices = slots.Slots(("0", "1"))
        first_in = asyncio.Event()
        release_first = asyncio.Event()

        async def run(name, wanted, gate=None, entered=None):
            async def say(text):
                notes.append((name, text))
            async with devices.hold(wanted, f"`{name}`", say):
                order.append(name)
                if entered:
                    entered.set()
                if gate:
                    await gate.wait()

        a = asyncio.create_task(run("a", ("0",), release_first, first_in))
        await first_in.wait()
        b = asyncio.create_task(run("b", ("0", "1")))  # needs GPU 0: waits for a
        await asyncio.sleep(0.01)
        c = asyncio.create_task(run("c", ("1",)))  # GPU 1 is free, but b asked first
        await asyncio.sleep(0.12)
        assert order == ["a"]
        release_first.set()
        await asyncio.gather(a, b, c)

    asyncio.run(scenario())
    assert order == ["a", "b", "c"]
    b_notes = [text for name, text in notes if name == "b"]
    c_notes = [text for name, text in notes if name == "c"]
    assert b_notes[0].startswith("waiting for GPU 0, GPU 1 (0 s): `a` has held GPU 0 for ")
    assert c_notes[0] == "waiting for GPU 1 (0 s): `b` is ahead in line"


def test_a_cancelled_waiter_leaves_the_line():
    async def scenario():
        devices = slots.Slots(("cpu",))
        holding = asyncio.Event()

        async def quiet(_text):
            return None

        async def hold_forever():
            async with devices.hold(("cpu",), "`a`", quiet):
                holding.set()
                await asyncio.sleep(3600)

        a = asyncio.create_task(hold_forever())
        await holding.wait()
        b = asyncio.create_task(devices.hold(("cpu",), "`b`", quiet).__aenter__())
        await asyncio.sleep(0.01)
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert [t.who for t in devices.queue] == []
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        assert devices.holders == {}

    asyncio.run(scenario())


def test_a_result_is_the_document_and_an_error_its_message_and_hint():
    doc = {"schema": "popkit/run/1", "outcome": "failed", "exit_code": 1}
    done = server.tool_result({"done": doc, "exit_code": 1})
    assert not done.is_error and done.structured_content == doc
    assert json.loads(done.content[0].text) == doc and done.meta == {"popkit/exit_code": 1}
    error = document(TaskError("no task named `x`", "`popkit tasks` lists the tasks popkit knows"))
    failed = server.tool_result({"error": error})
    assert failed.is_error and failed.structured_content == error and failed.meta == {"popkit/exit_code": 3}
    assert failed.content[0].text == "error: no task named `x`\nhint: `popkit tasks` lists the tasks popkit knows"
    stopped = server.tool_result({"cancelled": 2})
    assert stopped.is_error and stopped.structured_content["exit_code"] == 130


def test_the_worker_sends_steps_and_a_running_case_at_most_every_few_seconds(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    reporter = worker.Reporter(out)
    reporter("test")
    reporter.live("test · case 1/3", "test:1")
    reporter.live("test · case 1/3 · 1 s", "test:1")  # same case, a second later: not sent
    clock[0] += worker.LIVE_EVERY_S
    reporter.live("test · case 1/3 · 5 s", "test:1")
    reporter.live("test · case 2/3", "test:2")
    lines = [json.loads(line)["progress"] for line in out.getvalue().splitlines()]
    assert lines == ["test", "test · case 1/3", "test · case 1/3 · 5 s", "test · case 2/3"]


def test_the_worker_answers_a_bad_request_with_an_error_document():
    out = io.StringIO()
    assert worker.serve_one({"tool": "task_show", "arguments": {"name": "no-such-task"}}, worker.Reporter(out)) == 0
    (line,) = out.getvalue().splitlines()
    error = json.loads(line)["error"]
    assert error["schema"] == "popkit/error/1" and error["error"] == "TaskError" and error["exit_code"] == 3
    assert error["message"].startswith("no task named `no-such-task`")


def test_the_readme_config_block_starts_popkit_mcp():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    agents = (root / "docs" / "agents.md").read_text()
    (block,) = [b for b in re.findall(r"```json\n(.*?)```", agents, flags=re.S) if "mcpServers" in b]
    server_entry = json.loads(block)["mcpServers"]["popkit"]
    assert [server_entry["command"], *server_entry["args"]] == ["popkit", "mcp"]
    assert "claude mcp add popkit -- popkit mcp" in readme
