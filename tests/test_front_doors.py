"""One request through the three front doors (the CLI, popkit.api and an MCP tool call) gives one document:
each builds its options with popkit.operations.requests and hands them to requests.dispatch."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit import api
from popkit.cli import app
from popkit.documents import document
from popkit.mcpserver import worker
from popkit.operations import requests

FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")
GOOD = str(FIX / "submissions" / "good.py")


def essentials(doc: dict) -> dict:
    """What a run's document says, without what differs from one run to the next (times, folders, seeds)."""
    return {"schema": doc["schema"], "outcome": doc["outcome"], "exit_code": doc["exit_code"], "task": doc["task"],
            "sha256": doc["sha256"], "mode": doc["mode"], "harness": doc["harness"],
            "runs": [{"mode": r["mode"], "outcome": r["outcome"],
                      "cases": [(c.get("spec"), c.get("passed")) for c in r["tests"] + r["benchmarks"]]}
                     for r in doc["runs"]]}


def test_one_request_through_the_cli_the_api_and_mcp_gives_one_document(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    cli = CliRunner().invoke(app, ["test", GOOD, "--task", DOUBLE, "--no-history", "--json"])
    from_cli = json.loads(cli.stdout)
    from_api = document(api.test(GOOD, task=DOUBLE, harness="task", record=False))  # the CLI's default
    out = io.StringIO()
    arguments = {"submission": GOOD, "task": DOUBLE, "harness": "task", "history": False}
    code = worker.serve_one({"tool": "test", "arguments": arguments}, worker.Reporter(out))
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if '"done"' in x]
    from_mcp = line["done"]
    assert cli.exit_code == code == 0
    assert essentials(from_cli) == essentials(from_api) == essentials(from_mcp)
    assert essentials(from_cli)["outcome"] == "passed" and essentials(from_cli)["runs"][0]["cases"]


def test_the_options_are_checked_in_one_place():
    with pytest.raises(Exception) as bad_harness:
        requests.run_options(harness="nope")
    assert "unknown harness `nope`" in str(bad_harness.value)
    with pytest.raises(Exception) as bad_python:
        requests.run_options(python="/no/such/python")
    assert "--python /no/such/python: no such interpreter" in str(bad_python.value)
    with pytest.raises(Exception) as bad_seed:
        requests.run_options(seeds=(-1,))
    assert "secret_seeds" in str(bad_seed.value)
    assert requests.run_options(require_isolation=True).isolation == "require"


def test_the_cli_and_the_api_refuse_a_bad_harness_with_one_message(tmp_path):
    cli = CliRunner().invoke(app, ["test", GOOD, "--task", DOUBLE, "--harness", "nope", "--json"])
    with pytest.raises(Exception) as from_api:
        api.test(GOOD, task=DOUBLE, harness="nope", record=False)
    assert cli.exit_code == 2 and json.loads(cli.stdout)["message"] == from_api.value.message
