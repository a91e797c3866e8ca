"""`popkit mcp`: popkit's commands as MCP tools over stdio, for agent hosts (Claude Code, Cursor, the MCP SDK).

Every call runs in a worker process of its own (worker.py) and returns the JSON document the command
prints with `--json` (as text, and as structured content), the CLI's exit code in `_meta`
(`popkit/exit_code`). A bad request (unknown tool or task, a bad argument, an unreadable file) is a tool
error whose text is popkit's message and hint, and whose structured content is the `popkit/error/1`
document; the server goes on serving. A verdict is not an error: a run that failed says so in its
document (`outcome`, `exit_code`).

Progress lines of a call become MCP progress notifications (when the client asked for them). A cancelled
call (`notifications/cancelled`) is stopped as Ctrl-C stops `popkit`: SIGINT to its worker, whose
finally blocks kill its children and remove its folders; a worker still there after STOP_GRACE_S is
killed, and its children die with its lifeline. Calls that run kernels queue per device (slots.py).

The SDK (`pip install 'popkit[mcp]'`) is imported only when the server starts, so that `popkit` itself
starts without it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from popkit import __version__
import popkit
from popkit.documents import document
from popkit.errors import EnvironmentProblem, PopkitError, UsageError
from popkit.mcpserver.slots import Slots, machine_devices
from popkit.mcpserver.tools import TOOLS, Tool, tool
from popkit.mcpserver.worker import internal_error

STOP_GRACE_S = 20.0  # a stopped call's worker unwinds (kills its tree, removes its folders) within this
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # one line from a worker: a run's document with its logs
INSTALL_HINT = "pip install 'popkit[mcp]'"
INSTRUCTIONS = (
    "popkit runs GPU MODE leaderboard submissions locally as the leaderboard's runner does. The loop: "
    "`new` writes a correct starting file; `check` says what the server would refuse (no run); `compile` "
    "builds it; `test` runs the task's tests; `bench` times it (leaderboard=true: the ranked score; "
    "submission_b: an A/B of two files); `tune` searches the file's `#!POPKIT tune` parameters; `history` lists "
    "runs; `submit` is a dry run unless confirm=true. "
    "A submission is a path (`submission`) or text (`source`). A run's document says `outcome` "
    "(passed, failed, compile_failed, timed_out, crashed) and, for a failed case, what was wrong, a reward hack "
    "by its class. Runs wait for the GPU while another run holds it. AGENTS.md in popkit's repository has more.")


PYTHONS_ENV = "POPKIT_MCP_PYTHONS"  # the server's allow-list of interpreters a call may name (os.pathsep-separated)


def allowed_pythons(environ: Mapping[str, str] | None = None) -> set[str]:
    """The interpreters a call's `python` may name: the one running the server and those listed in
    POPKIT_MCP_PYTHONS of the server's environment, each as its real path."""
    environ = os.environ if environ is None else environ
    listed = [p for p in environ.get(PYTHONS_ENV, "").split(os.pathsep) if p]
    return {os.path.realpath(p) for p in [sys.executable, *listed] if os.path.isabs(p)}


def check_python(arguments: Mapping[str, Any], allowed: set[str]) -> None:
    """UsageError unless the call's `python` (when given) is on the server's allow-list: the program named there
    runs for every eval, the system probe, doctor and `tasks check` (in the sandbox where one is in force, as the
    server's user where none is)."""
    python = arguments.get("python")
    if python is None:
        return
    found = shutil.which(str(python)) if os.sep not in str(python) else str(python)
    if not found or os.path.realpath(os.path.abspath(found)) not in allowed:
        raise UsageError(f"argument `python`: {python} is not an interpreter this server allows",
                         f"leave `python` out (the server's own interpreter), or list it in {PYTHONS_ENV} in the "
                         "server's environment (absolute paths, separated by ':')")


