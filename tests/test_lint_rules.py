"""The `popkit check` rule registry (popkit.check.rules): the one table of every rule the linter can emit.

Every rule's fixture triggers exactly that rule; every id the lint modules write is in the table and
every entry is written somewhere; an id or severity outside the table is refused at run time; README
holds the table as `rules_markdown()` writes it; `popkit check --rules` prints it.
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

import popkit
from popkit.check import lint
from popkit.check import rules as lint_rules
from popkit.check.rules import BY_ID, RULES, Rule
from popkit.cli import app

PACKAGE = Path(popkit.__file__).resolve().parent
CHECK_DOC = (PACKAGE.parent / "docs" / "check.md").read_text()
LINT_MODULES = sorted((PACKAGE / "check").glob("*.py"))
CLI_ENV = {"POPKIT_WIDTH": "200", "NO_COLOR": "1"}


def _fake_guard(monkeypatch, verdict):
    module = types.ModuleType("kernelguard")
    module.analyze_code = lambda code, metadata, compute_structural_hash=False: verdict
    monkeypatch.setitem(sys.modules, "kernelguard", module)


def _absent_guard(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernelguard", None)  # `import kernelguard` raises ImportError
    monkeypatch.setattr(lint.shutil, "which", lambda name: None)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_fixture_triggers_exactly_its_rule(rule: Rule, monkeypatch):
    fixture = rule.fixture
    if fixture.guard is not None:
        _fake_guard(monkeypatch, fixture.guard)
    report = lint.check_bytes(fixture.content(), fixture.name, guard=fixture.guard is not None,
                              **dict(fixture.options))
    assert {f.rule for f in report.findings} == {rule.id}, report.findings
    assert report.findings[0].severity == rule.severities[0]
    assert all(f.message for f in report.findings)


def test_ids_are_unique_and_every_entry_is_whole():
    assert len(BY_ID) == len(RULES)
    for rule in RULES:
        assert rule.id and rule.summary and rule.doc and rule.severities
        assert set(rule.severities) <= {"error", "warning"}
        assert "|" not in rule.summary + rule.doc  # a markdown table cell


def _written_ids() -> dict[str, str]:
    """Every rule id the lint modules pass to finding() or a visitor's add(), with where; a non-literal id
    is allowed only where a finding of code run from a string is re-added under its own id."""
    found = {}
    for path in LINT_MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            visitor = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in ("self", "v")
            if name not in ("finding", "_diagnostic") and not (name == "add" and visitor):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found[first.value] = f"{path.name}:{node.lineno}"
            else:
                assert ast.unparse(first) in ("rule", "inner.rule"), f"{path.name}:{node.lineno}: a rule id built at run time"
    return found


def test_every_id_the_linter_writes_is_in_the_table_and_every_entry_is_written():
    written = _written_ids()
    assert set(written) - set(BY_ID) == set(), "ids missing from popkit.check.rules.RULES"
    assert set(BY_ID) - set(written) == set(), "table entries no lint module writes"


def test_an_id_or_severity_outside_the_table_is_refused():
    with pytest.raises(ValueError, match="rule `no-such-rule` is not in"):
        lint_rules.finding("no-such-rule", "error", 1, 1, "m")
    with pytest.raises(ValueError, match="rule `bom` has no severity `error`"):
        lint_rules.finding("bom", "error", 1, 1, "m")


def test_readme_holds_the_table_as_the_registry_writes_it():
    assert lint_rules.rules_markdown() in CHECK_DOC, "docs/check.md: paste rules_markdown() again"
    for rule in RULES:
        assert f"| `{rule.id}` |" in CHECK_DOC


def test_check_rules_prints_the_table():
    result = CliRunner().invoke(app, ["check", "--rules"], env=CLI_ENV)
    assert result.exit_code == 0, result.output
    for rule in RULES:
        assert f"│ {rule.id} " in result.output
    assert f"{len(RULES)} rules; errors block a submission (exit 8), warnings inform." in result.output
    assert CliRunner().invoke(app, ["check", "--list-rules"], env=CLI_ENV).output == result.output


def test_check_rules_json_has_every_rule_with_its_fixture():
    result = CliRunner().invoke(app, ["check", "--rules", "--json"], env=CLI_ENV)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/rules/1"
    assert [r["id"] for r in doc["rules"]] == [r.id for r in RULES]
    size = next(r for r in doc["rules"] if r["id"] == "size")
    assert size["severities"] == ["error"] and size["fixture"]["pad_to"] == lint_rules.MAX_BYTES + 1
    utf8 = next(r for r in doc["rules"] if r["id"] == "utf8")
    assert utf8["fixture"]["text"] is None and bytes.fromhex(utf8["fixture"]["bytes"]) == BY_ID["utf8"].fixture.data


def test_check_without_a_file_is_a_usage_error():
    result = CliRunner().invoke(app, ["check"], env=CLI_ENV)
    assert result.exit_code == 2
    assert "error: missing the submission file to check" in result.output
    assert "popkit check FILE (or `popkit check --rules`)" in result.output


def test_check_suggests_the_extra_when_kernelguard_is_absent(tmp_path, monkeypatch):
    _absent_guard(monkeypatch)
    path = tmp_path / "v7.py"
    path.write_text("def custom_kernel(data):\n    return data\n")
    result = CliRunner().invoke(app, ["check", str(path)], env=CLI_ENV)
    assert result.exit_code == 0, result.output
    assert "KernelGuard: not installed (`pip install 'popkit[guard]'` to run the server's screening here too)" \
        in result.output
    assert "pip install kernelguard" not in result.output
    assert "pip install 'popkit[guard]'" in CHECK_DOC and "pip install kernelguard" not in CHECK_DOC
