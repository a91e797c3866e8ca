"""popkit command for agent hosts: mcp."""

from __future__ import annotations

from popkit.cli.app import app
from popkit.mcpserver import server


@app.command()
def mcp() -> None:
    """Serve popkit's commands as MCP tools over stdio, for agent hosts (Claude Code, Cursor, the MCP SDK).

    Each tool returns the JSON document of its command's --json; test, bench and compile report
    progress and can be cancelled. Needs the MCP SDK: pip install 'popkit[mcp]' (exit 11 without it).

    Example: claude mcp add popkit -- popkit mcp
    """
    server.serve()
