"""A run as a unit of work for another machine: a content-addressed bundle (popkit/distributed/scheduler.py ships it).

A bundle holds everything a worker needs to run what a local run would: the submission's bytes (one file,
or the two of an A/B), the task as loaded here (cases, timeouts, ranking), the bytes of every file the
task's `files` names, the mode, the run options (secret seeds, harness, ...), popkit's identity and the GPU
kind asked for. The task files keep their paths relative to the bundle root, the deepest folder that holds
the task folder and all its sources (at or below the problem-set root), so a source like `../eval.py` is
still `../eval.py` on the worker.

Two digests name it. `TaskFiles.digest` (sha256 over the files' paths and bytes) names the folder a worker
unpacks the task files into, under its popkit cache (`POPKIT_CACHE_DIR`, else `~/.cache/popkit`):
`bundles/<digest>/`, unpacked once per worker machine and re-checked against the digest before every run,
so a run that rewrote a cached file cannot hand the next run a changed eval. `Bundle.digest` covers all of
it, submissions included: two bundles with one digest are the same run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from popkit.errors import TaskError
from popkit.model.tasks import SUBMISSION_SOURCE, Task, TaskFile

MARKER = ".popkit-bundle"  # written last into an unpacked folder: the folder is complete


@dataclass(frozen=True)
class TaskFiles:
    """The files a task's `files` names, by path relative to the bundle root (POSIX, sorted)."""

    task_dir: str  # the task folder, relative to the root ("." when the root is the task folder)
    files: tuple[tuple[str, bytes], ...]  # (path relative to the root, bytes)
    names: tuple[tuple[str, str], ...]  # (name in the working directory, path relative to the root)

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([self.task_dir, self.names]).encode() + b"\0")
        for rel, data in self.files:
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    @property
    def size(self) -> int:
        """Bytes of file content (what crosses the network once per task and worker connection)."""
        return sum(len(data) for _, data in self.files)


@dataclass(frozen=True)
class Bundle:
    """One run (one submission) or one A/B (two submissions, both run on one worker)."""

    task: Task  # as loaded here; its path is replaced by the unpacked folder on the worker
    files_digest: str  # TaskFiles.digest of the files shipped with it
    submissions: tuple[tuple[str, bytes], ...]  # (the path as given, its bytes)
    mode: str  # test | benchmark | leaderboard | profile; an A/B runs benchmark mode
    options: Any  # runner.RunOptions; `python` is None for "the worker's own interpreter"
    popkit: str  # parity.popkit_identity() of the machine that made it: the worker must run the same
    require_gpu: str | None = None  # --require-gpu: the GPU kind a worker must have
    max_rounds: int = 8  # A/B only
    budget_s: float = 60.0  # A/B only

    @property
    def kind(self) -> str:
        return "ab" if len(self.submissions) == 2 else "run"

    @property
    def digest(self) -> str:
        task = {k: v for k, v in dataclasses.asdict(self.task).items() if k != "path"}
        doc = {"task": task, "files": self.files_digest, "mode": self.mode, "popkit": self.popkit,
               "options": dataclasses.asdict(self.options), "require_gpu": self.require_gpu,
               "submissions": [[path, hashlib.sha256(data).hexdigest()] for path, data in self.submissions],
               "ab": [self.max_rounds, self.budget_s] if self.kind == "ab" else None}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def task_files(task: Task) -> TaskFiles:
    """Read every file `task` names (not the submission) with its path relative to the bundle root."""
    task_dir = Path(task.path).resolve()
    sources = {f.name: (task_dir / f.source).resolve() for f in task.files if f.source != SUBMISSION_SOURCE}
    root = Path(os.path.commonpath([task_dir, *(p.parent for p in sources.values())]))
    files, names = {}, []
    for name, path in sources.items():
        rel = PurePosixPath(path.relative_to(root)).as_posix()
        names.append((name, rel))
        try:
            files[rel] = path.read_bytes()
        except OSError as exc:
            raise TaskError(f"{task.yml}: cannot read `{name}` ({path}): {exc.strerror or exc}",
                            "the task's files must be readable to send them to a worker") from None
    rel_task = PurePosixPath(task_dir.relative_to(root)).as_posix()
    return TaskFiles(rel_task, tuple(sorted(files.items())), tuple(names))


def _safe(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return bool(parts) and not PurePosixPath(rel).is_absolute() and ".." not in parts


def _intact(folder: Path, files: TaskFiles) -> bool:
    """Whether every file of `files` is in `folder` with its bytes (a run may have rewritten one)."""
    if not (folder / MARKER).is_file():
        return False
    try:
        return all((folder / rel).read_bytes() == data for rel, data in files.files)
    except OSError:
        return False


def unpack(files: TaskFiles, cache: Path) -> Path:
    """The folder holding `files` under `cache/bundles/<digest>/`, unpacked now unless already intact there.

    Unpacking writes a temporary folder and renames it into place, so workers of one machine racing for
    the same bundle never see half of it. A folder whose files changed since is replaced.
    """
    digest = files.digest
    for rel, _ in files.files:
        if not _safe(rel):
            raise TaskError(f"bundle {digest[:12]}: file path `{rel}` leaves the bundle",
                            "a bundle's paths are relative and stay inside it")
    base = Path(cache) / "bundles"
    dest = base / digest
    if _intact(dest, files):
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=base))
    for rel, data in files.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    (tmp / files.task_dir).mkdir(parents=True, exist_ok=True)
    (tmp / MARKER).write_text(digest + "\n")
    if dest.exists():  # changed since it was unpacked: set it aside, then take its place
        stale = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-stale-", dir=base))
        try:
            os.rename(dest, stale / "old")
        except OSError:
            pass
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, dest)
    except OSError:  # another worker put an intact copy there first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _intact(dest, files):
            raise TaskError(f"bundle {digest[:12]}: cannot unpack into {dest}",
                            "check that the worker's popkit cache folder is writable (POPKIT_CACHE_DIR)") from None
    return dest


def task_in(bundle: Bundle, files: TaskFiles, folder: Path) -> Task:
    """The bundle's task with its files in `folder` (an unpacked TaskFiles): each source relative to it."""
    task_dir = (Path(folder) / files.task_dir).resolve()
    where = dict(files.names)
    moved = tuple(f if f.source == SUBMISSION_SOURCE
                  else TaskFile(f.name, os.path.relpath(Path(folder).resolve() / where[f.name], task_dir))
                  for f in bundle.task.files)
    return dataclasses.replace(bundle.task, path=task_dir, files=moved)
