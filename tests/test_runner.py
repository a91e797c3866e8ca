"""The runner against small fixture tasks whose own eval speaks the protocol (not popkit's harness)."""

from __future__ import annotations

import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

from popkit.errors import SubmissionError, TaskError
from popkit.measure import ab
from popkit.model.results import RunReport, score_s
from popkit.model.tasks import load_task
from popkit.run import proc
from popkit.run import protocol
from popkit.run import runner
from popkit.run.executor import POPKIT_EVAL_NAME, Executor
from popkit.submission import source

FIX = Path(__file__).parent / "fixtures"
TASKS, SUBS = FIX / "tasks", FIX / "submissions"
NO_PROBE = {"device": "test"}  # skip the system probe: these runs need no torch


def run(task: str, sub: str, mode: str, **opts) -> RunReport:
    return runner.run_submission(load_task(TASKS / task), SUBS / sub, mode, runner.RunOptions(**opts),
                                 system=NO_PROBE)


# ------------------------------------------------------------------------------ pure pieces


def test_cases_file_keeps_yaml_order_and_python_literals():
    text = protocol.render_cases([{"size": 127, "seed": 4242}, {"flag": True, "off": False, "dims": [1, 2], "x": 0.5}])
    assert text == "size: 127; seed: 4242\nflag: True; off: False; dims: [1, 2]; x: 0.5\n"


def test_ranking_last_gets_only_the_last_benchmark():
    task = load_task(TASKS / "lastonly")
    assert task.cases_for("benchmark") == [{"size": 40, "seed": 5}]
    assert task.cases_for("leaderboard") == [{"size": 40, "seed": 5}]
    assert len(task.cases_for("test")) == 2
    assert len(load_task(TASKS / "double").cases_for("leaderboard")) == 3


def test_pipe_parser_splits_at_first_colon_and_later_keys_win():
    raw = protocol.parse_pipe("a: 1\nmsg: x: y: z\na: 2\nnot a key line\n  spaced  :  v  \n")
    assert raw == {"a": "2", "msg": "x: y: z", "spaced": "v"}


def test_secret_seed_combination_is_the_cantor_pairing():
    assert protocol.secret_case_seed(4242, 0) == 4242 + 4242 * 4243 // 2
    assert protocol.secret_case_seed(1, 2) == 1 + 3 * 4 // 2


@pytest.mark.parametrize("ranking,expected", [
    ("last", 3e-6), ("mean", 2e-6), ("geom", (1e-6 * 2e-6 * 3e-6) ** (1 / 3)),
])
def test_score_by_ranking(ranking, expected):
    assert math.isclose(score_s([1000.0, 2000.0, 3000.0], ranking), expected, rel_tol=1e-12)


def test_workdir_flattens_relative_sources_and_renames_the_submission(tmp_path):
    task = load_task(TASKS / "double")
    main = Executor().new_workspace(tmp_path).prepare(task, b"def custom_kernel(d):\n    return 2 * d\n")
    assert main == "eval.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.py", "submission.py"]
    assert (tmp_path / "eval.py").read_text() == (TASKS / "common" / "tiny_eval.py").read_text()


def test_popkit_harness_replaces_the_eval(tmp_path):
    task = load_task(TASKS / "double")
    main = Executor().new_workspace(tmp_path).prepare(task, b"x", harness="popkit")
    assert main == POPKIT_EVAL_NAME
    assert (tmp_path / "eval.py").exists() and (tmp_path / main).exists()


# ------------------------------------------------------------------------------ submissions


