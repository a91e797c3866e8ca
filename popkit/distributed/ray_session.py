"""Ray for popkit: a local instance started for one call, or a running cluster joined (popkit/distributed/scheduler.py).

`connect(None)` starts a local Ray instance (Ray's own head, the API of a cluster; popkit/distributed/ray_local.py:
nothing of it outlives popkit) and stops it when the block ends; `connect(ADDRESS)` joins a running cluster, after
a TCP connection to it answered within 5 s (Ray alone retries for minutes), and only disconnects. Ray is optional:
it is imported inside functions only, and its absence is exit 11 with the line that installs it. So is logging,
which only a cluster run uses (every command of the CLI imports this module).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from popkit.distributed import ray_local
from popkit.errors import EnvironmentProblem, Interrupted, UsageError
from popkit.progress import Progress
from popkit.run import proc

INSTALL = "pip install 'popkit[ray]'"
CONNECT_TIMEOUT_S = 5.0  # a TCP connect to a cluster's address; Ray itself would retry for minutes
OBJECT_STORE_BYTES = 256 * 2**20  # a local instance moves bundles and reports (KiB to MiB), never tensors
# A Ray worker that exits (a cancelled run's, with force) SIGKILLs its child processes by default, and the
# raylet kills the process group of a worker that died: popkit's watchdogs among them, before they could kill
# what the run left (a detached grandchild) and remove its working directory. With both off, a watchdog does what
# it does when popkit dies: it sees its lifeline close and takes the run's whole process tree with it. The first
# is the worker's own setting: the local instance's system config carries it to its workers; on a cluster it goes
# in this job's environment (a runtime_env, whose set-up costs seconds, so only there); the second is the
# raylet's, set here for a local instance and by `RAY_process_group_cleanup_enabled=0 ray start ...` on a cluster
# (README).
# A local instance also runs Ray's v2 autoscaler monitor. It never autoscales either way, but the v1 monitor
# answers the SIGTERM of `ray.shutdown` by reporting its own "failure" to the GCS that shutdown has already
# stopped, and is SIGKILLed only after Ray's 1 s grace: a second of every stop (benchmarks section 18).
WORKER_ENV = {"RAY_kill_child_processes_on_worker_exit": "0"}
LOCAL_CONFIG = {"kill_child_processes_on_worker_exit": False, "process_group_cleanup_enabled": False,
                "enable_autoscaler_v2": True}


def address_of(spec: str, env: Mapping[str, str] | None = None) -> str | None:
    """`--cluster SPEC` -> the address to join, or None for a local instance started here.

    `ray`: RAY_ADDRESS when set (Ray's own variable), else a local instance; `ray:ADDRESS`: that address
    (`HOST:PORT`, `ray://HOST:PORT` for Ray Client, `auto` for the cluster `ray start` began on this machine).
    """
    kind, sep, address = spec.partition(":")
    if kind != "ray":
        raise UsageError(f"--cluster {spec}: unknown cluster `{kind}`",
                         "use --cluster ray (a local Ray instance) or --cluster ray:HOST:PORT (a running cluster)")
    address = address.strip() if sep else (os.environ if env is None else env).get("RAY_ADDRESS", "").strip()
    if sep and not address:
        raise UsageError(f"--cluster {spec}: no address after `ray:`", "e.g. --cluster ray:10.0.0.5:6379")
    return None if address in ("", "local") else address


def _host_port(address: str) -> tuple[str, int] | None:
    bare = address.removeprefix("ray://")
    if bare == "auto":
        return None
    host, sep, port = bare.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--cluster ray:{address}: not HOST:PORT",
                         "give the address `ray start --head` printed, e.g. --cluster ray:10.0.0.5:6379")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail at once (exit 11, naming the address) where nothing answers; Ray would retry for minutes."""
    target = _host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise EnvironmentProblem(f"cannot reach the Ray cluster at {address}: {reason}",
                                 "start its head there with `ray start --head` (it prints the address to join), "
                                 "or check the address, the port and the firewall") from None


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem("--cluster ray needs Ray, which is not installed here",
                                 f"install it with: {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class Session:
    ray: Any
    address: str
    embedded: bool


def _shutdown(ray: Any) -> None:
    try:
        ray.shutdown(wait_for_processes=True)  # Ray 2.5x: return once raylet and GCS are gone
    except TypeError:
        ray.shutdown()


@contextlib.contextmanager
def connect(address: str | None, progress: Progress, slots: int | None = None) -> Iterator[Session]:
    """Ray for the block: a local instance (address None) or the cluster at `address`; disconnected after.

    A local instance (popkit/distributed/ray_local.py) offers at most `slots` CPU slots (the runs that can go at
    once, cluster.local_slots), and never more than the cores: Ray starts a worker process per slot as it starts,
    each importing Ray beside the first evals; its processes and its folder are gone when the block ends, or when
    popkit dies. A process already connected (a library caller ran ray.init) keeps its connection, before and after.
    """
    loaded = sys.modules.get("ray")
    if loaded is not None and loaded.is_initialized():
        with _signals_named():
            yield Session(loaded, "this process's Ray connection", embedded=False)
        return
    if address is not None:
        check_reachable(address)
    progress("starting a local Ray instance" if address is None else f"joining the Ray cluster at {address}")
    import logging

    options: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False)
    if address is not None:
        ray = import_ray()
        options.update(include_dashboard=False, runtime_env={"env_vars": WORKER_ENV})
        with proc.WorkDir("popkit-ray-") as empty:  # removed by its guard too, when popkit dies
            _init(ray, address, options, str(empty), local=False)
            try:
                with _signals_named():
                    yield Session(ray, address, embedded=False)
            finally:
                _shutdown(ray)
        return
    cpus = None if slots is None else max(1, min(os.cpu_count() or 1, slots))
    imported: list = []  # Ray, imported here while the head starts
    with ray_local.started(cpus, OBJECT_STORE_BYTES, LOCAL_CONFIG, lambda: imported.append(import_ray())) as head, \
            ray_local.driver_auth(head):
        ray = imported[0]
        _init(ray, head.address, options, str(head.cwd), local=True)
        try:
            with _signals_named():
                yield Session(ray, "local", embedded=True)
        finally:
            _shutdown(ray)


def private_token(path: Path) -> bool:
    """Ray writes its authentication token readable by every user (0644): made 0600, its folder 0700, without
    following a link. Whether it changed anything."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not os.fstat(fd).st_mode & 0o077:
            return False
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    folder = path.parent
    if not folder.is_symlink() and folder.stat().st_mode & 0o077:
        os.chmod(folder, 0o700)
    return True


def _init(ray: Any, address: str, options: Mapping[str, Any], folder: str, local: bool) -> None:
    """ray.init from `folder`, an empty one: Ray puts the current folder of the process that calls it first on
    the import path of every worker. Called from the folder of the submissions, a worker would import `popkit`, or
    any module, from there before its own (a checkout of another popkit, a `json.py` beside the submissions). What
    Ray raises is exit 11, naming the address (or the local instance)."""
    saved, here = _stop_handlers(), os.getcwd()
    try:
        os.chdir(folder)
        ray.init(address=address, **options)
        if not local:
            private_token(Path(os.path.expanduser("~")) / ".ray" / "auth_token")
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...: each is "cannot"
        _shutdown(ray)
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if local:
            raise EnvironmentProblem(f"cannot join the local Ray instance popkit started: {detail}",
                                     "`ray start --head` shows Ray's own error") from None
        raise EnvironmentProblem(f"cannot join the Ray cluster at {address}: {detail}",
                                 "`ray status` on the head says whether it runs; a cluster with token authentication "
                                 "(Ray's default) needs RAY_AUTH_MODE=token and its token here (the head's "
                                 "~/.ray/auth_token, or RAY_AUTH_TOKEN)") from None
    except BaseException:  # Ctrl-C while Ray starts: what started goes again
        _shutdown(ray)
        raise
    finally:
        os.chdir(here)
        _restore(saved)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_handlers() -> dict:
    return {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}


@contextlib.contextmanager
def _signals_named() -> Iterator[None]:
    """A stop signal that arrives while Ray waits (ray.wait, ray.get) ends the block as Interrupted(that
    signal), as anywhere else in popkit. Ray turns whatever a signal handler raises inside its waits into a
    bare KeyboardInterrupt, which would read as SIGINT (exit 130) for a SIGTERM; so each handler popkit has
    installed is wrapped, for the block, in one that notes the signal first."""
    seen: list[int] = []
    wrapped = {}
    for sig, handler in _stop_handlers().items():
        if callable(handler):
            def noting(signum, frame, handler=handler):
                seen.append(signum)
                return handler(signum, frame)
            try:
                signal.signal(sig, noting)
                wrapped[sig] = (noting, handler)
            except ValueError:  # not the main thread: no handler runs here
                break
    try:
        yield
    except KeyboardInterrupt as exc:
        if seen and not isinstance(exc, Interrupted):
            raise Interrupted(seen[0]) from None
        raise
    finally:
        for sig, (noting, handler) in wrapped.items():
            if signal.getsignal(sig) is noting:  # popkit's own handler may have set SIG_IGN since: it stays
                signal.signal(sig, handler)


def _restore(saved: dict) -> None:
    """Ray's init installs its own SIGTERM handler in the driver; popkit's (cli.main) must stay."""
    for sig, handler in saved.items():
        try:
            if handler is not None:
                signal.signal(sig, handler)
        except ValueError:  # not the main thread: nothing was replaced there either
            pass
