"""A local Ray instance that nothing outlives: `--cluster ray` without an address (ray_session.connect).

`ray.init()` would start the instance's processes (GCS, raylet, their agents, Ray's workers) as children of popkit:
killed by SIGKILL, popkit runs no handler, the GCS and raylet follow it but their agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) live on for minutes, and the session folder (logs, sockets) stays in TMPDIR. So popkit
starts the instance's head itself, `ray start --head --block`, below its watchdog (popkit's watchdog in its `own` mode):
a child subreaper, so every process of the instance stays in its tree whatever it does, which kills that whole
tree when popkit's pipe to it closes (popkit ends the block, or the kernel closes it because popkit died) and then
removes the instance's folder. popkit then joins the head as a driver (`ray.init(address=...)`), which starts no
process.

Everything of the instance lives in that folder: a fresh one in TMPDIR (in /tmp where TMPDIR is too long for
Ray's socket paths), mode 0700, every process in it started
with umask 077: Ray's temp_dir (sessions, logs, sockets), the TMPDIR of the instance's processes (the workers'
runs make their working folders there), an empty working folder (Ray puts a process's folder on every worker's
import path) and the instance's token. Ray's token authentication stays on, with a fresh token for the
instance in that folder (RAY_AUTH_TOKEN_PATH): nothing is written to ~/.ray. The dashboard is not started. The
instance's workers import the popkit the driver runs: its folder goes first on their PYTHONPATH unless it is an
installed one (import_path).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping

from popkit.errors import EnvironmentProblem
from popkit.run import proc

START_TIMEOUT_S = 180.0  # `ray start` takes 3-7 s; a machine busy compiling may take much longer
STOP_WAIT_S = proc.KILL_WAIT_S * 6  # the watchdog kills the tree (2 s at most) and removes the folder
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")
POPKIT_SOURCE = Path(__file__).resolve().parents[2]  # the folder holding this popkit package
SOCKET_PATH_MAX = 107  # a unix socket's path, less its final NUL
# The longest socket path Ray makes below the folder's parent (a session name holds a date, a time and a pid)
SOCKET_TAIL = len("/popkit-ray-XXXXXXXX/r/session_YYYY-MM-DD_HH-MM-SS_UUUUUU_PPPPPPP/sockets/plasma_store")
_TOKEN: list[str] = []  # one token per popkit process: Ray may keep the first one it read for the process's life


@dataclass(frozen=True)
class Head:
    """A running local instance: the address to join, and the empty folder to join it from."""

    address: str
    folder: Path
    cwd: Path


def _token() -> str:
    if not _TOKEN:
        _TOKEN.append(secrets.token_hex(32))
    return _TOKEN[0]


def head_argv(folder: Path, slots: int | None, object_store_bytes: int, config: Mapping[str, Any]) -> list[str]:
    """`ray start --head --block` for an instance living in `folder`: any free port, no dashboard, no usage
    statistics, `config` as Ray's system config."""
    argv = [sys.executable or "python3", "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--port", "0", "--temp-dir", str(folder / "r"), "--include-dashboard", "false",
            "--disable-usage-stats", "--object-store-memory", str(object_store_bytes),
            "--system-config", json.dumps(dict(config)), "--log-style", "record", "--log-color", "false"]
    if slots is not None:
        argv += ["--num-cpus", str(slots)]
    return argv