def test_read_submission_checks(tmp_path):
    with pytest.raises(SubmissionError, match="no such file"):
        source.read_submission(tmp_path / "missing.py")
    with pytest.raises(SubmissionError, match="a folder, not a file"):
        source.read_submission(tmp_path)
    with pytest.raises(SubmissionError, match="/dev/null: not a regular file"):
        source.read_submission(Path("/dev/null"))
    with pytest.raises(SubmissionError, match=r"syntax.py:1:\d+: syntax error"):
        source.read_submission(SUBS / "syntax.py")
    with pytest.raises(SubmissionError, match="no `custom_kernel` defined"):
        source.read_submission(SUBS / "noentry.py")
    guarded = tmp_path / "guarded.py"
    guarded.write_text("try:\n    import torch\nexcept ImportError:\n    pass\nelse:\n    def custom_kernel(d):\n        return d\n")
    assert source.read_submission(guarded).startswith(b"try:")
    bom = tmp_path / "bom.py"  # Python runs a file that starts with a UTF-8 byte-order mark
    bom.write_bytes(b"\xef\xbb\xbfdef custom_kernel(d):\n    return d\n")
    assert source.read_submission(bom).startswith(b"\xef\xbb\xbf")
    five = tmp_path / "five.py"
    five.write_text("import torch\n\ncustom_kernel = 5\n")
    with pytest.raises(SubmissionError) as info:
        source.read_submission(five)
    assert info.value.message == f"{five}: custom_kernel is not a function (it is bound to an int at line 3)"
    assert info.value.exit_code == 4
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# caf\xe9\ndef custom_kernel(d): return d\n")
    with pytest.raises(SubmissionError, match="not UTF-8"):
        source.read_submission(latin)


def test_user_file_is_never_modified():
    before = (SUBS / "good.py").read_bytes(), os.stat(SUBS / "good.py").st_mtime_ns
    run("double", "good.py", "test")
    assert ((SUBS / "good.py").read_bytes(), os.stat(SUBS / "good.py").st_mtime_ns) == before


# ------------------------------------------------------------------------------ protocol runs


def test_leaderboard_chain_public_then_secret_with_scores():
    report = run("double", "good.py", "leaderboard", secret_seeds=(7, 11))
    assert [(r.mode, r.seed) for r in report.runs] == [
        ("test", None), ("benchmark", None), ("leaderboard", None),
        ("test", 7), ("benchmark", 7), ("leaderboard", 7),
        ("test", 11), ("benchmark", 11), ("leaderboard", 11),
    ]
    assert report.outcome == "passed" and report.exit_code == 0
    assert math.isclose(report.score_public_s, (10e-6 * 20e-6 * 40e-6) ** (1 / 3))
    assert report.scores_secret_s == (report.score_public_s, report.score_public_s)
    bench = report.runs[1].benchmarks[0]
    assert (bench.runs, bench.mean_ns, bench.samples_ns) == (10, 10000.0, (9995.0, 10000.0, 10005.0))
    assert RunReport.from_json(report.to_json()) == report


def test_secret_seed_reaches_only_the_secret_evals():
    report = run("double", "good.py", "leaderboard", secret_seeds=(99,), keep_workdir=False)
    seen = [(r.secret, r.raw["env.seed"]) for r in report.runs]
    assert seen == [(False, "none")] * 3 + [(True, "99")] * 3
    assert report.precompile.ok and "-DTORCH_EXTENSION_NAME" in report.precompile.log


def test_precompile_sees_seed_one(tmp_path, monkeypatch):
    monkeypatch.setenv("POPCORN_SEED", "12345")  # must not leak from popkit's own environment
    task = load_task(TASKS / "double")
    ws = Executor().new_workspace(tmp_path)
    ws.prepare(task, (SUBS / "good.py").read_bytes())
    step = runner.precompile(ws, runner.RunOptions())
    assert step.ok
    assert (tmp_path / "precompile-seen.txt").read_text() == "1"
    public = runner.run_mode(ws, "eval.py", "test", task.tests, timeout_s=20, options=runner.RunOptions())
    assert public.raw["env.seed"] == "none"


def test_chain_stops_at_first_failure():
    report = run("double", "wrong.py", "leaderboard", secret_seeds=(5,))
    assert [r.mode for r in report.runs] == ["test", "benchmark"]
    assert report.outcome == "failed" and int(report.exit_code) == 1
    assert report.runs[1].exit_code == 112
    assert report.runs[1].summary == "check failed: benchmark, benchmark size: 10; seed: 3: expected 20, got 21"
    assert report.runs[1].benchmarks[0].error == "expected 20, got 21\nsecond line"
    assert report.score_public_s is None


def test_failed_test_stops_before_benchmark():
    report = run("double", "badtest.py", "leaderboard", secret_seeds=(5,))
    assert [r.mode for r in report.runs] == ["test"]
    assert report.runs[0].tests[0].passed is False


