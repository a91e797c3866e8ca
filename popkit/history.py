"""The run history: every test, bench and submit in one SQLite file.

The database is `history.sqlite3` in popkit_home(): the per-user data folder
(`$XDG_DATA_HOME/popkit`, else `~/.local/share/popkit`), POPKIT_HOME, or a `.popkit` folder that
already exists in the working directory. Each row keeps the exact bytes that ran, the whole RunReport as JSON (raw samples
included) and indexed columns for listing. popkit only ever inserts: it never deletes, rewrites
or recreates the file, so a corrupt or locked database is an error that names the file, and the
runs already in it stay where they are.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from popkit import __version__
from popkit.ab import Comparison, compare_shapes
from popkit.errors import HistoryError, UsageError
from popkit.resources import popkit_home
from popkit.results import CaseResult, RemoteResult, RunReport

DB_NAME = "history.sqlite3"
BUSY_TIMEOUT_S = 5.0  # how long a write waits for another popkit holding the database
USER_VERSION = 1  # the schema below; a newer popkit may add columns, never drop them
HISTORY_SCHEMA = "popkit/history/1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: an id is never reused
    kind TEXT NOT NULL,                    -- test | bench | submit
    created_at TEXT NOT NULL,              -- ISO 8601, UTC
    submission TEXT NOT NULL,              -- the path as given
    sha256 TEXT NOT NULL,                  -- of the exact bytes that ran or were submitted
    content BLOB NOT NULL,
    task TEXT,
    leaderboard TEXT,
    mode TEXT NOT NULL,
    gpu TEXT,                              -- submit: the GPU asked for
    device TEXT,                           -- local runs: the device that ran it
    outcome TEXT,
    score_s REAL,                          -- local: public score; submit: remote public score
    seeds TEXT NOT NULL DEFAULT '[]',      -- secret seeds (JSON list)
    remote_id INTEGER,
    remote_score_s REAL,
    error TEXT NOT NULL DEFAULT '',
    report_json TEXT,
    remote_json TEXT,
    popkit_version TEXT
);
CREATE INDEX IF NOT EXISTS runs_sha256 ON runs (sha256, id);
CREATE INDEX IF NOT EXISTS runs_task ON runs (task, id);
"""
_SUMMARY_COLUMNS = ("id, kind, created_at, submission, sha256, task, leaderboard, mode, gpu, device, outcome,"
                    " score_s, seeds, remote_id, remote_score_s, error, popkit_version")


def db_path(env: Mapping[str, str] | None = None) -> Path:
    return popkit_home(env) / DB_NAME


@dataclass(frozen=True)
class RunRecord:
    """One row of the history; `report`/`remote` are None in listings (only `get_run` loads them)."""

    id: int
    kind: str
    created_at: str
    submission: str
    sha256: str
    mode: str
    task: str | None = None
    leaderboard: str | None = None
    gpu: str | None = None
    device: str | None = None
    outcome: str | None = None
    score_s: float | None = None
    seeds: tuple[int, ...] = ()
    remote_id: int | None = None
    remote_score_s: float | None = None
    error: str = ""
    popkit_version: str | None = None
    report: RunReport | None = None
    remote: RemoteResult | None = None

    def to_json(self, summary: bool = False) -> dict:
        data = {k: getattr(self, k) for k in (
            "id", "kind", "created_at", "submission", "sha256", "mode", "task", "leaderboard", "gpu", "device",
            "outcome", "score_s", "remote_id", "remote_score_s", "error", "popkit_version")}
        data["seeds"] = list(self.seeds)
        if not summary:
            data["report"] = self.report.to_json() if self.report else None
            data["remote"] = self.remote.to_json() if self.remote is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunRecord":
        plain = {k: data.get(k) for k in ("task", "leaderboard", "gpu", "device", "outcome", "score_s",
                                          "remote_id", "remote_score_s", "popkit_version")}
        return cls(id=data["id"], kind=data["kind"], created_at=data["created_at"], submission=data["submission"],
                   sha256=data["sha256"], mode=data["mode"], seeds=tuple(data.get("seeds") or ()),
                   error=data.get("error") or "", **plain,
                   report=RunReport.from_json(data["report"]) if data.get("report") else None,
                   remote=RemoteResult.from_json(data["remote"]) if data.get("remote") else None)


