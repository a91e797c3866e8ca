"""For agents the sealed harness is the default: popkit.api's runs, the MCP tools and `popkit tune` judge with
popkit's harness unless told `task`; the CLI's `test` and `bench` keep the task's own eval. A task popkit's
harness cannot judge is refused by name, never run with its own eval in silence; a report says who judged."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit import api
from popkit.cli import app
from popkit.errors import ExitCode, UsageError
from popkit.mcpserver import tools, worker
from popkit.views.comparison import show_ab

FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")  # its own eval, no reference.py
MULTI = str(FIX / "tasks" / "multi")  # cases at world_size 2
PAIR = str(FIX / "tasks" / "pair")  # its eval takes forward and backward
GOOD = str(FIX / "submissions" / "good.py")
NO_REFERENCE = "popkit's harness cannot judge double: it has no reference.py, which popkit's harness imports"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("call", [
    lambda tmp: api.test(GOOD, task=DOUBLE, record=False),
    lambda tmp: api.bench(GOOD, task=DOUBLE, record=False),
    lambda tmp: api.bench(GOOD, GOOD, task=DOUBLE, rounds=4, record=False),  # an A/B
    lambda tmp: api.tune(GOOD, tmp / "out.py", task=DOUBLE, record=False),
    lambda tmp: api.submit(GOOD, gate="test", dry_run=True, task=DOUBLE, gpu="H100", leaderboard="double",
                           guard=False),  # an agent's gate
], ids=["test", "bench", "ab", "tune", "submit-gate"])
def test_the_api_judges_with_popkits_harness_unless_told_and_names_a_task_it_cannot(call, tmp_path):
    with pytest.raises(UsageError) as refused:
        call(tmp_path)
    assert refused.value.message == NO_REFERENCE and refused.value.exit_code == ExitCode.USAGE
    assert 'harness="task"' in refused.value.hint and "--harness task" in refused.value.hint
    assert not (tmp_path / "out.py").exists()


def test_the_reason_is_the_tasks_own(tmp_path):
    with pytest.raises(UsageError, match="cannot judge multi: its cases run on several GPUs"):
        api.test(GOOD, task=MULTI, record=False)
    with pytest.raises(UsageError, match="cannot judge pair: its eval takes forward, backward from the submission"):
        api.test(GOOD, task=PAIR, record=False)


def test_the_api_runs_the_tasks_own_eval_when_told_and_says_it_judged_in_the_open(tmp_path, capsys, monkeypatch):
    doc = api.document(api.test(GOOD, task=DOUBLE, harness="task", record=False))
    assert doc["outcome"] == "passed" and (doc["harness"], doc["judged"]) == ("task", "open")
    other = tmp_path / "other.py"
    other.write_bytes(Path(GOOD).read_bytes() + b"# B\n")
    outcome = api.bench(GOOD, other, task=DOUBLE, harness="task", rounds=4, budget_s=0, record=False)
    ab = api.document(outcome)
    assert ab["schema"].startswith("popkit/ab/") and (ab["harness"], ab["judged"]) == ("task", "open")
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    show_ab(outcome.report)
    assert "· harness task (open)" in capsys.readouterr().out


def _mcp(tool: str, arguments: dict) -> dict:
    """The document an MCP call's worker sends back (a result, or the popkit/error/1 document)."""
    out = io.StringIO()
    assert worker.serve_one({"tool": tool, "arguments": arguments}, worker.Reporter(out)) == 0
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if '"done"' in x or '"error"' in x]
    return line.get("done") or line.get("error")


def test_mcp_tools_judge_with_popkits_harness_by_default():
    for name in ("test", "bench", "tune"):
        assert tools.tool(name).input_schema["properties"]["harness"]["default"] == "popkit"
    doc = _mcp("test", {"submission": GOOD, "task": DOUBLE, "history": False})
    assert doc["schema"] == "popkit/error/1" and doc["message"] == NO_REFERENCE and doc["exit_code"] == 2, doc
    doc = _mcp("test", {"submission": GOOD, "task": DOUBLE, "harness": "task", "history": False})
    assert doc["outcome"] == "passed" and (doc["harness"], doc["judged"]) == ("task", "open"), doc


def test_the_cli_keeps_the_tasks_own_eval_for_test_and_bench():
    for command in ("test", "bench"):
        result = CliRunner().invoke(app, [command, GOOD, "--task", DOUBLE, "--no-history", "--json"])
        doc = json.loads(result.stdout)
        assert result.exit_code == 0 and (doc["harness"], doc["judged"]) == ("task", "open"), result.output
    result = CliRunner().invoke(app, ["test", GOOD, "--task", DOUBLE, "--harness", "popkit", "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["message"] == NO_REFERENCE


def test_cli_tune_judges_with_popkits_harness_by_default(tmp_path):
    result = CliRunner().invoke(app, ["tune", GOOD, "-o", str(tmp_path / "out.py"), "--task", DOUBLE, "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["message"] == NO_REFERENCE, result.output
    assert not (tmp_path / "out.py").exists()


def test_an_agents_gate_runs_the_tasks_own_eval_only_when_told_and_says_so():
    result = api.submit(GOOD, gate="test", dry_run=True, task=DOUBLE, gpu="H100", leaderboard="double", guard=False,
                        harness="task")
    gate = api.document(result)["gate"]
    assert (gate["outcome"], gate["harness"], gate["judged"]) == ("passed", "task", "open")
