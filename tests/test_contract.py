"""The functions a submission must define come from the task's own eval, not from popkit."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from popkit.errors import SubmissionError
from popkit.model import contract
from popkit.model.tasks import load_task, resolve_task
from popkit.run import protocol
from popkit.run import runner
from popkit.submission import source

FIX = Path(__file__).parent / "fixtures"
PAIR = FIX / "tasks" / "pair"
NO_PROBE = {"device": "cpu"}


def _task_with_eval(tmp_path: Path, eval_source: str):
    (tmp_path / "eval.py").write_text(textwrap.dedent(eval_source))
    (tmp_path / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n  - {name: eval.py, source: eval.py}\n"
        "lang: py\ndescription: x\nconfig: {main: eval.py}\ntests:\n  - {size: 1}\n")
    return load_task(tmp_path)


@pytest.mark.parametrize("source, expected", [
    ("from submission import custom_kernel\n", ("custom_kernel",)),
    ("def f():\n    from submission import forward, backward as bw\n", ("forward", "backward")),
    ("import submission as sub\nsub.run(1)\nprint(getattr(sub, 'setup'))\n", ("run", "setup")),
    # optional names (a default, or a positive hasattr test) are not required
    ("import submission as s\nif hasattr(s, 'warm'):\n    s.warm()\ns.go()\ngetattr(s, 'cfg', None)\n", ("go",)),
    # the princeton shape: a loop over names, checked with hasattr
    ("def load():\n    import submission\n    for n in ('fwd', 'bwd'):\n"
     "        if not hasattr(submission, n):\n            raise AttributeError(n)\n",
     ("fwd", "bwd")),
    # an eval popkit cannot read statically: no names, so nothing is refused before the run
    ("import importlib\nm = importlib.import_module('submission')\n", ()),
])
def test_entry_points_are_read_from_the_eval(tmp_path, source, expected):
    assert contract.entry_points(_task_with_eval(tmp_path, source)) == expected


def test_popkits_own_harness_needs_custom_kernel():
    assert contract.entry_points(load_task(PAIR), harness="popkit") == ("custom_kernel",)
    assert contract.entry_points(resolve_task("vectoradd")) == ("custom_kernel",)  # bundled: popkit's eval


def test_a_task_whose_contract_is_not_custom_kernel_runs(tmp_path):
    task = load_task(PAIR)
    assert contract.entry_points(task) == ("forward", "backward")
    report = runner.run_submission(task, PAIR / "template.py", "benchmark", runner.RunOptions(), system=NO_PROBE)
    assert report.outcome == "passed", report.runs[-1].summary if report.runs else report


def test_a_missing_entry_point_is_named_before_the_run(tmp_path):
    half = tmp_path / "half.py"
    half.write_text("def forward(x):\n    return 2 * x\n")
    with pytest.raises(SubmissionError, match=r"half.py: no `backward` defined at module level") as exc:
        runner.run_submission(load_task(PAIR), half, "test", runner.RunOptions(precompile=False), system=NO_PROBE)
    assert "forward, backward" in exc.value.hint


def test_read_submission_without_a_task_checks_no_names():
    assert source.read_submission(PAIR / "template.py", entry_points=None).startswith(b"def forward")


def test_a_runtime_import_failure_names_the_missing_function():
    stderr = "ImportError: cannot import name 'forward' from 'submission' (/tmp/x/submission.py)"
    run = runner.ModeRun(mode="test", secret=False, seed=None, exit_code=1, duration_s=0.1, timeout_s=1,
                         timed_out=False, check=None, stderr=stderr)
    assert protocol.classify(run) == ("bad_submission",
                                    "bad submission: no `forward` could be imported from the submission")
