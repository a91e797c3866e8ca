"""The first hour's inner loop: `popkit watch FILE` is `popkit test FILE --watch` by its own name."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

GOOD = Path(__file__).parent.parent / "submissions" / "vectoradd" / "pytorch.py"


def test_watch_is_test_watch_by_its_own_name(cli, monkeypatch):
    seen = []

    def fake_watch(request, json):
        seen.append((request.mode, [str(s.path) for s in request.sources], json))
        raise typer.Exit(0)

    monkeypatch.setattr("popkit.cli.running._watch", fake_watch)
    result = cli("watch", str(GOOD), "--json")
    assert result.exit_code == 0, result.output
    assert seen == [("test", [str(GOOD)], True)]
    result = cli("watch", "no-such-file.py")
    assert result.exit_code == 4 and "no-such-file.py" in result.output


def test_profile_mode_on_a_cpu_is_sized_by_timing_benchmark_mode(monkeypatch, tmp_path):
    """Profile mode reports tables, not times: its sizing runs benchmark mode (it said "did not run here in
    profile mode: passed")."""
    from popkit.measure import sizing
    from popkit.model.results import CaseResult, ModeRun, RunReport
    from popkit.model.tasks import resolve_task
    from popkit.run import runner
    from popkit.submission.source import Source

    task = resolve_task("identity")
    asked = []

    def fake_run(task, path, mode, options, **kw):
        asked.append(mode)
        cases = tuple(CaseResult("benchmark", i, "s", True, runs=3, mean_ns=1e6 * (i + 1)) for i in range(2))
        run = ModeRun(mode, False, None, 0, 1.0, 60, check="pass", benchmarks=cases)
        return RunReport(task=task.name, task_path="", leaderboard=None, ranking_by="mean", submission=str(path),
                         sha256="", mode=mode, harness="task", started_at="", duration_s=1.0, runs=(run,))

    monkeypatch.setattr(runner, "run_submission", fake_run)
    timing = sizing.probe(task, Source.read(GOOD), runner.RunOptions(), None, [0, 1], "profile", lambda _m: None)
    assert asked == ["benchmark"] and len(timing.points) == 2


def test_the_no_directive_hint_names_the_task_the_file_name_suggests(cli, tmp_path):
    for name, wanted in (("grayscale_try.py", "`#!POPCORN leaderboard grayscale`"),
                         ("mine.py", "`#!POPCORN leaderboard NAME`")):
        path = tmp_path / name
        path.write_text("def custom_kernel(data):\n    return data\n")
        result = cli("test", str(path), "--no-history")
        assert result.exit_code == 2 and f"add {wanted} as the file's first line" in result.output, result.output


def test_help_gives_each_command_its_first_sentence_whole(cli):
    result = cli("-h")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "..." not in result.output.split("Commands:")[1]
    assert "Run the task's tests on SUBMISSION, the way the leaderboard's `test` mode does." in text
    assert "Check SUBMISSION for everything the leaderboard server refuses, and for reward-hack patterns." in text


def test_an_unknown_option_is_offered_only_a_close_neighbour(cli):
    import json

    doc = json.loads(cli("test", "x.py", "--json", "--bogus").stdout)
    assert doc["message"] == "No such option: --bogus" and doc["exit_code"] == 2  # not "--gpus"
    assert "(Possible options: --json)" in cli("test", "x.py", "--jsn").output


def test_a_case_the_eval_counted_but_never_reported_says_so():
    from popkit.run import protocol

    cases = protocol.decode_cases({"test-count": "3", "test.0.spec": "size: 1", "test.0.status": "pass"}, "test", 3)
    assert [c.passed for c in cases] == [True, False, False]
    assert cases[1].error == protocol.NEVER_RAN and not cases[0].error


def test_inner_loop_knobs_narrow_the_task_and_say_how():
    import pytest

    from popkit.errors import UsageError
    from popkit.model import innerloop
    from popkit.model.tasks import resolve_task

    task = resolve_task("vectoradd")
    narrowed, changed = innerloop.apply(task, innerloop.Knobs(cases="1,3", shapes="2-3", timeout_s=30))
    assert narrowed.tests == (task.tests[0], task.tests[2]) and narrowed.benchmarks == task.benchmarks[1:3]
    assert narrowed.test_timeout == narrowed.benchmark_timeout == narrowed.ranked_timeout == 30
    assert changed == ("tests 1, 3 of 6", "benchmark shapes 2, 3 of 4", "timeout 30 s")
    assert innerloop.apply(task, innerloop.Knobs()) == (task, ())
    for knobs, words in ((innerloop.Knobs(cases="7"), "outside 1 to 6"), (innerloop.Knobs(shapes="x"), "not a number")):
        with pytest.raises(UsageError, match=words):
            innerloop.apply(task, knobs)


@pytest.mark.slow
def test_a_narrowed_test_run_is_marked_not_leaderboard_faithful(cli):
    import json

    result = cli("test", str(GOOD), "--cases", "1,3", "--timeout", "30", "--json", "--no-history")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert not doc["leaderboard_faithful"] and doc["changed"] == ["tests 1, 3 of 6", "timeout 30 s"]
    assert [r["timeout_s"] for r in doc["runs"]] == [30.0] and len(doc["runs"][0]["tests"]) == 2


def test_a_watch_verdict_that_never_ran_says_why_in_the_report(capsys, monkeypatch):
    """The syntax error's reason is on the report's own stream (stdout), not on stderr alone."""
    from popkit.errors import SubmissionError
    from popkit.model.tasks import resolve_task
    from popkit.operations import watch
    from popkit.views import common, watching

    monkeypatch.setenv("POPKIT_WIDTH", "200")
    common.set_json(False)
    verdict = watch.Verdict(index=2, trigger="save", submission="sub.py", sha256="ab", saved_at=1e9, seconds=0.5,
                            ready_at_save=True, warmup_s=3.0, harness="task", note="warm",
                            error=SubmissionError("sub.py:4:39: syntax error: invalid syntax", "fix the syntax"))
    watching.show_verdict(verdict, resolve_task("vectoradd"), "test")
    out = capsys.readouterr().out
    assert "BAD SUBMISSION (exit 4): nothing ran: sub.py:4:39: syntax error: invalid syntax" in out
    assert "hint: fix the syntax" in out


def test_the_cpu_sizing_is_remembered_per_task_and_machine(monkeypatch):
    """The first sizing decides the shapes of later runs of any file of the task: their scores rank together."""
    from popkit.measure import sizing
    from popkit.model.tasks import resolve_task
    from popkit.run import runner
    from popkit.submission.source import Source

    calls = []
    monkeypatch.setattr(sizing, "probe", lambda *a: calls.append(a[5]) or sizing.Timing(((1.0, 2.0), (4.0, 9.0)), 1.5))
    task = resolve_task("vectoradd")
    first = sizing.remembered_timing(task, Source.read(GOOD), runner.RunOptions(), None, [0, 1], "benchmark", print)
    other = Source(GOOD.with_name("other.py"), b"def custom_kernel(data):\n    return data[0] + data[1]\n")
    again = sizing.remembered_timing(task, other, runner.RunOptions(), None, [0, 1], "benchmark", print)
    assert first == again == sizing.Timing(((1.0, 2.0), (4.0, 9.0)), 1.5) and calls == ["benchmark"]
    sizing.remembered_timing(task, other, runner.RunOptions(), None, [0, 1], "leaderboard", print)
    assert calls == ["benchmark", "leaderboard"]  # another mode is sized on its own


def test_an_ab_says_how_long_it_may_take_before_it_starts(monkeypatch, tmp_path):
    import hashlib

    from popkit.ledger import history
    from popkit.model.results import ModeRun, RunReport
    from popkit.model.tasks import resolve_task
    from popkit.operations import workflows
    from popkit.submission.source import Source

    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "ledger"))
    task = resolve_task("vectoradd")
    a, b = Source(tmp_path / "a.py", b"a"), Source(tmp_path / "b.py", b"b")
    assert "the first round tells the time" in workflows.ab_estimate(task, (a, b), 8, 60.0)
    run = ModeRun("benchmark", False, None, 0, duration_s=10.0, timeout_s=180, check="pass")
    history.record_run(RunReport(task="vectoradd", task_path="", leaderboard=None, ranking_by="geom",
                                 submission=str(a.path), sha256=hashlib.sha256(b"a").hexdigest(), mode="benchmark",
                                 harness="task", started_at="", duration_s=10.0, runs=(run,)), b"a")
    # 4 rounds x 2 evals x 10 s at least; a new pair stops after 60 s: at most 60 + 2 rounds x 2 x 10 s
    assert workflows.ab_estimate(task, (a, b), 8, 60.0).endswith("about 10 s here, so expect 80-100 s")
    assert workflows.ab_estimate(task, (a, b), 8, 0).endswith("so expect 80-160 s")


def test_a_local_cluster_run_on_a_cpu_is_sized_as_bench_is(monkeypatch):
    from popkit.distributed import scheduler as cluster
    from popkit.errors import EnvironmentProblem
    from popkit.machine import system
    from popkit.measure import sizing
    from popkit.operations import workflows
    from popkit.submission.source import Source

    monkeypatch.setattr(system, "has_gpu", lambda: False)
    monkeypatch.setattr(sizing, "probe", lambda *a: sizing.Timing(((1024, 2.0), (2048, 8.0)), 2.0))
    sent = []
    monkeypatch.setattr(cluster, "run_jobs", lambda jobs, *a, **k: sent.extend(jobs) or ("run", None))
    request = workflows.Request((Source.read(GOOD),), "benchmark", allow_cpu=True, record=False)
    workflows.on_cluster(request, None)
    assert [len(job.task.benchmarks) for job in sent] == [3]  # the 8192 shape (128 s) left out, as bench does
    with pytest.raises(EnvironmentProblem, match="in all"):
        workflows.on_cluster(workflows.Request((Source.read(GOOD),), "benchmark", record=False), None)
