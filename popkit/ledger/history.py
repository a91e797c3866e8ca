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
import os
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from popkit import __version__
from popkit.errors import HistoryError, UsageError
from popkit.model.results import RemoteResult, RunReport
from popkit.resources import popkit_home

DB_NAME = "history.sqlite3"
BUSY_TIMEOUT_S = 30.0  # how long a write waits, in all, for other popkits writing at once
RETRY_PAUSE_S = (0.005, 0.05)  # the random pause before a write that found the database busy is tried again
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
# `faithful`: the stored report's leaderboard_faithful (NULL for a submission or a report written before it)
_SUMMARY_COLUMNS = ("id, kind, created_at, submission, sha256, task, leaderboard, mode, gpu, device, outcome,"
                    " score_s, seeds, remote_id, remote_score_s, error, popkit_version,"
                    " json_extract(report_json, '$.leaderboard_faithful') AS faithful")


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
    faithful: bool | None = None  # False: a run over some shapes or changed cases (not leaderboard-faithful)
    report: RunReport | None = None
    remote: RemoteResult | None = None

    def to_json(self, summary: bool = False) -> dict:
        data = {k: getattr(self, k) for k in (
            "id", "kind", "created_at", "submission", "sha256", "mode", "task", "leaderboard", "gpu", "device",
            "outcome", "score_s", "remote_id", "remote_score_s", "error", "popkit_version")}
        data["leaderboard_faithful"] = self.faithful
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
                   error=data.get("error") or "", **plain, faithful=data.get("leaderboard_faithful"),
                   report=RunReport.from_json(data["report"]) if data.get("report") else None,
                   remote=RemoteResult.from_json(data["remote"]) if data.get("remote") else None)


def _statements(script: str) -> list[str]:
    """A script's statements, one by one (executescript would commit the transaction they belong in)."""
    found, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending)
            pending = ""
    return found


def _busy(exc: sqlite3.Error) -> bool:
    """Another connection holds the database (SQLITE_BUSY, SQLITE_LOCKED)."""
    text = str(exc)
    return "locked" in text or "busy" in text