def test_timeout_is_a_result_with_exit_114():
    task = load_task(TASKS / "double")
    task = type(task)(**{**task.__dict__, "test_timeout": 2.0})
    report = runner.run_submission(task, SUBS / "slow.py", "test", runner.RunOptions(precompile=False),
                                   system=NO_PROBE)
    run_ = report.runs[0]
    assert run_.timed_out and run_.exit_code == 114 and run_.outcome == "timed_out"
    assert run_.summary == "timed out: test ran past its 2 s timeout"
    assert 1.5 < run_.duration_s < 15
    assert int(report.exit_code) == 7


def test_crashing_eval_is_crashed_with_signal():
    report = run("double", "crash.py", "test", precompile=False)
    run_ = report.runs[0]
    assert run_.outcome == "crashed" and int(report.exit_code) == 6
    assert "killed by signal SIGABRT" in run_.summary


def test_missing_pipe_fd_and_bad_mode_exit_codes(tmp_path):
    task = load_task(TASKS / "double")
    ws = Executor().new_workspace(tmp_path)
    ws.prepare(task, (SUBS / "good.py").read_bytes())
    (tmp_path / "cases.txt").write_text("size: 1; seed: 1\n")
    done = proc.run([sys.executable, "eval.py", "test", "cases.txt"], tmp_path, runner.child_env(runner.RunOptions()), 20)
    assert done.code == 111
    bad = runner.run_mode(ws, "eval.py", "bogus", [{"size": 1}], timeout_s=20, options=runner.RunOptions())
    assert bad.exit_code == 2 and bad.outcome == "crashed" and "bad usage or unknown mode" in bad.summary


def test_multi_gpu_tasks_get_popcorn_gpus():
    task = load_task(TASKS / "multi")
    report = runner.run_submission(task, SUBS / "good.py", "test", runner.RunOptions(precompile=False),
                                   system={"gpu_count": 4})
    assert report.runs[0].raw["env.gpus"] == "4"
    assert "world_size: 2" in report.runs[0].raw["env.cases"]


def test_missing_custom_kernel_at_runtime_is_bad_submission(tmp_path):
    sub = tmp_path / "late.py"
    # custom_kernel exists only as a name the checker accepts, but importing it fails at runtime
    sub.write_text(textwrap.dedent("""
        if False:
            def custom_kernel(data):
                return 2 * data
    """))
    report = runner.run_submission(load_task(TASKS / "double"), sub, "test", runner.RunOptions(precompile=False),
                                   system=NO_PROBE)
    assert report.outcome == "bad_submission" and int(report.exit_code) == 4


def test_unsupported_lang_is_a_task_error(tmp_path):
    (tmp_path / "task.yml").write_text(
        "files: [{name: submission.cu, source: '@SUBMISSION@'}]\nlang: cu\ndescription: d\nconfig: {}\n"
        "tests: [{size: 1}]\n")
    with pytest.raises(TaskError, match="`lang: cu` tasks are not supported"):
        runner.run_submission(load_task(tmp_path), SUBS / "good.py", "test", system=NO_PROBE)


def test_a_failed_build_in_the_pre_step_stops_the_run_as_compile_failed():
    report = run("double", "buildfail.py", "leaderboard", secret_seeds=(3,))
    assert report.runs == () and report.outcome == "compile_failed" and int(report.exit_code) == 5
    assert report.precompile.build_failed
    [diag] = report.precompile.diagnostics
    assert (diag.severity, diag.message, diag.line) == ("error", 'expected a ";"', 3)
    assert RunReport.from_json(report.to_json()) == report


def test_a_pre_step_failure_that_is_not_a_build_is_not_fatal(tmp_path):
    sub = tmp_path / "exits.py"
    sub.write_text("import sys\nif __name__ == '__main__':\n    sys.exit(3)\n\ndef custom_kernel(d):\n    return 2 * d\n")
    report = runner.run_submission(load_task(TASKS / "double"), sub, "test", system=NO_PROBE)
    assert report.precompile.exit_code == 3 and not report.precompile.build_failed
    assert report.outcome == "passed"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["chain", "ab"])
