"""Where an eval's processes run: the one interface between the runner's chain and a place to run it.

An `Executor` gives a `Workspace` (protocol step 1: the task's files flat, the user's bytes under the
task's submission name) and runs processes in it: the compile pre-step and each mode's eval, each below
popkit's watchdog with a timeout (proc.run). After every step the workspace checks the files it wrote
(`tampered`): a changed or replaced task file, or a module planted where an eval would import it, fails
the run as harness tampering and is put right before the next step.

`Executor` runs the processes as they are (isolation none). popkit.run.sandbox.SandboxExecutor runs each
one in Linux namespaces instead; `on_gpu` pins either to one GPU (`--gpus`); popkit.distributed.scheduler ships whole
runs to workers, each of which runs them here (docs/design.md, "Executors").
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import marshal
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from popkit.errors import TaskError, UsageError
from popkit.model.tasks import SUBMISSION_SOURCE, Task
from popkit.resources import harness_paths
from popkit.run import _watchdog
from popkit.run import proc

POPKIT_EVAL_NAME = "popkit_eval.py"  # popkit's harness, when it replaces a task's own eval
# Modules the standard library and the frameworks every eval imports: a file of that name in a folder on an
# eval's import path is imported instead of the real one (`hmac.py`, `torch.py`).
_FRAMEWORKS = frozenset({"torch", "numpy", "triton", "yaml"})
# Modules Python's start-up (site.py) imports from any folder on the import path before an eval's first line runs.
START_UP_MODULES = frozenset({"sitecustomize", "usercustomize", "_distutils_hack"})
_PARSE_LOCK = threading.Lock()  # an A/B prepares both sides on two threads


@dataclass(frozen=True)
class Isolation:
    """How far a run's processes are kept from popkit and the machine: `namespaces` or `none`."""

    level: str
    detail: str  # the namespaces used, or why there are none

    @property
    def isolated(self) -> bool:
        return self.level != "none"

    def __str__(self) -> str:
        return f"none, no sandbox: {self.detail}" if self.level == "none" else f"{self.level} ({self.detail})"

    def to_json(self) -> dict:
        return {"level": self.level, "detail": self.detail}


def shadowable_names(files: Mapping[str, bytes]) -> frozenset[str]:
    """Module names an eval of these files imports: the standard library's, the frameworks', the files' own
    and every top-level module they import."""
    names = set(sys.stdlib_module_names) | _FRAMEWORKS | START_UP_MODULES
    for name, data in files.items():
        if not name.endswith(".py"):
            continue
        names.add(name[:-3])
        try:
            with _PARSE_LOCK:  # CPython 3.11's parser keeps a recursion count that two threads can corrupt
                tree = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return frozenset(names)


def harness_files(files: Mapping[str, bytes], main: str, popkit: bool, where: Path) -> dict[str, bytes]:
    """The files of popkit's harness an eval of `files` needs beside them: all of them with `main` as the entry
    (`popkit`: `--harness popkit`), or, where the task's own `main` is popkit's eval.py, the modules it loads that the
    task does not list. A task file of a module's name with other bytes cannot run beside it (TaskError)."""
    paths = harness_paths(main)
    entry = paths[main].read_bytes()
    if not popkit and files.get(main) != entry:
        return {}
    needed = {main: entry} if popkit else {}
    for name, path in paths.items():
        if name == main:
            continue
        data = path.read_bytes()
        if name in files and files[name] != data:
            raise TaskError(f"{where}: the task's file `{name}` has the name of a module of popkit's harness",
                            "rename that file; popkit's harness loads its own file of that name")
        needed[name] = data
    return needed


def start_up_file(entry: Path) -> bool:
    """Whether `entry` is something Python's start-up reads from a folder on the import path: a `.pth` file
    (whose `import` lines run), `sitecustomize`, `usercustomize` or `_distutils_hack`, or a user site tree
    (`lib/pythonX.Y/site-packages`, read where PYTHONUSERBASE points)."""
    if entry.name.endswith(".pth"):
        return True
    if entry.name == "lib" and entry.is_dir() and not entry.is_symlink():
        return any(p.name.startswith("python") for p in _entries(entry))
    return module_name(entry) in START_UP_MODULES