def check_arguments(spec: Tool, arguments: Mapping[str, Any]) -> None:
    """UsageError naming the argument when `arguments` do not fit the tool's input schema."""
    import jsonschema  # an MCP SDK dependency: the server has it

    validator = jsonschema.Draft202012Validator(spec.input_schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        raise UsageError(f"{spec.name}: {f'argument `{where}`' if where else 'arguments'}: {error.message}",
                         f"`{spec.name}` takes {', '.join(spec.properties) or 'no arguments'} (tools/list has "
                         "their types)")


def describe(name: str, arguments: Mapping[str, Any]) -> str:
    """`bench` of v7.py: who holds a device, in waiting notes."""
    path = arguments.get("submission")
    what = Path(path).name if isinstance(path, str) else "source text" if arguments.get("source") else ""
    return f"`{name}`" + (f" of {what}" if what else "")


def pinned_gpus(arguments: Mapping[str, Any]) -> list[str]:
    """The GPUs a call names (`device`, or tune's `devices` list "0,1"); none: it may use every GPU."""
    if arguments.get("device") is not None:
        return [str(arguments["device"])]
    return [d for d in str(arguments.get("devices") or "").split(",") if d]


def error_text(doc: Mapping[str, Any]) -> str:
    text = f"error: {doc.get('message', '')}"
    return text + (f"\nhint: {doc['hint']}" if doc.get("hint") else "")


class Calls:
    """The tool calls of one server: validation, device slots, the worker that runs each."""

    def __init__(self, slots: Slots):
        self.slots = slots
        # The worker starts in the folder popkit was imported from, so that `-m` finds this popkit (not one in
        # the working folder), and moves to the server's working folder before the call.
        self.worker = (sys.executable, "-m", "popkit.mcpserver.worker")
        self.worker_cwd = str(Path(popkit.__file__).resolve().parent.parent)
        self.pythons = allowed_pythons()

    async def call(self, name: str, arguments: Mapping[str, Any], say) -> dict[str, Any]:
        """The worker's final message for one call (`done`, `error` or `cancelled`); `say(text)` gets progress."""
        try:
            spec = tool(name)
            check_arguments(spec, arguments)
            check_python(arguments, self.pythons)
            wanted = self.slots.wanted(pinned_gpus(arguments)) if spec.device(arguments) else ()
        except PopkitError as exc:
            return {"error": document(exc)}
        async with self.slots.hold(wanted, describe(name, arguments), say):
            return await self.run_worker(name, arguments, say)

    async def run_worker(self, name: str, arguments: Mapping[str, Any], say) -> dict[str, Any]:
        import anyio
        from anyio.streams.buffered import BufferedByteReceiveStream

        process = await anyio.open_process(list(self.worker), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=None, cwd=self.worker_cwd)
        final: dict[str, Any] | None = None
        request = {"tool": name, "arguments": dict(arguments), "cwd": os.getcwd()}
        try:
            await process.stdin.send((json.dumps(request) + "\n").encode())
            lines = BufferedByteReceiveStream(process.stdout)
            while True:
                try:
                    line = await lines.receive_until(b"\n", MAX_MESSAGE_BYTES)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    break
                message = json.loads(line)
                if "progress" in message:
                    await say(str(message["progress"]))
                else:
                    final = message
            await process.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await stop(process)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await process.stdin.aclose()
                if process.returncode is None:
                    await stop(process)
        if final is None:
            return {"error": internal_error(RuntimeError(
                f"the worker of `{name}` ended with exit code {process.returncode} before answering"))}
        return final


async def stop(process) -> None:
    """Stop a worker as Ctrl-C stops popkit; kill it if it has not unwound within STOP_GRACE_S."""
    import anyio

    if process.returncode is None:
        try:
            process.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
        with anyio.move_on_after(STOP_GRACE_S):
            await process.wait()
    if process.returncode is None:
        process.kill()  # its lifeline closes: every watchdog below it kills its child's tree
        await process.wait()


def tool_result(final: Mapping[str, Any]):
    """The MCP result of a worker's final message."""
    from mcp import types

    if "done" in final:
        doc = final["done"]
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(doc, indent=1))],
                                    structured_content=doc, is_error=False,
                                    _meta={"popkit/exit_code": int(final.get("exit_code", 0))})
    if "cancelled" in final:
        signum = int(final["cancelled"])
        doc = {"schema": "popkit/error/1", "error": "Interrupted",
               "message": f"stopped by {signal.Signals(signum).name}; its child processes were killed and its "
                          "working files removed", "hint": "", "exit_code": 128 + signum}
    else:
        doc = final.get("error") or internal_error(RuntimeError("no answer"))
    return types.CallToolResult(content=[types.TextContent(type="text", text=error_text(doc))],
                                structured_content=doc, is_error=True,
                                _meta={"popkit/exit_code": int(doc.get("exit_code", 70))})


def _require_sdk() -> None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        major = int(version("mcp").split(".")[0])
    except (PackageNotFoundError, ValueError):
        major = 0
    if major < 2:
        found = "is not installed" if major == 0 else f"is version {version('mcp')}"
        raise EnvironmentProblem(f"popkit mcp needs the MCP Python SDK 2 or later, which {found}", INSTALL_HINT)


def build(calls: Calls):
    """The SDK's low-level Server, with popkit's tools."""
    from mcp import types
    from mcp.server.lowlevel import Server

    async def list_tools(_ctx, _params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=t.name, description=t.description,
                                                       input_schema=t.input_schema) for t in TOOLS])

    async def call_tool(ctx, params) -> types.CallToolResult:
        steps = itertools.count(1)

        async def say(text: str) -> None:
            await ctx.session.report_progress(next(steps), None, text)

        return tool_result(await calls.call(params.name, params.arguments or {}, say))

    return Server("popkit", version=__version__, instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool)


def serve() -> None:
    """Serve on stdin/stdout until the client closes stdin (exit 11 without the SDK)."""
    _require_sdk()
    import anyio
    from mcp.server.stdio import stdio_server

    server = build(Calls(Slots(machine_devices())))

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # the workers' stderr reaches the host's log as it comes
    anyio.run(main)
