"""The run session (runner.RunSession): one prepared run that run_submission, the A/B, the warm worker, tune, risk
and the cluster worker share, and the rule that keeps them from assembling the runner's parts again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from popkit.model.results import CaseResult, ModeRun
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
TASK_DIR = FIXTURES / "tasks" / "double"
GOOD = FIXTURES / "submissions" / "good.py"
OPTIONS = runner.RunOptions(precompile=False)  # no pre-step: nothing but the fake evals below "runs"
SYSTEM = {"device": "cpu", "torch": "2.14.1"}  # skips the environment probe (a torch import)

# ------------------------------------------------------------------------------------ who uses it

# The modules that run submissions through a session, and what each may take from popkit.run: the session's public
# names from runner, types, and (the warm worker only) the protocol of its own start. Workspaces, pre-steps,
# run_mode, decode_mode, the tamper check, the probe and the report are the session's business.
SESSION_NAMES = {"RunSession", "RunOptions", "run_submission", "child_env", "is_popkit_harness",
                 "PRECOMPILE_TIMEOUT_S"}
TYPES = {"executor": {"Executor", "Workspace"}}
USERS = {
    "popkit/measure/ab.py": {"warm": {"Ahead", "WarmPair", "ahead_depth", "cold_reason"}},  # its evals' warm pairs
    "popkit/measure/abrounds.py": {},
    "popkit/tuning/race.py": {},
    "popkit/tuning/probe.py": {},
    "popkit/tuning/workflow.py": {"proc": {"WorkDir"}, "sandbox": {"executor_for", "probe"},
                                  "warm": {"refuse_unfit", "Ahead"}},  # tune's scratch, the sizing's, the race's pairs
    # the race's evals through warm pairs, started as the watch starts them
    "popkit/tuning/ahead.py": {"sandbox": {"executor_for"},
                               "warm": {"WarmPair", "Ahead", "ahead_depth", "cold_reason"}},
    "popkit/distributed/worker.py": {"sandbox": {"scripts_for"}},  # parity facts, before any session
    "popkit/operations/risk.py": {"protocol": {"secret_case_seed"}},  # the seeds its plan draws, as the runner does
    "popkit/operations/watch.py": {"sandbox": {"executor_for"}, "warm": {"WarmPair", "harness_for", "unfit_reason"}},
    # The warm pair's start is its own handshake (a control descriptor, `go`): the protocol's and proc's names.
    "popkit/run/warm.py": {"protocol": "*", "proc": {"Finished"}, "beside": {"LiveProgress"}},
}


def run_names_used(path: Path) -> set[tuple[str, str]]:
    """(module, name) for every name the file takes from a popkit.run module, imported or read as an attribute."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}  # local name -> popkit.run module
    used: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "popkit.run":
            bound.update({(a.asname or a.name): a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("popkit.run."):
            used.update((node.module.split(".")[2], a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("popkit.run."):
                    raise AssertionError(f"{path}: `import {a.name}`; use `from popkit.run import ...`")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            used.add((bound[node.value.id], node.attr))
    return used


def allowed(module: str, name: str, extra: dict) -> bool:
    if module == "runner":
        return name in SESSION_NAMES
    names = extra.get(module, set()) | TYPES.get(module, set()) if extra.get(module) != "*" else "*"
    return names == "*" or name in names


@pytest.mark.parametrize("rel", sorted(USERS))
def test_the_session_users_take_only_its_public_names_from_the_run_package(rel):
    extra = USERS[rel]
    wrong = sorted(f"{m}.{n}" for m, n in run_names_used(ROOT / rel) if not allowed(m, n, extra))
    assert not wrong, f"{rel} assembles the runner's parts ({', '.join(wrong)}): use runner.RunSession"


def test_the_rule_sees_an_assembly_in_both_spellings(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from popkit.run import runner\nfrom popkit.run.runner import set_up\n"
                   "from popkit.run import sandbox\nrunner.run_mode(1)\nsandbox.executor_for('auto')\n")
    found = {f"{m}.{n}" for m, n in run_names_used(bad) if not allowed(m, n, {})}
    assert found == {"runner.set_up", "runner.run_mode", "sandbox.executor_for"}


# ------------------------------------------------------------------------------------ what it does


class Evals:
    """Stands in for runner.run_mode: records where each eval ran; `fail` names the modes that fail."""

    def __init__(self, fail=()):
        self.calls: list[tuple[str, str, str, int | None, str | None]] = []
        self.fail = set(fail)

    def __call__(self, workspace, main, mode, cases, *, timeout_s, options, seed=None, gpu_count=None,
                 cases_name=None, progress=None, label=""):
        self.calls.append((Path(workspace.root).name, main, mode, seed, cases_name))
        ok = mode not in self.fail
        kind = "test" if mode == "test" else "benchmark"
        found = tuple(CaseResult(kind=kind, index=i, spec="x", passed=ok) for i in range(len(cases)))
        return ModeRun(mode=mode, secret=seed is not None, seed=seed, exit_code=0 if ok else 112, duration_s=0.1,
                       timeout_s=timeout_s, check="pass" if ok else "fail", tests=found if kind == "test" else (),
                       benchmarks=found if kind == "benchmark" else (), outcome="passed" if ok else "failed")


def test_the_chain_then_each_secret_seed_while_they_pass_and_the_report_names_them():
    evals = Evals()
    options = runner.RunOptions(precompile=False, secret_seeds=(7, 9))
    session = runner.RunSession(load_task(TASK_DIR), GOOD, "leaderboard", options, system=SYSTEM,
                                executor=Executor(), run_eval=evals)
    with session:
        runs = session.chains()
    assert [(c[2], c[3]) for c in evals.calls] == [
        ("test", None), ("benchmark", None), ("leaderboard", None),
        ("test", 7), ("benchmark", 7), ("leaderboard", 7), ("test", 9), ("benchmark", 9), ("leaderboard", 9)]
    report = session.report(runs)
    assert report.secret_seeds == (7, 9) and report.outcome == "passed" and report.submission == str(GOOD)
    assert not Path(session.workspace.root).exists()  # removed at the end of the block


def test_a_failed_mode_ends_the_chain_and_no_secret_chain_runs():
    evals = Evals(fail={"benchmark"})
    options = runner.RunOptions(precompile=False, secret_seeds=(7,))
    with runner.RunSession(load_task(TASK_DIR), GOOD, "leaderboard", options, system=SYSTEM, executor=Executor(),
                           run_eval=evals) as session:
        runs = session.chains()
    assert [r.mode for r in runs] == ["test", "benchmark"] and [c[3] for c in evals.calls] == [None, None]


def test_an_ab_session_gives_each_side_its_workspace_and_names_the_side_that_tampered():
    evals = Evals()
    task = load_task(TASK_DIR)
    sides = {"A": GOOD, "B": GOOD}
    with runner.RunSession(task, sides, "benchmark", OPTIONS, system=SYSTEM, executor=Executor(),
                           run_eval=evals) as session:
        a, b = session.sides["A"].workspace, session.sides["B"].workspace
        assert a.root.parent == b.root.parent and a.root != b.root  # one folder, one workspace per side
        assert session.run("benchmark", side="A", live=False).outcome == "passed"
        (b.files / "eval.py").write_text("# changed by the submission\n")  # as a submission could, mid-eval
        run = session.run("benchmark", side="B", cases_name="ab-0.txt", live=False)
        assert run.outcome == "failed" and "during the benchmark mode of side B" in run.summary
        assert session.run("benchmark", side="B", live=False).outcome == "passed"  # put right after the line
    assert [c[0] for c in evals.calls] == ["A", "B", "B"] and evals.calls[1][4] == "ab-0.txt"
    assert not a.root.parent.exists()


def test_bytes_given_are_checked_as_a_run_checks_them_unless_the_caller_did(tmp_path):
    from popkit.errors import PopkitError

    task = load_task(TASK_DIR)
    with pytest.raises(PopkitError):
        runner.RunSession(task, tmp_path / "mine.py", "test", OPTIONS, content=b"def nothing(): pass\n")
    session = runner.RunSession(task, tmp_path / "mine.py", "test", OPTIONS, content=b"x = 1\n", check=False)
    assert session.side.data == b"x = 1\n"