def _problem(path: Path, exc: sqlite3.Error) -> HistoryError:
    if _busy(exc):
        return HistoryError(f"{path}: the history database is locked (another popkit is writing to it?)",
                            "wait for the other run to finish and try again; earlier runs are untouched")
    return HistoryError(f"{path}: the history database is unreadable ({exc})",
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
    """One history database file; every method opens, works in one transaction, and closes.

    Writes take the write lock first (BEGIN IMMEDIATE), so a writer waits in SQLite's busy handler instead of
    failing on a lock upgrade, and a write that still finds the database busy is retried until `timeout_s`
    has passed in all: several popkits recording at once lose no run.
    """

    def __init__(self, path: Path | str | None = None, timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path) if path else db_path()
        self.timeout_s = timeout_s

    def _connect(self, wait_s: float) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=max(wait_s, 0.001), isolation_level=None)  # we BEGIN ourselves
        con.execute(f"PRAGMA busy_timeout = {max(int(wait_s * 1000), 1)}")
        return con

    def _open(self, create: bool, wait_s: float | None = None) -> sqlite3.Connection | None:
        """A connection to popkit's database, its schema there; None for a read where there is none yet.

        A missing or zero-length file (an empty database to SQLite) holds no history: a read leaves it
        as it is. A database with tables and no popkit schema version is some other program's: never touched.
        The schema is created, and its version set, in one write transaction: another popkit sees both or neither.
        Raises sqlite3 errors as they are (the callers name the file).
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
        con = self._connect(self.timeout_s if wait_s is None else wait_s)
        try:
            version = self._version(con)  # reads the header: garbage fails here
            if version == 0:
                if not create:
                    _refuse_foreign(self.path, con)
                    con.close()
                    return None
                con.execute("BEGIN IMMEDIATE")
                try:
                    if self._version(con) == 0:  # another popkit may have created it meanwhile
                        _refuse_foreign(self.path, con)
                        for statement in _statements(_SCHEMA):
                            con.execute(statement)
                        con.execute(f"PRAGMA user_version = {USER_VERSION}")
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
        except BaseException:
            con.close()
            raise
        return con

    def _version(self, con: sqlite3.Connection) -> int:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > USER_VERSION:
            raise HistoryError(f"{self.path}: written by a newer popkit (schema {version})", "upgrade popkit to read it")
        return version

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            con = self._open(create=False)
            if con is None:
                return []
            try:
                con.row_factory = sqlite3.Row
                return con.execute(sql, args).fetchall()
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise _problem(self.path, exc) from None

    def _insert(self, row: dict[str, Any]) -> int:
        """One row, in one write transaction: there whole, or not at all. A busy database is waited for,
        and the write retried, until timeout_s has passed since the first try."""
        sql = f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._insert_once(sql, tuple(row.values()), deadline)
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise _problem(self.path, exc) from None
                time.sleep(random.uniform(*RETRY_PAUSE_S))  # a random pause: writers do not retry in step
            except sqlite3.Error as exc:
                raise _problem(self.path, exc) from None

    def _insert_once(self, sql: str, values: tuple, deadline: float) -> int:
        con = self._open(create=True, wait_s=max(deadline - time.monotonic(), 0.001))
        assert con is not None
        try:
            con.execute("BEGIN IMMEDIATE")  # the write lock now, not as an upgrade from a read lock later
            try:
                cur = con.execute(sql, values)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            return int(cur.lastrowid)
        finally:
            con.close()

    # ---------------------------------------------------------------------------------- writes

    def record_run(self, report: RunReport, content: bytes) -> int:
        """Record a local test or bench run; returns its id."""
        return self._insert({
            "kind": "test" if report.mode == "test" else "bench",
            "created_at": report.started_at or _now(), "submission": stored_path(report.submission),
            "sha256": report.sha256,
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
            "kind": "submit", "created_at": _now(), "submission": stored_path(submission), "sha256": sha256,
            "content": content, "task": leaderboard, "leaderboard": leaderboard, "mode": mode,
            "gpu": gpu, "device": None, "outcome": outcome, "score_s": score, "seeds": "[]",
            "remote_id": remote.submission_id if remote is not None else None, "remote_score_s": score,
            "error": error, "remote_json": json.dumps(remote.to_json()) if remote is not None else None,
            "popkit_version": __version__,
        })

    # ----------------------------------------------------------------------------------- reads

    def list_runs(self, task: str | None = None, limit: int = 20, path: Path | str | None = None) -> list[RunRecord]:
        """Newest first; `task` matches the task or leaderboard name; `path` a submission file, or a folder
        (every submission under it). Runs recorded before popkit stored absolute paths match by the path as
        typed then."""
        clauses, args = [], []
        if task:
            clauses.append("(task = ? OR leaderboard = ?)")
            args += [task, task]
        if path is not None:
            target = stored_path(path)
            if Path(path).is_dir():
                prefix = target.rstrip("/") + "/"
                clauses.append("substr(submission, 1, ?) = ?")  # exact: LIKE would ignore case
                args += [len(prefix), prefix]
            else:
                clauses.append("(submission = ? OR submission = ?)")
                args += [target, str(path)]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
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


def stored_path(path: Path | str) -> str:
    """A submission's path as the ledger keeps it: absolute (not resolved: a symlink stays the name you used), so
    that `popkit history --file` finds it from any folder."""
    return os.path.abspath(os.path.expanduser(str(path)))


def shown_path(stored: str, cwd: Path | None = None) -> str:
    """A stored path as a person reads it: relative to the current folder when under it, else under `~`, else
    as stored."""
    cwd = cwd or Path.cwd()
    try:
        return str(Path(stored).relative_to(cwd))
    except ValueError:
        pass
    home = os.path.expanduser("~")
    return "~" + stored[len(home):] if home not in ("", "/") and stored.startswith(home + "/") else stored


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
        faithful=None if "faithful" not in keys or row["faithful"] is None else bool(row["faithful"]),
        report=report, remote=remote)


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


def list_runs(task: str | None = None, limit: int = 20, path: Path | str | None = None) -> list[RunRecord]:
    return History().list_runs(task, limit, path)


def local_runs(sha256: str, task: str, limit: int = 50) -> list[RunRecord]:
    return History().local_runs(sha256, task, limit)


def get_run(run_id: int) -> RunRecord:
    return History().get_run(run_id)