def _problem(path: Path, exc: sqlite3.Error) -> HistoryError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return HistoryError(f"{path}: the history database is locked (another popkit is writing to it?)",
                            "wait for the other run to finish and try again; earlier runs are untouched")
    return HistoryError(f"{path}: the history database is unreadable ({text})",
                        "popkit never deletes it: move it aside (or set POPKIT_HOME to another folder)"
                        " to start a new one")


_MAX_ID = 2**63 - 1  # SQLite's largest integer


def _is_empty_file(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _refuse_foreign(path: Path, con: sqlite3.Connection) -> None:
    """A database without popkit's schema version but with tables belongs to another program."""
    tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    if tables:
        raise HistoryError(f"{path}: not a popkit history database (it holds the table{'s' if len(tables) > 1 else ''}"
                           f" {', '.join(tables)})",
                           "popkit never modifies it: move it aside, or set POPKIT_HOME to another folder")


class History:
    """One history database file; every method opens, works in one transaction, and closes."""

    def __init__(self, path: Path | str | None = None, timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path) if path else db_path()
        self.timeout_s = timeout_s

    def _open(self, create: bool) -> sqlite3.Connection | None:
        """A connection to popkit's database; None for a read where there is none yet.

        A missing or zero-length file (an empty database to SQLite) holds no history: a read leaves it
        as it is. A database with tables and no popkit schema version is some other program's: never touched.
        """
        if not self.path.exists() or (not create and _is_empty_file(self.path)):
            if not create:
                return None
            fresh = not self.path.parent.exists()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if fresh and self.path.parent.name == ".popkit":
                    (self.path.parent / ".gitignore").write_text("# popkit's run history\n*\n")
            except OSError as exc:
                raise HistoryError(f"{self.path.parent}: cannot create the history folder ({exc.strerror or exc})",
                                   "set POPKIT_HOME to a writable folder") from None
        try:
            con = sqlite3.connect(self.path, timeout=self.timeout_s)
        except sqlite3.Error as exc:
            raise _problem(self.path, exc) from None
        try:
            con.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            version = con.execute("PRAGMA user_version").fetchone()[0]  # reads the header: garbage fails here
            if version > USER_VERSION:
                raise HistoryError(f"{self.path}: written by a newer popkit (schema {version})",
                                   "upgrade popkit to read it")
            if version == 0:
                _refuse_foreign(self.path, con)
                if not create:
                    con.close()
                    return None
                with con:
                    con.executescript(_SCHEMA + f"PRAGMA user_version = {USER_VERSION};")
        except sqlite3.Error as exc:
            con.close()
            raise _problem(self.path, exc) from None
        except HistoryError:
            con.close()
            raise
        return con

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        con = self._open(create=False)
        if con is None:
            return []
        try:
            con.row_factory = sqlite3.Row
            return con.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _problem(self.path, exc) from None
        finally:
            con.close()

    def _insert(self, row: dict[str, Any]) -> int:
        con = self._open(create=True)
        assert con is not None
        try:
            with con:  # one transaction: the row is there whole, or not at all
                cur = con.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                  tuple(row.values()))
            return int(cur.lastrowid)
        except sqlite3.Error as exc:
            raise _problem(self.path, exc) from None
        finally:
            con.close()

    # ---------------------------------------------------------------------------------- writes

    def record_run(self, report: RunReport, content: bytes) -> int:
        """Record a local test or bench run; returns its id."""
        return self._insert({
            "kind": "test" if report.mode == "test" else "bench",
            "created_at": report.started_at or _now(), "submission": report.submission, "sha256": report.sha256,
            "content": content, "task": report.task, "leaderboard": report.leaderboard, "mode": report.mode,
            "gpu": None, "device": _device(report), "outcome": report.outcome,
            "score_s": report.score_public_s, "seeds": json.dumps(list(report.secret_seeds)),
            "report_json": json.dumps(report.to_json()), "popkit_version": __version__,
        })

    def record_submission(self, *, submission: str, sha256: str, leaderboard: str, gpu: str, mode: str,
                          remote: RemoteResult | None, content: bytes, error: str = "") -> int:
        """Record a `popkit submit`: where it went and its remote result, or the error it ended with."""
        outcome = "error" if remote is None else ("passed" if remote.passed else "failed")
        score = None
        if remote is not None:
            score = remote.score_public_s
            if score is None:
                score = next((r.score for r in remote.runs if r.mode == "leaderboard" and not r.secret
                              and r.score is not None), None)
        return self._insert({
            "kind": "submit", "created_at": _now(), "submission": submission, "sha256": sha256,
            "content": content, "task": leaderboard, "leaderboard": leaderboard, "mode": mode,
            "gpu": gpu, "device": None, "outcome": outcome, "score_s": score, "seeds": "[]",
            "remote_id": remote.submission_id if remote is not None else None, "remote_score_s": score,
            "error": error, "remote_json": json.dumps(remote.to_json()) if remote is not None else None,
            "popkit_version": __version__,
        })

    # ----------------------------------------------------------------------------------- reads

    def list_runs(self, task: str | None = None, limit: int = 20) -> list[RunRecord]:
        """Newest first; `task` matches the task or leaderboard name."""
        where, args = "", ()
        if task:
            where, args = "WHERE task = ? OR leaderboard = ?", (task, task)
        rows = self._query(f"SELECT {_SUMMARY_COLUMNS} FROM runs {where} ORDER BY id DESC LIMIT ?",
                           (*args, min(int(limit), _MAX_ID)))
        return [_record(r) for r in rows]

    def get_run(self, run_id: int) -> RunRecord:
        return _record(self._row(f"{_SUMMARY_COLUMNS}, report_json, remote_json", run_id), full=True)

    def content(self, run_id: int) -> bytes:
        return bytes(self._row("content", run_id)["content"])

    def _row(self, columns: str, run_id: int) -> sqlite3.Row:
        rows = []
        if abs(int(run_id)) <= _MAX_ID:  # a larger number is no SQLite integer, so no run's id
            rows = self._query(f"SELECT {columns} FROM runs WHERE id = ?", (int(run_id),))
        if not rows:
            raise UsageError(f"no run {run_id} in {self.path}", "`popkit history` lists the recorded runs")
        return rows[0]

    def latest_local(self, sha256: str) -> RunRecord | None:
        """The newest test or bench run of exactly these bytes (for showing beside a remote result)."""
        rows = self._query(f"SELECT {_SUMMARY_COLUMNS}, report_json, NULL AS remote_json FROM runs"
                           " WHERE sha256 = ? AND kind != 'submit' ORDER BY (score_s IS NULL), id DESC LIMIT 1",
                           (sha256,))
        return _record(rows[0], full=True) if rows else None


    def local_runs(self, sha256: str, task: str, limit: int = 50) -> list[RunRecord]:
        """The newest local runs (test and bench) of exactly these bytes on `task`, with their reports
        (`popkit tune --resume` reuses their verdicts and times)."""
        rows = self._query(f"SELECT {_SUMMARY_COLUMNS}, report_json, NULL AS remote_json FROM runs"
                           " WHERE sha256 = ? AND task = ? AND kind != 'submit' ORDER BY id DESC LIMIT ?",
                           (sha256, task, min(int(limit), _MAX_ID)))
        return [_record(r, full=True) for r in rows]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _record(row: sqlite3.Row, full: bool = False) -> RunRecord:
    keys = row.keys()
    report = remote = None
    if full:
        try:
            if row["report_json"]:
                report = RunReport.from_json(json.loads(row["report_json"]))
            if "remote_json" in keys and row["remote_json"]:
                        remote = RemoteResult.from_json(json.loads(row["remote_json"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise HistoryError(f"run {row['id']}: stored report unreadable ({type(exc).__name__}: {exc})",
                               "the row's indexed columns are still listed by `popkit history`") from None
    return RunRecord(
        id=row["id"], kind=row["kind"], created_at=row["created_at"], submission=row["submission"],
        sha256=row["sha256"], mode=row["mode"], task=row["task"], leaderboard=row["leaderboard"], gpu=row["gpu"],
        device=row["device"], outcome=row["outcome"], score_s=row["score_s"],
        seeds=tuple(json.loads(row["seeds"] or "[]")), remote_id=row["remote_id"],
        remote_score_s=row["remote_score_s"], error=row["error"] or "", popkit_version=row["popkit_version"],
        report=report, remote=remote)


def _timed_cases(record: RunRecord) -> Iterator[CaseResult]:
    """The public timed run of a record: leaderboard mode if it ran, else benchmark mode."""
    report = record.report
    if report is None:
        return iter(())
    for mode in ("leaderboard", "benchmark"):
        for run in report.runs_of(mode, secret=False):
            if any(c.mean_ns for c in run.benchmarks):
                return iter(run.benchmarks)
    return iter(())


def compare_runs(a_id: int, b_id: int,
                 history: History | None = None) -> tuple[RunRecord, RunRecord, Comparison]:
    """`popkit compare`: per-shape and score ratios (time B / time A) of two recorded runs."""
    history = history or History()
    a, b = history.get_run(a_id), history.get_run(b_id)
    cases = {}
    for record in (a, b):
        timed = list(_timed_cases(record))
        if not timed:
            what = "a submission" if record.kind == "submit" else f"a {record.mode} run, {record.outcome}"
            raise UsageError(f"run {record.id} has no local timings ({what})",
                             "compare two `popkit bench` runs; `popkit history` shows their ids")
        cases[record.id] = {c.spec: [c] for c in timed}
    comparison = compare_shapes(cases[a.id], cases[b.id], f"run {a.id}", f"run {b.id}")
    if not comparison.shapes:
        raise UsageError(f"runs {a.id} and {b.id} share no benchmark shape",
                         "compare runs of the same task")
    return a, b, comparison


# Module-level entry points on the default database (popkit_home()). Every run popkit records
# goes through record_run or record_submission: a history problem comes back as a warning, since the
# result it would store is already in hand and is shown anyway.


@dataclass(frozen=True)
class Recorded:
    """What recording one run came to: its id, or the warning that says why it is not in the history."""

    run_id: int | None
    warning: str = ""


def _device(report: RunReport) -> str | None:
    """The device, with the run's label: a HIP-on-CUDA logic check reads `NVIDIA H100 [hip-on-cuda]`."""
    device = (report.system or {}).get("device")
    return f"{device} [{report.label}]" if device and report.label else device



def record_run(report: RunReport, content: bytes) -> Recorded:
    """Record a local test or bench run (the gate of a submission included)."""
    return _recorded(lambda: History().record_run(report, content))


def record_submission(*, submission: str, sha256: str, leaderboard: str, gpu: str, mode: str,
                      remote: RemoteResult | None, content: bytes, error: str = "") -> Recorded:
    """Record a submission handed to popcorn-cli, with its remote result or the error it ended with."""
    return _recorded(lambda: History().record_submission(
        submission=submission, sha256=sha256, leaderboard=leaderboard, gpu=gpu, mode=mode, remote=remote,
        content=content, error=error))


def _recorded(write: Callable[[], int]) -> Recorded:
    try:
        return Recorded(write())
    except HistoryError as exc:
        return Recorded(None, f"not recorded in history: {exc.message}")


def latest_local(sha256: str) -> RunRecord | None:
    return History().latest_local(sha256)


def list_runs(task: str | None = None, limit: int = 20) -> list[RunRecord]:
    return History().list_runs(task, limit)


def local_runs(sha256: str, task: str, limit: int = 50) -> list[RunRecord]:
    return History().local_runs(sha256, task, limit)


def get_run(run_id: int) -> RunRecord:
    return History().get_run(run_id)