def test_the_system_probe_ends_before_a_timed_mode_starts(tmp_path, entry):
    """The probe may open a CUDA context; it may overlap the test run, never a timed one (chain or A/B)."""
    log = tmp_path / "log"
    wrapper = tmp_path / "python"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *"platform.python_version()"*)
            sleep 2; {sys.executable} "$@"; status=$?; echo probe-done >> {log}; exit $status;;
          *" benchmark "*) echo benchmark-start >> {log};;
        esac
        exec {sys.executable} "$@"
        """))
    wrapper.chmod(0o755)
    # isolation none: the wrapper logs outside the workspace, where a sandboxed process cannot write
    options = runner.RunOptions(python=str(wrapper), precompile=False, isolation="none")
    task = load_task(TASKS / "double")
    if entry == "chain":
        report = runner.run_submission(task, SUBS / "good.py", "benchmark", options)
        assert report.outcome == "passed", report.runs[-1].summary
        expected = ["probe-done", "benchmark-start"]
    else:
        report = ab.run_ab(task, SUBS / "good.py", SUBS / "good.py", options)
        assert report.failed_side == "" and report.rounds == ab.FIRST_LOOK, report.failure
        # The warm-up's timings are thrown away, so it may overlap the probe; the timed evals may not.
        expected = ["benchmark-start", "probe-done"] + ["benchmark-start"] * 2 * ab.FIRST_LOOK
    assert log.read_text().split() == expected


@pytest.mark.parametrize("key,value", [("samples", "abc,1"), ("samples", "1,nan"), ("runs", "inf"),
                                       ("runs", "nan"), ("runs", "ten"), ("mean", "fast")])
def test_a_malformed_number_from_the_eval_fails_the_case_naming_it(tmp_path, key, value):
    lines = {"runs": "3", "mean": "1000", "samples": "999,1000,1001", key: value}
    (tmp_path / "eval.py").write_text(textwrap.dedent(f"""
        import os
        out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
        out.write("check: pass\\nbenchmark-count: 1\\nbenchmark.0.spec: size: 1\\nbenchmark.0.status: pass\\n")
        for k, v in {lines!r}.items():
            out.write(f"benchmark.0.{{k}}: {{v}}\\n")
    """))
    (tmp_path / "task.yml").write_text(
        "files: [{name: submission.py, source: '@SUBMISSION@'}, {name: eval.py, source: eval.py}]\n"
        "lang: py\ndescription: d\nconfig: {main: eval.py}\nbenchmarks: [{size: 1}]\n")
    report = runner.run_submission(load_task(tmp_path), SUBS / "good.py", "benchmark",
                                   runner.RunOptions(precompile=False), system=NO_PROBE)
    assert report.outcome == "failed" and int(report.exit_code) == 1
    wanted = "a list of numbers" if key == "samples" else "a number"
    assert report.runs[0].summary == (f"check failed: benchmark, benchmark size: 1: the eval wrote a malformed"
                                      f" result: `benchmark.0.{key}` is {value!r}, not {wanted}")


def test_the_tamper_check_reads_the_task_imports_beside_the_first_process(tmp_path):
    """A run reads the module names its task's files import (a module of that name planted in the folder is
    tampering) on a thread once its first process is up, or when the check asks first; the same names."""
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "task.yml").write_text((TASKS / "double" / "task.yml").read_text().replace(
        "../common/tiny_eval.py", "eval.py"))
    (task_dir / "eval.py").write_text("import planted_helper\n" + (TASKS / "common" / "tiny_eval.py").read_text())
    task = load_task(task_dir)
    for started in (True, False):
        ws = Executor().new_workspace(tmp_path / f"ws-{started}")
        ws.prepare(task, (SUBS / "good.py").read_bytes(), later=True)
        calls = []
        ws.after_start(lambda: calls.append("after start"))
        if started:
            ws.add("noop.py", b"")
            assert ws.run(sys.executable, "noop.py", [], runner.child_env(runner.RunOptions()), 20).code == 0
            assert calls == ["after start"]
        (ws.cwd / "planted_helper.py").write_text("")
        assert "planted_helper.py" in ws.tampered("the test mode")
        assert not (ws.cwd / "planted_helper.py").exists()
