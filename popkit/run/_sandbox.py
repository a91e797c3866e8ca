"""The first process inside popkit's sandbox. Standard library only: popkit runs it as a script.

    unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc --net --ipc --uts -- \\
        python -I -S _sandbox.py --files DIR --cwd DIR [--writable DIR]... [--visible PATH]... -- ARGV...

`unshare` (util-linux) makes the namespaces; this script is process 1 of the new pid namespace and, as
root of the new user namespace, lays out the mounts (see `mount_layout`): every mount read-only, the
working folder and the build caches writable, fresh /tmp, /dev/shm and /run, the loopback interface up.
It then starts ARGV in a nested user namespace as uid and gid 65534 (no capabilities, no_new_privs),
reaps everything, and exits with ARGV's exit code (128 + N, with a last line on stderr, when signal N
killed it). When it exits, the kernel kills every process left in the namespace.

The spec (`spec_args` writes it): `files` (the task's files as popkit wrote them) stays read-only; `cwd` and
each `writable` folder are writable; each `visible` path under a replaced folder (the interpreter, its
packages, when they live under /tmp) stays visible, read-only, but one that holds those folders; all keep their
paths. Every sandboxed process waits for this script's start-up, so it imports little: no json (the spec is plain
arguments) and `_socket`, the C module under socket.py, whose enums and selectors would double that start-up.
"""

from __future__ import annotations

import _socket
import ctypes
import fcntl
import os
import struct
import sys

CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 1
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
SANDBOX_UID = 65534
SIGNAL_LINE = "popkit-sandbox: killed by signal "
SETUP_FAILED = "popkit-sandbox: setup failed: "  # then the reason; the exit code is SETUP_EXIT
SETUP_EXIT = 125

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be laid out; the message names the step."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def read_only_everywhere() -> None:
    """Every mount below / read-only: mount_setattr(2) recursively, else each mount point in turn."""
    number = SYS_MOUNT_SETATTR.get(os.uname().machine)
    if number is not None:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        if _libc.syscall(number, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
            return
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    for point in sorted(set(points), key=len):
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        if _libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
            # A mount locked with nosuid/nodev/noexec by the outer namespace keeps them: say them again.
            stat = os.statvfs(point) if os.path.exists(point) else None
            extra = (MS_NOSUID if stat and stat.f_flag & os.ST_NOSUID else 0) | (
                MS_NODEV if stat and stat.f_flag & os.ST_NODEV else 0)
            _libc.mount(None, point.encode(), None, ctypes.c_ulong(flags | extra), None)


def bind_writable(fds: dict[str, int]) -> None:
    """Each folder (opened before /tmp was replaced) mounted writable at its own path."""
    for path, fd in fds.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        mount(None, path, None, MS_BIND | MS_REMOUNT)  # a bind copies the read-only flag: clear it
        os.close(fd)


FRESH = ("/tmp", "/dev/shm", "/run")  # replaced by empty tmpfs in the sandbox


def within(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def under_fresh(path: str) -> bool:
    return any(within(path, top) for top in FRESH)


def keep_visible(fds: dict[str, int]) -> None:
    """Paths under a replaced folder that the processes need (the interpreter, its packages), mounted read-only
    at their own paths again, outermost first."""
    for path, fd in sorted(fds.items()):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                open(path, "a").close()
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)


def mount_layout(spec: dict) -> None:
    """The file system the eval sees: read-only but for its working folder and the build caches."""
    held = [spec["files"], spec["cwd"], *spec["writable"]]
    keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in held if os.path.isdir(p)}
    # A visible path holding one of those (a fresh folder itself: `python -m popkit` run from /tmp puts /tmp on
    # popkit's import path) would cover it read-only; the processes do not need it, so it stays fresh.
    wanted = sorted(p for p in spec.get("visible", ()) if under_fresh(p) and os.path.exists(p)
                    and not any(within(h, p) for h in held))
    outermost = [p for p in wanted if not any(p != q and within(p, q) for q in wanted)]
    visible = {p: os.open(p, os.O_PATH) for p in outermost}
    read_only_everywhere()
    # This namespace's own /proc (unshare --mount-proc) stays writable: the user-namespace maps are written there.
    mount(None, "/proc", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for fresh in FRESH:
        if os.path.isdir(fresh) and not os.path.islink(fresh):
            mount("tmpfs", fresh, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    keep_visible(visible)
    files_fd = keep.pop(spec["files"], None)
    if files_fd is not None:  # read-only, at its own path (which may have been under /tmp)
        os.makedirs(spec["files"], exist_ok=True)
        mount(f"/proc/self/fd/{files_fd}", spec["files"], None, MS_BIND)
        mount(None, spec["files"], None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(files_fd)
    bind_writable(keep)


def loopback_up() -> None:
    """The new network namespace's `lo` up, for evals that rendezvous on localhost (multi-GPU)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))
    finally:
        s.close()


def become_nobody() -> None:
    """A nested user namespace in which this process is uid and gid 65534: it keeps no capability after exec,
    so the mounts above cannot be undone."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {outer_gid} 1")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


_SPEC_LISTS = ("writable", "visible")


def spec_args(files: str, cwd: str, writable: list[str] | tuple[str, ...] = (),
              visible: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The spec as this script's arguments (before `--`): a flag and its value, in pairs."""
    args = ["--files", files, "--cwd", cwd]
    for flag, paths in (("--writable", writable), ("--visible", visible)):
        for path in paths:
            args += [flag, path]
    return args


def parse_spec(args: list[str]) -> tuple[dict, list[str]] | None:
    """(spec, ARGV) from spec_args' pairs, `--` and ARGV; None when they are not that (a value may be anything)."""
    spec: dict = {"files": None, "cwd": None, "writable": [], "visible": []}
    i = 0
    while i < len(args) and args[i] != "--":
        key = args[i][2:] if args[i].startswith("--") else ""
        if key not in spec or i + 1 >= len(args):
            return None
        if key in _SPEC_LISTS:
            spec[key].append(args[i + 1])
        else:
            spec[key] = args[i + 1]
        i += 2
    argv = args[i + 1:]
    if spec["files"] is None or spec["cwd"] is None or not argv:
        return None
    return spec, argv


def main(args: list[str]) -> int:
    parsed = parse_spec(args)
    if parsed is None:
        print("usage: _sandbox.py --files DIR --cwd DIR [--writable DIR]... [--visible PATH]... -- ARGV...",
              file=sys.stderr)
        return 2
    spec, argv = parsed
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing in the namespace reads this process's memory or fds
    try:
        mount_layout(spec)
        loopback_up()
    except Exception as exc:  # whatever stops the layout stops the run, by name (never a bare traceback)
        print(f"{SETUP_FAILED}{exc}", file=sys.stderr)
        return SETUP_EXIT
    pid = os.fork()
    if pid == 0:
        try:
            become_nobody()
            os.chdir(spec["cwd"])
            os.execvp(argv[0], argv)
        except (SetupError, OSError) as exc:
            print(f"popkit-sandbox: cannot start {argv[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:  # process 1 reaps every orphan of the namespace until the eval itself is done
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        print(f"{SIGNAL_LINE}{os.WTERMSIG(status)}", file=sys.stderr, flush=True)
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: the eval's end reaches popkit when this process has exited
