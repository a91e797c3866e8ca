"""popkit's sandbox: every process that runs submission code in Linux namespaces (docs/design.md, "The sandbox").

Each process (the compile pre-step, every eval, `popkit compile`'s import) starts through util-linux `unshare`
in new user, pid, mount, network, IPC and UTS namespaces; popkit/run/_sandbox.py, process 1 inside, builds a root
from nothing (the system's programs and libraries, a few files of /etc, a minimal /dev with the GPUs' nodes,
the interpreter, popkit, the run's folders and its private build cache: `sandbox_paths`, docs/sandbox.md),
moves into it with pivot_root and starts the process as uid 65534 in a nested user namespace. What that closes:

- files: nothing of HOME, other projects, popkit's own files or /etc beyond what libraries read is visible; the
  task's files and popkit's harness sit read-only in the folder the eval imports from; the processes work in a
  separate writable folder that is on no import path; only that folder and the run's private build cache
  (popkit.toolchain.buildcache: shared only under the submission's own digest) can be written;
- processes: nothing of popkit, its watchdog or other users is visible or signalable in /proc; every
  process dies with the eval; no network and no host unix socket; the key of popkit's closing record comes on
  a descriptor, in no environment or command line.

Where namespaces are unavailable (no `unshare`, user namespaces disabled, not Linux) runs still work,
without it, and every report says `isolation: none, no sandbox: <reason>`; `--require-isolation` makes that exit
11.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from popkit.errors import EnvironmentProblem, UsageError
from popkit.machine import system
from popkit.resources import data_dir, popkit_home
from popkit.run import _sandbox
from popkit.run import proc
from popkit.run.executor import Executor, Isolation, Workspace
from popkit.toolchain import buildcache
from popkit.toolchain import prestep

SANDBOX_SCRIPT = Path(_sandbox.__file__).resolve()
NAMESPACES = "user, pid, mount, network, IPC; uid 65534; read-only files"
UNSHARE_ARGS = ("--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                "--net", "--ipc", "--uts")
ISOLATION_CHOICES = ("auto", "require", "none")
_PROBE_TIMEOUT_S = 20.0
TOOLKIT_ENV = ("CUDA_HOME", "CUDA_PATH", "ROCM_PATH", "ROCM_HOME", "HIP_PATH", "POPKIT_HIP_ON_CUDA")


def private_cache(workspace: Workspace) -> Path:
    """The workspace's private build cache (mounted at _sandbox.CACHE_MOUNT inside)."""
    return workspace.root / "build-cache"


def keyed_build(env: Mapping[str, str]) -> bool:
    """Whether the environment names one of popkit's own build folders (`<popkit home>/build/<digest>`, which
    `popkit tune` gives each extension by the digest of its sources and flags) as TORCH_EXTENSIONS_DIR: the
    processes build there, shared by the variants that build the same extension; nothing else loads it."""
    named = env.get("TORCH_EXTENSIONS_DIR", "")
    if not named or named.startswith(_sandbox.CACHE_MOUNT):
        return False
    return Path(named).resolve().parent == (popkit_home() / "build").resolve()


def build_caches(env: Mapping[str, str]) -> list[str]:
    """Folders an eval may write besides its working folder: the extension build cache torch uses, Triton's
    cache and CUDA's JIT cache (each created if missing)."""
    home = Path(env.get("HOME") or Path.home())
    folders = [prestep.extensions_root(env), Path(env.get("TRITON_CACHE_DIR") or home / ".triton"),
               Path(env.get("CUDA_CACHE_PATH") or home / ".nv")]
    made = []
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            made.append(str(folder.resolve()))
        except OSError:
            continue
    return made


def _prefix_of(executable: str) -> str:
    """The Python installation or virtual environment an interpreter belongs to ('' when it does not look like
    one: then only the interpreter file itself is shown)."""
    prefix = Path(os.path.dirname(os.path.dirname(executable)))
    if (prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir() or any(prefix.glob("lib/python3*")):
        return str(prefix)
    return ""


# The compilers a build may call: torch hands $CC to nvcc as -ccbin, and builds call c++/gcc/nvcc by name.
COMPILER_ENV = ("CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN")
COMPILER_NAMES = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "hipcc")


