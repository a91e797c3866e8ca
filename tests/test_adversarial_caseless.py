"""A case-less `check: pass`: an eval that says pass without a result for every case of the mode must not pass.

Where each is closed: `popkit tasks check` (taskcheck) names such an eval as a bad task and no longer credits
the checker with rejecting probes that never ran; an empty case list is refused by name before any run. The
runs themselves fail such a pass in protocol.judge, with either harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from popkit.author import taskcheck
from popkit.errors import TaskError
from popkit.model.results import CaseResult, ModeRun, RunReport
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor

ATTACKS = Path(__file__).parent / "adversarial"
GOOD = Path(__file__).parent / "fixtures" / "submissions" / "good.py"
NO_PROBE = {"device": "test"}


def _task(tmp_path: Path, eval_name: str, cases: str = "tests:\n  - {size: 1}\n  - {size: 2}\n"
          "benchmarks:\n  - {size: 2}\n  - {size: 3}\n") -> Path:
    """A task whose eval is one of the attack evals, with a reference and a template (for tasks check)."""
    folder = tmp_path / eval_name.removesuffix(".py")
    folder.mkdir()
    (folder / eval_name).write_bytes((ATTACKS / eval_name).read_bytes())
    (folder / "reference.py").write_text("def ref_kernel(data):\n    return data\n\n\n"
                                         "def generate_input(size, seed=0):\n    return size\n")
    (folder / "template.py").write_text("def custom_kernel(data):\n    return data\n")
    (folder / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n"
        f"  - {{name: eval.py, source: {eval_name}}}\n  - {{name: reference.py, source: reference.py}}\n"
        "lang: py\ndescription: d\nconfig: {main: eval.py}\nranking_by: geom\n" + cases)
    return folder


def _run(folder: Path, mode: str):
    return runner.run_submission(load_task(folder), GOOD, mode, runner.RunOptions(precompile=False),
                                 system=NO_PROBE)


# ----------------------------------------------------------------------------- popkit tasks check


@pytest.mark.parametrize("eval_name, errors", [
    # the chain stops at the first mode the runner fails, as it does for a submission
    ("caseless_wrong_kind_eval.py", [
        "test: the eval wrote `check: pass` with 1 test result(s) for its 2 case(s): a pass no case result backs"]),
    ("caseless_partial_eval.py", [
        "test: the eval wrote `check: pass` with 1 test result(s) for its 2 case(s): a pass no case result backs"]),
])
def test_tasks_check_names_an_eval_whose_pass_no_case_result_backs(tmp_path, eval_name, errors):
    result = taskcheck.check_task_dir(_task(tmp_path, eval_name))
    assert result.errors == errors and not result.ok
    assert set(result.lax.values()) == {"not run: the reference's own runs have problems (above)"}


def test_tasks_check_does_not_credit_a_checker_that_never_ran(tmp_path):
    """An eval writing only `check: pass`: the reference fails by name, and the probes, which fail the same
    way, are not reported as the checker rejecting them."""
    result = taskcheck.check_task_dir(_task(tmp_path, "only_check_eval.py"))
    assert [(m.mode, m.outcome) for m in result.modes] == [("test", "failed")]
    assert "wrote `check: pass` but no case results for its 2 case(s)" in result.modes[0].summary
    assert "rejected" not in result.lax.values() and not result.ok


def test_a_probe_counts_as_rejected_only_when_a_case_failed():
    failed_case = ModeRun(mode="test", secret=False, seed=None, exit_code=112, duration_s=0.1,
                                 timeout_s=1.0, check="fail", outcome="failed", summary="check failed: test 1",
                                 tests=(CaseResult(kind="test", index=0, spec="s", passed=False),))
    no_case = ModeRun(mode="test", secret=False, seed=None, exit_code=0, duration_s=0.1, timeout_s=1.0,
                             check="pass", outcome="failed", summary="check failed: test wrote `check: pass` but no"
                             " case results for its 2 case(s)")

    def report(run):
        return RunReport(task="t", task_path="/t", leaderboard=None, ranking_by="geom", submission="<p>",
                                sha256="0" * 64, mode="test", harness="task", started_at="", duration_s=0.1,
                                system={}, runs=(run,))

    assert taskcheck._probe_verdict(report(failed_case)) == "rejected"
    assert taskcheck._probe_verdict(report(no_case)) == ("did not run (check failed: test wrote `check: pass` but"
                                                         " no case results for its 2 case(s))")


# ---------------------------------------------------------------------------------- an empty case list


@pytest.mark.parametrize("cases, mode, message", [
    ("tests: []\nbenchmarks:\n  - {size: 2}\n", "test", "no `tests` to run"),
    ("tests:\n  - {size: 1}\nbenchmarks: []\n", "benchmark", "no `benchmarks` to run in benchmark mode"),
    ("tests:\n  - {size: 1}\n", "leaderboard", "no `benchmarks` to run in leaderboard mode"),
])
def test_an_empty_case_list_is_refused_by_name_before_any_run(tmp_path, cases, mode, message):
    folder = _task(tmp_path, "only_check_eval.py", cases)
    with pytest.raises(TaskError) as info:
        _run(folder, mode)
    assert info.value.message == f"{folder / 'task.yml'}: {message}" and info.value.exit_code == 3


# ---------------------------------------------------------------------------------- the runs (the lead's)


@pytest.mark.parametrize("eval_name, mode", [("caseless_wrong_kind_eval.py", "benchmark"),
                                             ("caseless_wrong_kind_eval.py", "test"),
                                             ("caseless_partial_eval.py", "test"),
                                             ("caseless_partial_eval.py", "benchmark")])
def test_a_run_whose_pass_no_case_result_backs_fails_by_name(tmp_path, eval_name, mode):
    run = _run(_task(tmp_path, eval_name), mode).runs[0]
    assert run.outcome == "failed"
    assert "result(s) for its 2 case(s): a pass no case result backs" in run.summary  # e.g. "wrote `check: pass` with 1 test result(s) for its 2 case(s)"


def test_run_mode_given_no_cases_does_not_pass(tmp_path):
    folder = _task(tmp_path, "only_check_eval.py")
    task = load_task(folder)
    ws = Executor().new_workspace(tmp_path / "work")
    main = ws.prepare(task, GOOD.read_bytes())
    run = runner.run_mode(ws, main, "test", [], timeout_s=20, options=runner.RunOptions())
    assert run.outcome == "failed"
