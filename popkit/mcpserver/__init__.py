"""`popkit mcp`: the MCP server (server.py), its tools (tools.py), device slots (slots.py), the worker per call."""
