"""Tables at 80 columns and in pipes (no terminal): no word is broken inside; --json keeps full values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from tests.test_history import make_report
from tests.test_newcomer import _problem_set

LONG_BOARD = "amd-mixture-of-experts-with-a-very-long-leaderboard-name"


@pytest.fixture
def narrow(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_WIDTH", "80")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    return tmp_path


def _no_broken_words(output: str, headers: tuple[str, ...], long_value: str) -> None:
    lines = output.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    header = next(line for line in lines if headers[0] in line)
    for word in headers:
        assert word in header, (word, header)
    # a value too long for its column is cut with an ellipsis, never folded onto the next line
    assert long_value in output or any(long_value[:6] in line and "…" in line for line in lines)
    assert long_value[-12:] not in output or long_value in output


def test_tasks_table_at_80_columns_in_a_pipe(narrow):
    root = narrow / "set"
    _problem_set(root, LONG_BOARD, "[MI300]")
    result = CliRunner().invoke(app, ["tasks", "--tasks-root", str(root)])
    assert result.exit_code == 0, result.output
    _no_broken_words(result.output, ("task", "leaderboard", "gpus", "ranking", "tests", "benchmarks", "source"),
                     LONG_BOARD)
    doc = json.loads(CliRunner().invoke(app, ["tasks", "--tasks-root", str(root), "--json"]).output)
    assert LONG_BOARD in {t["leaderboard"] for t in doc["tasks"]}  # the full value is in --json


def test_history_table_at_80_columns_in_a_pipe(narrow):
    from popkit import history

    long_path = "/home/someone/projects/kernels/" + "a-very-long-submission-file-name-v7-final.py"
    history.record_run(make_report(submission=long_path), b"x")
    result = CliRunner().invoke(app, ["history"])
    assert result.exit_code == 0, result.output
    table = result.output.split("\n", 1)[1]  # the first line names the ledger
    _no_broken_words(table, ("run", "what", "task", "outcome", "score", "device", "submission"),
                     "a-very-long-submission-file-name-v7-final.py")
    doc = json.loads(CliRunner().invoke(app, ["history", "--json"]).output)
    assert doc["runs"][0]["submission"] == long_path