def compiler_prefixes(env: Mapping[str, str]) -> list[str]:
    """The installations of the compilers a build in the sandbox may run (a compiler outside the system folders,
    e.g. /opt/gcc/bin/gcc named by CC, is shown with its whole installation: its headers, libraries and helpers)."""
    found = []
    for name in [env.get(var, "") for var in COMPILER_ENV] + list(COMPILER_NAMES):
        path = shutil.which(name.split()[0], path=env.get("PATH")) if name else None
        if not path:
            continue
        for candidate in {os.path.abspath(path), os.path.realpath(path)}:
            folder = os.path.dirname(candidate)
            found.append(os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder)
    return found


def sandbox_paths(python: str, env: Mapping[str, str]) -> dict[str, list[str]]:
    """What of the machine a sandboxed process sees besides the system (popkit/run/_sandbox.py: SYSTEM, ETC, SYS,
    DEV): `visible`, whole and read-only: the interpreter and its installation, popkit's own interpreter and
    installation, popkit itself with its harness folder, the CUDA/ROCm toolkit (CUDA_HOME, ROCM_PATH, ...) and
    LD_LIBRARY_PATH; `imports`, showing only their modules and packages: PYTHONPATH and popkit's import path
    outside those; `empty`: HOME, shown as an empty folder. Nothing is shown that is `/` or holds HOME."""
    home = os.path.abspath(env.get("HOME") or str(Path.home()))
    found = shutil.which(python, path=env.get("PATH")) or python
    interpreters = {os.path.abspath(found), os.path.realpath(found)}
    interpreters.update([os.path.abspath(sys.executable), os.path.realpath(sys.executable)])
    visible = set(interpreters) | {_prefix_of(exe) for exe in interpreters}
    visible.update([sys.prefix, sys.exec_prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1]),
                    str(data_dir("tasks").resolve())])
    visible.update(env.get(name, "") for name in TOOLKIT_ENV)
    visible.update(env.get("LD_LIBRARY_PATH", "").split(os.pathsep))
    visible.update(compiler_prefixes(env))

    def shown(path: str) -> bool:
        return bool(path) and os.path.isabs(path) and path != "/" and not _sandbox.within(home, path)

    visible_paths = sorted({os.path.abspath(p) for p in visible if shown(p) and os.path.exists(p)})
    entries = [*env.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
    imports = sorted({os.path.abspath(p) for p in entries if p and os.path.isabs(p) and os.path.isdir(p)
                      and not any(_sandbox.within(os.path.abspath(p), v) for v in visible_paths)
                      and os.path.abspath(p) != "/"})
    return {"visible": visible_paths, "imports": imports, "empty": [home] if home != "/" else []}


class SandboxExecutor(Executor):
    """Runs every process of a workspace in Linux namespaces (module doc)."""

    isolation = Isolation("namespaces", NAMESPACES)
    split_folders = True

    def __init__(self, gpu: str | None = None, unshare: str | None = None):
        super().__init__(gpu)
        self.unshare = unshare or shutil.which("unshare") or "unshare"

    def argv(self, workspace: Workspace, python: str, script: str, args: Sequence[str],
             env: Mapping[str, str]) -> list[str]:
        paths = sandbox_paths(python, env)
        private = workspace.private_cache
        writable = [] if private else build_caches(env)
        if private and keyed_build(env):  # popkit's own build folder of one extension's digest (tune's)
            writable = build_caches({"TORCH_EXTENSIONS_DIR": env["TORCH_EXTENSIONS_DIR"]})[:1]
        spec = _sandbox.spec_args(str(workspace.files.resolve()), str(workspace.cwd.resolve()), writable,
                                  paths["visible"], paths["imports"], paths["empty"],
                                  str(private_cache(workspace).resolve()) if private else "")
        return [self.unshare, *UNSHARE_ARGS, "--", sys.executable or "python3", "-I", "-S", str(SANDBOX_SCRIPT),
                *spec, "--", python, "-s", str(workspace.files.resolve() / script), *args]

    def before(self, workspace: Workspace, python: str, env: Mapping[str, str]) -> Mapping[str, str]:
        """A workspace's processes build in its private cache (popkit.toolchain.buildcache), seeded before the first one
        from the store's entry of the submission's key."""
        if not workspace.private_cache:
            return env
        if workspace.cache_key is None:
            folder = private_cache(workspace)
            buildcache.make_private(folder)
            workspace.cache_key = prestep.cache_key(workspace.submission, python, env) if workspace.submission else ""
            buildcache.seed(workspace.cache_key, folder)
        private = buildcache.private_env(_sandbox.CACHE_MOUNT)
        if keyed_build(env):
            del private["TORCH_EXTENSIONS_DIR"]
        return {**env, **private}

    def after(self, workspace: Workspace) -> None:
        if workspace.private_cache and workspace.cache_key:
            buildcache.publish(workspace.cache_key, private_cache(workspace))

    def holds_build(self, workspace: Workspace, key: str) -> bool | None:
        return buildcache.verified(key) is not None if workspace.private_cache else None

    def finish(self, done: proc.Finished) -> proc.Finished:
        setup = next((line for line in done.stderr.splitlines() if line.startswith(_sandbox.SETUP_FAILED)), "")
        if done.code == _sandbox.SETUP_EXIT and setup:  # the trial said yes, the machine now says no
            _TRIED.clear()
            try:
                _trial_file().unlink()
            except OSError:
                pass
            raise EnvironmentProblem(f"popkit's sandbox could not start: {setup[len(_sandbox.SETUP_FAILED):]}",
                                     "run again (popkit tries the namespaces anew); POPKIT_ISOLATION=none runs "
                                     "without the sandbox, and says so in the report")
        code, stderr = signal_from(done.code, done.stderr)
        return replace(done, code=code, stderr=stderr)


def unavailable(unshare: str | None = None) -> str:
    """Why the sandbox cannot run here ('' when it can): a trial run of the whole layout, once per process and,
    when it works, once per boot of the machine through a small file in popkit's cache folder (the trial costs a
    process start, about 60 ms, on every command otherwise). A negative answer is never kept in the file: a
    sandboxed run cannot write it (its root does not show it), and what else could is not believed."""
    key = unshare or ""
    if key not in _TRIED:
        stamp = _trial_stamp(unshare)
        remembered = _remembered(stamp)
        _TRIED[key] = remembered if remembered is not None else _remember(stamp, _try(unshare))
    return _TRIED[key]


def _trial_stamp(unshare: str | None) -> str:
    """What a trial's answer depends on: this boot, the kernel, the tools and popkit's sandbox script."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        script = SANDBOX_SCRIPT.stat().st_mtime_ns
    except OSError:
        return ""
    return "|".join(map(str, (boot, os.uname().release, unshare or shutil.which("unshare"), sys.executable, script,
                              os.getuid())))


def _trial_file() -> Path:
    return prestep.cache_dir() / "sandbox-trial.json"


def _remembered(stamp: str) -> str | None:
    if not stamp:
        return None
    try:
        found = json.loads(_trial_file().read_text())
    except (OSError, ValueError):
        return None
    # only a yes is ever kept: a record claiming no (written by whatever could write there) is not believed, and a
    # yes that is wrong fails the next run's setup by name (SandboxExecutor.finish), never runs it unsandboxed
    if isinstance(found, dict) and found.get("stamp") == stamp and found.get("reason") == "":
        return ""
    return None


def _remember(stamp: str, reason: str) -> str:
    if stamp and not reason:  # a no is tried again by the next command
        try:
            _trial_file().parent.mkdir(parents=True, exist_ok=True)
            temp = _trial_file().with_suffix(f".{os.getpid()}.tmp")
            temp.write_text(json.dumps({"stamp": stamp, "reason": reason}))
            temp.replace(_trial_file())
        except OSError:
            pass
    return reason


_TRIED: dict[str, str] = {}


def _try(unshare: str | None) -> str:
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    tool = unshare or shutil.which("unshare")
    if not tool:
        return "util-linux `unshare` is not installed"
    root = Path(os.environ.get("TMPDIR") or "/tmp")
    try:
        paths = sandbox_paths(sys.executable, os.environ)
        argv = [tool, *UNSHARE_ARGS, "--", sys.executable or "python3", "-I", "-S", str(SANDBOX_SCRIPT),
                *_sandbox.spec_args(str(root), str(root), (), paths["visible"], paths["imports"], paths["empty"]),
                "--", "true"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`unshare` could not run: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"namespaces refused here: {said[:160]}"
    return ""


def executor_for(isolation: str = "auto", gpu: str | None = None) -> Executor:
    """The executor for a run: the sandbox where namespaces work; `require` raises exit 11 where they do not;
    `none` runs without (isolation none, said in every report)."""
    if isolation == "auto":
        isolation = os.environ.get("POPKIT_ISOLATION", "").strip() or "auto"
        if isolation not in ISOLATION_CHOICES:
            raise UsageError(f"POPKIT_ISOLATION={isolation}: not one of {', '.join(ISOLATION_CHOICES)}",
                             "unset it, or set auto, require or none")
    if isolation not in ISOLATION_CHOICES:
        raise UsageError(f"unknown isolation `{isolation}`", "use auto, require or none")
    if isolation == "none":
        plain = Executor(gpu)
        plain.isolation = Isolation("none", "turned off for this run")
        return plain
    reason = unavailable()
    if not reason:
        return SandboxExecutor(gpu)
    if isolation == "require":
        raise EnvironmentProblem(f"--require-isolation: the sandbox cannot run here: {reason}",
                                 "run on Linux with util-linux `unshare` and user namespaces enabled "
                                 "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)")
    plain = Executor(gpu)
    plain.isolation = Isolation("none", reason)
    return plain


SCRIPT_NAME = "_popkit_probe.py"


def scripts(executor: Executor) -> system.Scripts:
    """system.Scripts through `executor`: each script runs as an eval's process does, in a workspace of its own
    under popkit's watchdog, in the sandbox where `executor` is one (HOME empty, nothing of the user, no network):
    what the interpreter runs at its start (a wrapper named as Python, a `.pth` file) reaches only that. Without
    the sandbox, a plain child of popkit (system.plain), as before."""
    if not executor.isolation.isolated:
        return system.plain

    def run(python: str, script: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> system.Ran:
        with executor.workspace("popkit-probe-") as ws:
            for folder in {ws.files, ws.cwd}:
                folder.mkdir(parents=True, exist_ok=True)
            ws.add(SCRIPT_NAME, script.encode())
            try:
                done = ws.run(python, SCRIPT_NAME, list(args), env, timeout)
            except EnvironmentProblem as exc:  # the sandbox could not start: the script says so, as a failure
                return system.Ran(_sandbox.SETUP_EXIT, "", exc.message)
        return system.Ran(done.code, done.stdout, done.stderr, done.timed_out)

    return run


def scripts_for(isolation: str = "auto") -> system.Scripts:
    """scripts() through the executor an eval of `isolation` gets: the one way popkit's doors run the evals'
    interpreter to learn facts about it."""
    return scripts(executor_for(isolation))


def probe(python: str | None = None, env: Mapping[str, str] | None = None, isolation: str = "auto") -> dict:
    """system.probe, its scripts run as an eval of `isolation` would run (in the sandbox where one is in force;
    `require` where none can be is exit 11, as the run's would be)."""
    return system.probe(python, env=env, scripts=scripts_for(isolation))


def signal_from(code: int, stderr: str) -> tuple[int, str]:
    """An exit code and stderr as a plain run would give them: the sandbox's process 1 reports a signal N that
    killed the eval as exit 128 + N and a last stderr line; that becomes -N, the line dropped."""
    lines = stderr.rstrip("\n").splitlines()
    if code > 128 and lines and lines[-1] == f"{_sandbox.SIGNAL_LINE}{code - 128}":
        return -(code - 128), "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "")
    return code, stderr
