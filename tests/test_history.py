"""popkit.history: round-trips, never losing runs, corrupt and locked databases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from popkit.errors import HistoryError, UsageError
from popkit.ledger import history
from popkit.ledger import runcompare
from popkit.ledger.history import History, RunRecord
from popkit.model.results import CaseResult, CompileStep, ModeRun, RunReport
from popkit.model.results import RemoteResult, RemoteRun

ROOT = Path(history.__file__).resolve().parents[1]  # the popkit under test, for the writer processes


def make_report(means=(1000.0, 4000.0), *, mode="benchmark", sha="a" * 64, samples=True,
                submission="sub.py", seeds=()) -> RunReport:
    cases = tuple(
        CaseResult(kind="benchmark", index=i, spec=f"size: {2 ** (i + 10)}; seed: {i}", passed=True, runs=4,
                   mean_ns=m, std_ns=m * 0.01, err_ns=m * 0.005, best_ns=m * 0.98, worst_ns=m * 1.02,
                   median_ns=m, samples_ns=(m * 0.99, m, m, m * 1.01) if samples else (), stop="converged",
                   timer="cuda-event")
        for i, m in enumerate(means))
    run = ModeRun(mode=mode, secret=False, seed=None, exit_code=0, duration_s=1.5, timeout_s=180.0,
                  check="pass", benchmarks=cases if mode != "test" else (),
                  tests=(CaseResult(kind="test", index=0, spec="size: 8", passed=True),) if mode == "test" else (),
                  raw={"check": "pass"})
    return RunReport(task="vectoradd", task_path="/tasks/vectoradd", leaderboard="vectoradd", ranking_by="geom",
                     submission=submission, sha256=sha, mode=mode, harness="popkit",
                     started_at="2026-11-02T10:00:00+00:00", duration_s=3.0,
                     system={"device": "NVIDIA H100", "torch": "2.14.1", "cuda": "13.0"},
                     precompile=CompileStep(exit_code=0, duration_s=0.5), runs=(run,), secret_seeds=tuple(seeds))


def submission(sha="b" * 64) -> dict:
    """Where a submission went, as `History.record_submission` takes it."""
    return dict(submission="sub.py", sha256=sha, leaderboard="vectoradd", gpu="H100", mode="leaderboard")


REMOTE = RemoteResult(submission_id=42, leaderboard="vectoradd", file_name="sub.py", done=True,
                      runs=(RemoteRun("leaderboard", False, "H100", 0.0000123, True, "t0", "t1"),
                            RemoteRun("leaderboard", True, "H100", 0.0000124, True, "t0", "t1")),
                      score_public_s=0.0000123, score_secret_s=0.0000124, score_gpu="H100")


@pytest.fixture
def db(tmp_path):
    return History(tmp_path / "h" / "history.sqlite3", timeout_s=0.2)


def test_default_location_is_one_ledger_per_user(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POPKIT_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert history.db_path() == tmp_path / "data" / "popkit" / "history.sqlite3"
    recorded = history.record_run(make_report(), b"print(1)\n")
    assert recorded.warning == ""
    assert (tmp_path / "data" / "popkit" / "history.sqlite3").is_file()
    assert not (tmp_path / ".popkit").exists()
    assert history.get_run(recorded.run_id).report == make_report()
    other = tmp_path / "other-project"
    other.mkdir()
    monkeypatch.chdir(other)  # another folder, the same ledger
    assert history.get_run(recorded.run_id).report == make_report()
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert history.db_path() == tmp_path / "me" / ".local" / "share" / "popkit" / "history.sqlite3"


def test_an_existing_dot_popkit_folder_keeps_working_and_history_says_so(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from popkit.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POPKIT_HOME", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    (tmp_path / ".popkit").mkdir()
    assert history.db_path() == tmp_path / ".popkit" / "history.sqlite3"
    history.record_run(make_report(), b"print(1)\n")
    result = CliRunner().invoke(app, ["history"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        f"ledger: {tmp_path / '.popkit' / 'history.sqlite3'} (the .popkit folder in this directory; without it "
        "popkit uses your per-user ledger)")


def test_popkit_home_moves_it(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "elsewhere"))
    assert history.db_path() == tmp_path / "elsewhere" / "history.sqlite3"
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.setenv("POPKIT_HOME", "~/ledger")  # expanded, as a shell would: builds and history agree
    assert history.db_path() == tmp_path / "me" / "ledger" / "history.sqlite3"


def test_recording_in_an_unusable_history_is_a_warning(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "file" / "home"))
    recorded = history.record_run(make_report(), b"x")
    assert recorded.run_id is None and recorded.warning.startswith("not recorded in history: ")
    recorded = history.record_submission(**submission(), remote=None, content=b"x", error="boom")
    assert recorded.run_id is None and "cannot create the history folder" in recorded.warning


def test_record_run_round_trip(db):
    report = make_report(seeds=(7, 9))
    run_id = db.record_run(report, b"code")
    record = db.get_run(run_id)
    assert record.report == report  # RunReport.from_json(to_json) inside, raw samples included
    assert (record.kind, record.task, record.mode, record.device) == ("bench", "vectoradd", "benchmark", "NVIDIA H100")
    assert record.seeds == (7, 9) and record.score_s == pytest.approx(report.score_public_s)
    assert db.content(run_id) == b"code"


def test_record_json_round_trip(db):
    run_id = db.record_run(make_report(), b"code")
    sub_id = db.record_submission(**submission(), remote=REMOTE, content=b"code2")
    for rid in (run_id, sub_id):
        record = db.get_run(rid)
        assert RunRecord.from_json(record.to_json()) == record


def test_test_runs_are_kind_test(db):
    assert db.get_run(db.record_run(make_report(mode="test"), b"x")).kind == "test"


def test_submission_record(db):
    rid = db.record_submission(**submission(), remote=REMOTE, content=b"code")
    record = db.get_run(rid)
    assert (record.kind, record.remote_id, record.outcome, record.gpu) == ("submit", 42, "passed", "H100")
    assert record.remote_score_s == pytest.approx(0.0000123)
    assert record.remote == REMOTE


def test_failed_submission_is_recorded_with_its_error(db):
    record = db.get_run(db.record_submission(**submission(), remote=None, content=b"code",
                                             error="remote submission failed"))
    assert (record.outcome, record.error, record.remote) == ("error", "remote submission failed", None)


def test_list_newest_first_with_task_filter_and_limit(db):
    ids = [db.record_run(make_report(), b"1"), db.record_run(make_report(), b"2")]
    other = make_report()
    other = RunReport(**{**other.__dict__, "task": "softmax", "leaderboard": "softmax"})
    ids.append(db.record_run(other, b"3"))
    assert [r.id for r in db.list_runs()] == ids[::-1]
    assert [r.id for r in db.list_runs(task="vectoradd")] == ids[1::-1]
    assert [r.id for r in db.list_runs(limit=1)] == [ids[2]]
    assert all(r.report is None for r in db.list_runs())  # listings stay light


def test_empty_history_lists_nothing_and_creates_nothing(tmp_path):
    db = History(tmp_path / "none" / "history.sqlite3")
    assert db.list_runs() == [] and db.latest_local("x") is None
    assert not (tmp_path / "none").exists()


def test_unknown_run_is_a_usage_error(db):
    db.record_run(make_report(), b"x")
    with pytest.raises(UsageError, match="no run 99"):
        db.get_run(99)


def test_latest_local_prefers_newest_scored_run_of_the_same_bytes(db):
    first = db.record_run(make_report(sha="c" * 64), b"x")
    db.record_run(make_report(mode="test", sha="c" * 64), b"x")
    db.record_submission(**submission(sha="c" * 64), remote=REMOTE, content=b"x")
    db.record_run(make_report(sha="d" * 64), b"y")
    assert db.latest_local("c" * 64).id == first
    assert db.latest_local("e" * 64) is None


def test_ids_are_never_reused_and_earlier_runs_stay(db):
    a = db.record_run(make_report(), b"1")
    b = db.record_run(make_report(), b"2")
    assert b > a and db.get_run(a).report == make_report()


def test_corrupt_database_is_an_error_and_left_alone(db):
    db.path.parent.mkdir(parents=True)
    garbage = b"this is not a database, but someone's notes\n" * 50
    db.path.write_bytes(garbage)
    with pytest.raises(HistoryError) as info:
        db.record_run(make_report(), b"x")
    assert str(db.path) in info.value.message and "unreadable" in info.value.message
    assert "never deletes" in info.value.hint
    with pytest.raises(HistoryError):
        db.list_runs()
    assert db.path.read_bytes() == garbage


def test_locked_database_waits_then_errors(db):
    first = db.record_run(make_report(), b"1")
    holder = sqlite3.connect(db.path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryError) as info:
            db.record_run(make_report(), b"2")
        assert "locked" in info.value.message and str(db.path) in info.value.message
    finally:
        holder.rollback()
        holder.close()
    assert [r.id for r in db.list_runs()] == [first]
    assert db.record_run(make_report(), b"3") > first  # usable again once released


@pytest.mark.parametrize("held_s", [0.5, pytest.param(6.0, marks=pytest.mark.slow)])
def test_a_write_waits_for_another_writer_then_records(db, held_s):
    """A writer holding the database's write lock delays a record; it does not lose it. 6 s: longer than the
    5 s popkit waited before (8 writers at once made one wait that long on a busy 2-core machine)."""
    first = db.record_run(make_report(), b"1")
    waiting = History(db.path)  # the default wait
    holder = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO runs (kind, created_at, submission, sha256, content, mode) "
                   "VALUES ('test', 'now', 'x.py', 'x', x'00', 'test')")
    release = threading.Timer(held_s, lambda: holder.execute("COMMIT"))
    release.start()
    start = time.monotonic()
    try:
        second = waiting.record_run(make_report(), b"2")
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - start >= held_s - 0.1
    assert second == first + 2 and [r.id for r in db.list_runs()] == [second, first + 1, first]


_RECORDER = """
import json, sys, time
from popkit.ledger.history import History
from popkit.model.results import RunReport
path, worker, count, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
report = RunReport.from_json(json.loads(sys.stdin.read()))
while time.time() < start:  # every writer starts at the same moment, on a database none has created yet
    time.sleep(0.001)