def head_env(folder: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The instance's environment: `env`, with its token in the folder and its temporary files in it, and the
    folder this popkit was imported from first on the import path (import_path)."""
    out = {k: v for k, v in env.items() if k not in AUTH_ENV and k != "RAY_ADDRESS"}
    out.update(auth_env(folder), TMPDIR=str(folder / "tmp"), RAY_TMPDIR=str(folder / "tmp"),
               RAY_USAGE_STATS_ENABLED="0", **import_path(env))
    return out


def import_path(env: Mapping[str, str], source: Path = POPKIT_SOURCE) -> dict[str, str]:
    """PYTHONPATH for the instance's workers, where they would not import this popkit: a checkout that is not
    installed (found through the working folder or a PYTHONPATH of the driver's own) or another version than
    their Python's. `source`, the folder holding this popkit, goes first; {} where it is one of Python's
    site-packages folders (an installed popkit: its workers find it there, and it never goes before the standard
    library) or already first."""
    import site

    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    installed = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if source.resolve() in installed or (paths and Path(paths[0]).resolve() == source.resolve()):
        return {}
    return {"PYTHONPATH": os.pathsep.join([str(source), *paths])}


def auth_env(folder: Path) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder / "token")}


def parent_folder() -> str:
    """Where the instance's folder goes: TMPDIR, or /tmp where Ray's socket paths below TMPDIR would be longer than
    a unix socket's path may be (TMPDIR longer than 21 characters)."""
    temp = tempfile.gettempdir()
    return temp if len(temp) + SOCKET_TAIL <= SOCKET_PATH_MAX else "/tmp"


def _make_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="popkit-ray-", dir=parent_folder()))  # 0700
    for name in ("tmp", "cwd", "r"):
        (folder / name).mkdir(mode=0o700)
    fd = os.open(folder / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_token())
    return folder


def read_address(folder: Path) -> str | None:
    """The address `ray start` wrote once its head runs (`HOST:PORT`), or None before."""
    try:
        text = (folder / "r" / "ray_current_cluster").read_text().strip()
    except OSError:
        return None
    host, sep, port = text.rpartition(":")
    return text if sep and host and port.isdigit() else None


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["it exited without a word"])[-1][:300]


@contextlib.contextmanager
def started(slots: int | None, object_store_bytes: int, config: Mapping[str, Any],
            meanwhile: Callable[[], None] = lambda: None) -> Iterator[Head]:
    """A local instance for the block; when the block ends (or popkit dies) its processes and folder are gone.
    `meanwhile` runs while the head starts (the driver's own `import ray`, a second of its own).

    Raises EnvironmentProblem (exit 11) with Ray's own last word when the head does not start."""
    folder = _make_folder()
    lifeline_r, lifeline_w = os.pipe()
    status_r, status_w = os.pipe()
    log = tempfile.TemporaryFile(dir=folder)  # no name: popkit reads it when the head fails
    try:
        reaper = subprocess.Popen(
            [*proc.watchdog_argv("own", str(status_w), str(lifeline_r), str(folder), "--"),
             *head_argv(folder, slots, object_store_bytes, config)],
            cwd=folder / "cwd", env=head_env(folder, os.environ), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, pass_fds=(status_w, lifeline_r), start_new_session=True, umask=0o077)
    except BaseException:
        for fd in (lifeline_w, status_r):
            os.close(fd)
        log.close()
        proc.force_remove(folder)
        raise
    finally:
        for fd in (lifeline_r, status_w):
            os.close(fd)
    try:
        meanwhile()
        yield Head(_wait_for_address(folder, reaper, log), folder, folder / "cwd")
    finally:
        os.close(lifeline_w)  # the watchdog kills the instance's whole tree, then removes the folder
        try:
            reaper.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()
        os.close(status_r)
        log.close()
        proc.force_remove(folder)  # a watchdog that could not is not waited for again


def _wait_for_address(folder: Path, reaper: subprocess.Popen, log: IO[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        address = read_address(folder)
        if address is not None:
            return address
        if reaper.poll() is not None:
            raise EnvironmentProblem(f"cannot start a local Ray instance: {_tail(log)}",
                                     "`ray start --head` shows Ray's own error")
        time.sleep(0.05)
    raise EnvironmentProblem(f"cannot start a local Ray instance: its head did not answer within "
                             f"{START_TIMEOUT_S:.0f} s", "`ray start --head` shows Ray's own error")


@contextlib.contextmanager
def driver_auth(head: Head) -> Iterator[None]:
    """This process joins `head` with its token for the block (RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH in its
    environment, where Ray reads them); the environment is as it was after."""
    saved = {name: os.environ.get(name) for name in AUTH_ENV}
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(auth_env(head.folder))
    _reload_auth()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reload_auth()


def _reload_auth() -> None:
    """Ray reads its authentication settings once per process and keeps the token it loaded: both are read
    again (what Ray's own start of a local instance does; an older Ray without these reads them at import)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return
    try:
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (AttributeError, RuntimeError):
        pass