def closed_env(env: Mapping[str, str], base: str | None = None) -> dict[str, str]:
    """`env` with Python's start-up closed to the folders a process writes: PYTHONPATH entries made absolute
    against `base` (popkit's own folder by default), the empty ones (the child's working folder) dropped, and
    no user site (PYTHONNOUSERSITE: a PYTHONUSERBASE the submission writes is never read)."""
    closed = dict(env)
    if "PYTHONPATH" in closed:
        base = base or os.getcwd()
        entries = [os.path.normpath(os.path.join(base, p)) for p in closed["PYTHONPATH"].split(os.pathsep) if p]
        closed["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
        if not closed["PYTHONPATH"]:
            del closed["PYTHONPATH"]
    closed["PYTHONNOUSERSITE"] = "1"
    return closed


def module_name(entry: Path) -> str:
    """The module a folder entry would be imported as ('' when none): `x.py`, `x.cpython-311-...so`, `x/`
    with an `__init__`, and `__pycache__` itself (its byte code is imported in place of the sources)."""
    if entry.name == "__pycache__":
        return "__pycache__"
    if entry.is_dir() and not entry.is_symlink():
        return entry.name if any((entry / f"__init__{s}").exists() for s in (".py", ".pyc", ".so")) else ""
    stem, dot, suffix = entry.name.partition(".")
    return stem if dot and (suffix in ("py", "pyc", "pyw") or suffix.endswith(("so", "pyd"))) else ""


class Workspace:
    """One run's folder. `files` holds what popkit wrote (the eval's import folder); processes start in `cwd`.

    Here both are one folder, as on the leaderboard's runner; a sandbox keeps `files` read-only and gives
    the processes a separate writable `cwd` holding copies (popkit.run.sandbox).
    """

    def __init__(self, executor: "Executor", root: Path, files: Path, cwd: Path):
        self.executor, self.root, self.files, self.cwd = executor, root, files, cwd
        self.written: dict[str, bytes] = {}  # every file popkit wrote but the submission
        self.submission_name = ""
        self._task_names = _TaskNames({})  # shadowable_names of the task's files alone
        self._other_names: frozenset[str] = frozenset()  # the submission's, and those of files added since
        self._after_start: list[Callable[[], None]] = []
        self.submission = b""  # the submission's bytes as last written (the sandbox's build cache key)
        self.private_cache = True  # a sandbox gives the processes a private build cache (popkit.toolchain.buildcache)
        self.cache_key: str | None = None  # set by the executor before the first process (None: not yet)

    def prepare(self, task: Task, submission: bytes, harness: str = "task", later: bool = False) -> str:
        """Write the task's files and the user's bytes; returns the eval file to run (the task's `config.main`,
        or popkit's harness). `later`: the module names the task's files import (the tamper check's, read with
        `ast`) are read on a thread once the first process has started, not before it starts."""
        if task.lang != "py":
            raise TaskError(f"{task.yml}: `lang: {task.lang}` tasks are not supported",
                            "popkit runs `lang: py` tasks (all public problems are)")
        if harness not in ("task", "popkit"):
            raise UsageError(f"unknown harness `{harness}`", "use --harness task or --harness popkit")
        files: dict[str, bytes] = {}
        for f in task.files:
            if f.source == SUBMISSION_SOURCE:
                self.submission_name = f.name
                files[f.name] = submission
            else:
                files[f.name] = (task.path / f.source).read_bytes()
        main = POPKIT_EVAL_NAME if harness == "popkit" else task.main
        files.update(harness_files(files, main, harness == "popkit", task.yml))
        self.written = {name: data for name, data in files.items() if name != self.submission_name}
        self.submission = submission
        self._task_names = _TaskNames(self.written)
        if later:
            self.after_start(self._task_names.start)
        else:
            self._task_names.result()
        self._other_names = shadowable_names({self.submission_name: submission})
        for folder in self._folders():
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                (folder / name).write_bytes(data)
        return main

    def add(self, name: str, data: bytes) -> None:
        """One more file beside the task's (a driver, a variant), written where the task's files are and checked
        after every step as they are."""
        self.written[name] = data
        self._other_names = self._other_names | {name[:-3]} if name.endswith(".py") else self._other_names
        for folder in self._folders():
            (folder / name).write_bytes(data)

    def _folders(self) -> list[Path]:
        return [self.files] if self.cwd == self.files else [self.files, self.cwd]

    def write_cases(self, name: str, text: str) -> None:
        """The cases file under `name` in `cwd`. Whatever the submission left there under that name (a FIFO,
        a link, a folder) is removed first and the file is created anew, never followed or opened."""
        path = self.cwd / name
        _remove(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def run(self, python: str, script: str, args: Sequence[str], env: Mapping[str, str], timeout_s: float, *,
            result_fd_env: str | None = None, inputs: Mapping[str, bytes | int] | None = None,
            watch: Callable[[bytes], None] | None = None,
            deadline: Callable[[], float | None] | None = None) -> proc.Finished:
        """`python script args...` started in `cwd`, its script taken from `files`; see proc.run."""
        env = self.executor.before(self, python, env)
        argv = self.executor.argv(self, python, script, args, env)
        try:
            return self.executor.finish(proc.run(argv, self.cwd, self.executor.env(env), timeout_s,
                                                 result_fd_env=result_fd_env, inputs=inputs, watch=watch,
                                                 deadline=deadline, started=self._started))
        finally:
            self.executor.after(self)

    def after_start(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, right after the next process of this workspace has started: work that goes on
        beside it (on a thread of its own) is then off the path to its start."""
        self._after_start.append(callback)

    def _started(self) -> None:
        pending, self._after_start = self._after_start, []
        for callback in pending:
            callback()

    def replace_submission(self, submission: bytes) -> None:
        """Put new bytes under the submission's name in every folder (a warm start's workspace, before `go`):
        each file is removed and created anew, never followed, and the tamper check learns the modules the new
        bytes import. In a sandbox `files` is read-only only inside it; popkit writes it from outside."""
        for folder in self._folders():
            path = folder / self.submission_name
            _remove(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(submission)
        self._other_names = shadowable_names({self.submission_name: submission})
        self.submission, self.cache_key = submission, None

    def tampered(self, during: str) -> str:
        """Put back every task file the submission changed, replaced or removed `during` a step, and remove
        every module it planted where an eval imports from (`hmac.py`, a package, byte code).

        Returns the harness-tampering line naming them, or "" when nothing was touched. Nothing of the
        submission runs between steps (its process tree is gone), so checking after each step is checking
        before the next.
        """
        shadowable = self._task_names.result() | self._other_names
        changed: set[str] = set()
        planted: set[str] = set()
        stuck: set[str] = set()
        for folder in self._folders():
            for name, data in self.written.items():
                if not _holds(folder / name, data):
                    changed.add(name)
                    try:
                        _remove(folder / name)
                        (folder / name).write_bytes(data)
                    except OSError:
                        stuck.add(name)
            for entry in _entries(folder):
                module = module_name(entry)
                if entry.name in self.written or entry.name == self.submission_name:
                    continue
                if start_up_file(entry):
                    planted.add(entry.name)
                    _remove(entry)
                    continue
                if not module:
                    continue
                if module == "__pycache__":
                    planted.update(f"__pycache__/{p.name}" for p in _entries(entry) if forged_byte_code(p, folder))
                    _remove(entry)  # an eval compiles its sources again
                elif module in shadowable:
                    planted.add(entry.name)
                    _remove(entry)
        lines = []
        if changed:
            them = "it" if len(changed) == 1 else "them"
            done = (f"popkit could not restore {', '.join(sorted(stuck))}: no later step runs" if stuck
                    else f"popkit restored {them}")
            lines.append(f"the submission modified {', '.join(sorted(changed))} during {during}; the leaderboard "
                         f"would run the modified file ({done})")
        if planted:
            lines.append(f"the submission wrote {', '.join(sorted(planted))} into the working folder during "
                         f"{during}; the leaderboard's next eval would import it in place of the real module "
                         "(popkit removed it)")
        return "harness tampering: " + "; ".join(lines) if lines else ""


class _TaskNames:
    """shadowable_names of a workspace's task files: read when first asked for, or on a thread from start() on.
    What the thread could not read (another thread parsing at the same time can upset CPython 3.11's parser)
    is read again when asked for."""

    def __init__(self, files: Mapping[str, bytes]):
        self._files = dict(files)
        self._names: frozenset[str] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None and self._names is None:
                self._thread = threading.Thread(target=self._read, name="popkit-task-names", daemon=True)
                self._thread.start()

    def _read(self) -> None:
        try:
            self._names = shadowable_names(self._files)
        except Exception:  # result() reads them again, on its caller's thread
            pass

    def result(self) -> frozenset[str]:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        if self._names is None:
            self._names = shadowable_names(self._files)
        return self._names


def forged_byte_code(pyc: Path, folder: Path) -> bool:
    """Whether `pyc` (in `folder`/__pycache__) holds code other than its source's in `folder`: Python imports
    such byte code in place of the source. Byte code of another Python version cannot be judged (False)."""
    source = folder / (pyc.name.split(".")[0] + ".py")
    try:
        data = pyc.read_bytes()
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return False
        optimize = int(pyc.name.split(".opt-")[1][0]) if ".opt-" in pyc.name else 0
        # dont_inherit: else the code compiled here takes this module's `from __future__ import annotations` flag,
        # and an eval's own byte code of an honest file never equals it
        return marshal.loads(data[16:]) != compile(source.read_bytes(), str(source), "exec", optimize=optimize,
                                                   dont_inherit=True)
    except (OSError, ValueError, EOFError, TypeError, SyntaxError, IndexError):
        return True


def _holds(path: Path, data: bytes) -> bool:
    try:
        return not path.is_symlink() and path.is_file() and path.read_bytes() == data
    except OSError:
        return False


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _remove(path: Path) -> bool:
    """Remove whatever `path` is (file, link, FIFO, folder), read-only or immutable, never following a link."""
    return _watchdog.force_remove(str(path))


class Executor:
    """Runs a workspace's processes on this machine as they are: no isolation beyond popkit's watchdog.

    `gpu` pins every process to one GPU (CUDA_VISIBLE_DEVICES, `--gpus`).
    """

    isolation = Isolation("none", "processes run as your user, in one folder, as on the leaderboard's runner")
    split_folders = False  # a sandbox keeps the files read-only and the working folder apart

    def __init__(self, gpu: str | None = None):
        self.gpu = gpu

    def on_gpu(self, gpu: str) -> "Executor":
        """This executor, with every process it runs pinned to `gpu`."""
        pinned = self.__class__.__new__(self.__class__)
        pinned.__dict__.update(self.__dict__, gpu=gpu)
        return pinned

    @contextlib.contextmanager
    def workspace(self, prefix: str = "popkit-run-", keep: bool = False) -> Iterator[Workspace]:
        """A fresh workspace, removed when the block ends (or by a guard when popkit dies first)."""
        with proc.WorkDir(prefix, keep=keep) as root:
            yield self.new_workspace(root)

    def new_workspace(self, root: Path) -> Workspace:
        """A workspace in the existing folder `root` (an A/B keeps both sides under one WorkDir)."""
        if self.split_folders:
            return Workspace(self, root, root / "files", root / "work")
        return Workspace(self, root, root, root)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment a process gets: `env`, start-up closed (closed_env), pinned to this executor's GPU."""
        pinned = closed_env(env)
        if self.gpu is not None:
            pinned["CUDA_VISIBLE_DEVICES"] = self.gpu
        return pinned

    def before(self, workspace: Workspace, python: str, env: Mapping[str, str]) -> Mapping[str, str]:
        """The environment of a process about to start in `workspace` (a sandbox points its build caches at the
        workspace's private one)."""
        return env

    def after(self, workspace: Workspace) -> None:
        """After each process of `workspace` (a sandbox shares what it built, under its key)."""

    def holds_build(self, workspace: Workspace, key: str) -> bool | None:
        """Whether the build cache the workspace's processes will see holds the build of `key` (None: the shared
        cache of the environment, which prestep's index judges)."""
        return None

    def argv(self, workspace: Workspace, python: str, script: str, args: Sequence[str],
             env: Mapping[str, str]) -> list[str]:
        """The command line of `python script args` in `workspace`; `env` is the environment it will get. `-s`:
        no user site folder (closed_env says it again for the processes the script starts)."""
        return [python, "-s", script, *args]

    def finish(self, done: proc.Finished) -> proc.Finished:
        """How the process ended, as a plain child's would read (a sandbox maps its signal report back)."""
        return done