for i in range(count):
    History(path).record_run(report, f"{worker}-{i}".encode())
"""
WRITERS, RECORDS = 8, 50


@pytest.mark.slow
def test_eight_processes_recording_at_once_lose_no_run(tmp_path):
    """8 popkits recording 50 runs each at the same moment, into a database none of them has created: all 400
    rows are there (before BEGIN IMMEDIATE and bounded retries, 1-2 of 400 were lost as `locked`)."""
    path = tmp_path / "history.sqlite3"
    start = time.time() + 2.0  # after every interpreter has imported popkit
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    writers = [subprocess.Popen([sys.executable, "-c", _RECORDER, str(path), str(k), str(RECORDS), str(start)],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for k in range(WRITERS)]
    report = json.dumps(make_report().to_json())
    errors = [w.communicate(report, timeout=300)[1] for w in writers]
    assert [w.returncode for w in writers] == [0] * WRITERS, errors
    con = sqlite3.connect(path)
    contents = sorted(bytes(row[0]).decode() for row in con.execute("SELECT content FROM runs"))
    con.close()
    assert contents == sorted(f"{k}-{i}" for k in range(WRITERS) for i in range(RECORDS))


def test_newer_schema_is_refused(db):
    db.record_run(make_report(), b"1")
    con = sqlite3.connect(db.path)
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    with pytest.raises(HistoryError, match="newer popkit"):
        db.list_runs()


def test_compare_runs(db):
    a = db.record_run(make_report(means=(1000.0, 4000.0)), b"1")
    b = db.record_run(make_report(means=(500.0, 4000.0), sha="c" * 64), b"2")
    rc = runcompare.compare_runs(a, b, db)
    rec_a, rec_b, comparison = rc.a, rc.b, rc.comparison
    assert (rec_a.id, rec_b.id) == (a, b)
    assert [s.spec for s in comparison.shapes] == ["size: 1024; seed: 0", "size: 2048; seed: 1"]
    assert comparison.shapes[0].ratio.estimate == pytest.approx(0.5)
    assert comparison.shapes[0].verdict == "b_faster"
    assert comparison.shapes[1].verdict == "no_significant_difference"
    assert comparison.score.estimate == pytest.approx(0.5 ** 0.5)


def test_compare_needs_timings(db):
    a = db.record_run(make_report(mode="test"), b"1")
    b = db.record_run(make_report(), b"2")
    with pytest.raises(UsageError, match=f"run {a} has no local timings"):
        runcompare.compare_runs(a, b, db)


# ---------------------------------------------------------------------------------- the commands

import json  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from popkit.cli import app  # noqa: E402


@pytest.fixture
def cli_env(cli_env):
    return {**cli_env, "POPKIT_WIDTH": "200"}


def _db(cli_env) -> History:
    return History(history.db_path(cli_env))


def test_history_command_lists_newest_first(cli_env):
    db = _db(cli_env)
    db.record_run(make_report(mode="test"), b"1")
    db.record_run(make_report(submission="v7.py"), b"2")
    db.record_submission(**submission(), remote=REMOTE, content=b"3")
    result = CliRunner().invoke(app, ["history"], env=cli_env)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["3", "2", "1"]
    assert "submit leaderboard #42" in result.output and "12.3 µs" in result.output
    assert "NVIDIA H100" in result.output and "v7.py" in result.output
    result = CliRunner().invoke(app, ["history", "-n", "1", "--json"], env=cli_env)
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/history/1" and [r["id"] for r in doc["runs"]] == [3]


def test_history_command_empty_and_task_filter(cli_env):
    result = CliRunner().invoke(app, ["history"], env=cli_env)
    assert result.exit_code == 0 and "no runs recorded" in result.output
    _db(cli_env).record_run(make_report(), b"1")
    result = CliRunner().invoke(app, ["history", "--task", "softmax"], env=cli_env)
    assert "no runs of task softmax recorded in" in result.output


def test_history_command_corrupt_database(cli_env):
    path = history.db_path(cli_env)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage" * 100)
    result = CliRunner().invoke(app, ["history"], env=cli_env)
    assert result.exit_code == 10
    assert f"error: {path}: the history database is unreadable" in result.output
    assert path.read_bytes() == b"garbage" * 100


def test_show_command_renders_the_stored_report(cli_env):
    rid = _db(cli_env).record_run(make_report(), b"print('v7')\n")
    result = CliRunner().invoke(app, ["show", str(rid)], env=cli_env)
    assert result.exit_code == 0, result.output
    assert f"run {rid} · bench" in result.output
    assert "popkit benchmark · task vectoradd" in result.output
    assert "size: 1024; seed: 0" in result.output and "PASSED" in result.output
    source = CliRunner().invoke(app, ["show", str(rid), "--source"], env=cli_env)
    assert "print('v7')" in source.output
    doc = json.loads(CliRunner().invoke(app, ["show", str(rid), "--json"], env=cli_env).stdout)
    assert doc["schema"] == "popkit/history-run/1"
    assert RunReport.from_json(doc["report"]) == make_report()


def test_show_command_submission_and_unknown_run(cli_env):
    rid = _db(cli_env).record_submission(**submission(), remote=REMOTE, content=b"x")
    result = CliRunner().invoke(app, ["show", str(rid)], env=cli_env)
    assert result.exit_code == 0, result.output
    assert "submission 42" in result.output and "score (public) on H100: 12.3 µs" in result.output
    missing = CliRunner().invoke(app, ["show", "99"], env=cli_env)
    assert missing.exit_code == 2 and "no run 99" in missing.output


def test_compare_command(cli_env):
    db = _db(cli_env)
    a = db.record_run(make_report(means=(1000.0, 4000.0)), b"1")
    b = db.record_run(make_report(means=(500.0, 4000.0), sha="c" * 64), b"2")
    result = CliRunner().invoke(app, ["compare", str(a), str(b)], env=cli_env)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    first = next(line for line in lines if line.lstrip().startswith("size: 1024"))
    assert "0.500×" in first and f"run {b} faster" in first
    second = next(line for line in lines if line.lstrip().startswith("size: 2048"))
    assert "no significant difference" in second
    assert "score (geomean)" in result.output
    doc = json.loads(CliRunner().invoke(app, ["compare", str(a), str(b), "--json"], env=cli_env).stdout)
    assert doc["schema"] == "popkit/compare/1"
    assert doc["comparison"]["shapes"][0]["verdict"] == "b_faster"


def test_compare_command_needs_timed_runs(cli_env):
    db = _db(cli_env)
    a = db.record_run(make_report(mode="test"), b"1")
    b = db.record_run(make_report(), b"2")
    result = CliRunner().invoke(app, ["compare", str(a), str(b)], env=cli_env)
    assert result.exit_code == 2 and f"run {a} has no local timings" in result.output


@pytest.mark.parametrize("command", ["check", "submit", "history", "show", "compare"])
def test_every_command_help_has_an_example(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"POPKIT_WIDTH": "200"})
    assert result.exit_code == 0
    assert f"popkit {command}" in result.output.split("Usage:", 1)[1].split("Options", 1)[0].split("Example", 1)[1]


HUGE = "99999999999999999999"  # beyond SQLite's 64-bit integers


@pytest.mark.parametrize("args,code,message", [
    (["show", HUGE], 2, f"error: no run {HUGE} in "),
    (["show", HUGE, "--source"], 2, f"error: no run {HUGE} in "),
    (["compare", HUGE, "1"], 2, f"error: no run {HUGE} in "),
    (["history", "-n", HUGE], 0, "vectoradd"),
])
def test_huge_run_ids_and_limits_are_ordinary_input(cli_env, args, code, message):
    _db(cli_env).record_run(make_report(), b"1")
    result = CliRunner().invoke(app, args, env=cli_env)
    assert result.exit_code == code, result.output
    assert message in result.output and "internal error" not in result.output


def test_zero_length_database_is_no_history_yet_and_left_alone(cli_env):
    path = history.db_path(cli_env)
    path.parent.mkdir(parents=True)
    path.touch()
    for args in (["history"], ["show", "1"]):
        result = CliRunner().invoke(app, args, env=cli_env)
        assert "internal error" not in result.output
    lines = CliRunner().invoke(app, ["history"], env=cli_env).output.splitlines()
    assert lines[0].startswith("ledger: ") and lines[1].startswith("no runs recorded")
    assert path.read_bytes() == b""


def test_another_programs_sqlite_file_is_never_modified(cli_env):
    path = history.db_path(cli_env)
    path.parent.mkdir(parents=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["history"], env=cli_env)
    assert result.exit_code == 10, result.output
    assert f"error: {path}: not a popkit history database (it holds the table notes)" in result.output
    with pytest.raises(HistoryError, match="not a popkit history database"):
        _db(cli_env).record_run(make_report(), b"1")
    assert path.read_bytes() == before


def test_history_filters_by_file_or_folder_and_shows_paths_from_the_cwd(cli_env, tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "kernels").mkdir(parents=True)
    (work / "kernels" / "v7.py").write_text("x")
    (work / "kernels_old").mkdir()
    monkeypatch.chdir(work)
    db = _db(cli_env)
    v7 = db.record_run(make_report(submission="kernels/v7.py"), b"1")  # as typed, relative to the cwd
    old = db.record_run(make_report(submission=str(work / "kernels_old" / "v7.py")), b"2")
    other = db.record_run(make_report(submission=str(tmp_path / "elsewhere" / "KERNELS" / "v7.py")), b"3")
    assert db.get_run(v7).submission == str(work / "kernels" / "v7.py")  # stored absolute
    listed = CliRunner().invoke(app, ["history"], env=cli_env).output
    assert "kernels/v7.py" in listed and "kernels_old/v7.py" in listed
    assert "/elsewhere/KERNELS/v7.py" in listed  # outside the cwd: absolute, its end kept
    by_file = CliRunner().invoke(app, ["history", "--file", "kernels/v7.py", "--json"], env=cli_env)
    assert [r["id"] for r in json.loads(by_file.stdout)["runs"]] == [v7]
    by_folder = CliRunner().invoke(app, ["history", "--file", "kernels", "--json"], env=cli_env)
    assert [r["id"] for r in json.loads(by_folder.stdout)["runs"]] == [v7]  # not kernels_old/, not KERNELS/
    assert [r.id for r in db.list_runs(path=work)] == [old, v7]
    assert other not in [r.id for r in db.list_runs(path=work)]
    none = CliRunner().invoke(app, ["history", "--file", "kernels", "--task", "softmax"], env=cli_env)
    assert "no runs of task softmax and files under kernels recorded in" in none.output
