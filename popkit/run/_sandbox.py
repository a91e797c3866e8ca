"""The first process inside popkit's sandbox. Standard library only: popkit runs it as a script.

    unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc --net --ipc --uts -- \\
        python -I -S _sandbox.py --files DIR --cwd DIR [--writable DIR]... [--visible PATH]... [--imports DIR]...
            [--empty DIR]... -- ARGV...

`unshare` (util-linux) makes the namespaces; this script is process 1 of the new pid namespace and, as
root of the new user namespace, builds a root from nothing (see `plan` and `mount_layout`): a tmpfs that
holds only the system's programs and libraries, a few files of /etc, a minimal /dev with the accelerators'
nodes, this namespace's /proc, the parts of /sys the GPU drivers read and the spec's paths, all read-only
but for the working folder and the build caches, with fresh /tmp, /dev/shm and /run; it moves into it with
pivot_root(2) and detaches the machine's root, as bubblewrap does. The loopback interface comes up.
It then starts ARGV in a nested user namespace as uid and gid 65534 (no capabilities, no_new_privs),
reaps everything, and exits with ARGV's exit code (128 + N, with a last line on stderr, when signal N
killed it). When it exits, the kernel kills every process left in the namespace.

The spec (`spec_args` writes it): `files` (the task's files as popkit wrote them) is shown read-only; `cwd` and
each `writable` folder writable; each `visible` path (the interpreter, its packages, popkit, the CUDA toolkit)
read-only, whole; each `imports` folder (a PYTHONPATH entry) showing only its modules and packages; each
`empty` path (HOME) as an empty read-only folder; all keep their paths but `cache` (the run's private build
cache), mounted writable at CACHE_MOUNT. Every sandboxed process waits for this script's start-up, so it imports
little: no json (the spec is plain arguments) and `_socket`, the C module under socket.py, whose enums and
selectors would double that start-up.
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


def read_only(path: str) -> None:
    """The mount at `path` and every mount below it read-only: mount_setattr(2) recursively, else each mount
    point in turn (a flag the outer namespace locked, nosuid or nodev, is said again)."""
    number = SYS_MOUNT_SETATTR.get(os.uname().machine)
    if number is not None:
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        if _libc.syscall(number, AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) == 0:
            return
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    for point in sorted({p for p in points if within(p, path)}, key=len):
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        if _libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) != 0:
            stat = os.statvfs(point) if os.path.exists(point) else None
            extra = (MS_NOSUID if stat and stat.f_flag & os.ST_NOSUID else 0) | (
                MS_NODEV if stat and stat.f_flag & os.ST_NODEV else 0)
            _check(_libc.mount(None, point.encode(), None, ctypes.c_ulong(flags | extra), None), f"read-only {point}")


FRESH = ("/tmp", "/dev/shm", "/run")  # empty tmpfs in the sandbox
CACHE_MOUNT = "/var/cache/popkit"  # where a run's private build cache (spec `cache`) is mounted, writable
# What of the machine the root built from nothing shows, read-only: the system's programs and libraries ...
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/rocm", "/opt/nvidia")
# ... the files of /etc that libraries read (the loader's cache, name service, time zone, certificates,
# the alternatives `c++` and `cc` resolve through) ...
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "host.conf", "hosts", "gai.conf", "services",
       "protocols", "localtime", "timezone", "os-release", "lsb-release", "debian_version", "alternatives", "ssl",
       "ca-certificates", "pki", "crypto-policies", "OpenCL")
# ... the parts of /sys the CUDA and ROCm drivers read (devices, their buses and classes, driver modules) ...
SYS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module", "/sys/kernel/mm")
# ... and of /dev the plain devices and the accelerators' nodes (no disk, no terminal).
DEV = ("null", "zero", "full", "random", "urandom")
GPU_DEV_PREFIXES = ("nvidia", "kfd", "dri")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
IMPORTABLE = (".py", ".pyc", ".so", ".pyd")


def within(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def importable(folder: str, entry: os.DirEntry) -> bool:
    """Whether a folder on the import path shows `entry`: a module file, or a package (an `__init__`) or a
    namespace package (a folder named like a module holding a `.py` file), never a link, a hidden name, a
    socket or any other file."""
    if entry.name.startswith(".") or entry.is_symlink():
        return False
    if entry.is_file():
        return entry.name.endswith(IMPORTABLE)
    if not entry.is_dir() or not entry.name.isidentifier():
        return False
    try:
        names = os.listdir(entry.path)
    except OSError:
        return False
    return any(n.startswith("__init__.") or n.endswith(".py") for n in names)


class Layout:
    """The mounts of the root built from nothing, in the order they are made (a folder before what lies in it):
    each is (target, kind, source fd or text). Sources are opened first, before anything covers them."""

    def __init__(self) -> None:
        self.mounts: list[tuple[str, str, object]] = []
        self.taken: set[str] = set()

    def add(self, target: str, kind: str, source: object = None) -> None:
        if target not in self.taken:
            self.taken.add(target)
            self.mounts.append((target, kind, source))

    def bind(self, path: str, kind: str = "ro") -> None:
        """`path` of the machine at the same path: `ro`, `rw`; a link is made again as the same link."""
        if path in self.taken or not os.path.lexists(path):
            return
        if os.path.islink(path):
            self.add(path, "link", os.readlink(path))
            return
        try:
            self.add(path, kind, os.open(path, os.O_PATH | os.O_CLOEXEC))
        except OSError:
            pass

    def imports(self, folder: str) -> None:
        """A folder on the import path, showing only what importable() allows."""
        try:
            entries = [e for e in os.scandir(folder) if importable(folder, e)]
        except OSError:
            return
        self.add(folder, "tmpfs", "mode=0755")
        for entry in entries:
            self.bind(entry.path)


def plan(spec: dict) -> Layout:
    """What the root shows (module doc): the system, the spec's files, folders and caches, fresh /tmp, /run and
    /dev/shm, a minimal /dev, this namespace's /proc, the CUDA parts of /sys, a minimal /etc."""
    layout = Layout()
    for top in ("/tmp", "/run"):
        layout.add(top, "tmpfs", "mode=1777")
    layout.add("/dev", "tmpfs", "mode=0755")
    layout.add("/dev/shm", "tmpfs", "mode=1777")
    for name in DEV:
        layout.bind(f"/dev/{name}", "dev")
    try:
        gpu = sorted(n for n in os.listdir("/dev") if n.startswith(GPU_DEV_PREFIXES))
    except OSError:
        gpu = []
    for name in gpu:
        layout.bind(f"/dev/{name}", "dev")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        layout.add(f"/dev/{name}", "link", target)
    layout.bind("/proc", "proc")
    for path in SYS:
        layout.bind(path)
    layout.add("/etc/passwd", "text", PASSWD)
    layout.add("/etc/group", "text", GROUP)
    for name in ETC:
        layout.bind(f"/etc/{name}")
    for path in SYSTEM:
        layout.bind(path)
    held = [spec["files"], spec["cwd"], *spec["writable"]]
    for path in spec["visible"]:  # one that holds the run's own folders would cover them: it is not needed
        if not any(within(h, path) for h in held[:2]):
            layout.bind(path)
    for path in spec["imports"]:
        if path not in FRESH and not any(within(h, path) for h in held) and os.path.isdir(path):
            layout.imports(path)
    for path in spec["empty"]:
        layout.add(path, "dir")
    layout.bind(spec["files"])
    layout.bind(spec["cwd"], "rw")
    if spec.get("cache"):
        layout.add(CACHE_MOUNT, "rw", os.open(spec["cache"], os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY))
    for path in spec["writable"]:
        layout.bind(path, "rw")
    return layout


def _make_target(target: str, source: object) -> None:
    """The mount point: a folder for a folder, an empty file for a file (made on the new root's tmpfs)."""
    is_dir = not isinstance(source, int) or os.path.isdir(f"/proc/self/fd/{source}")
    if is_dir:
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))


def _through_link(root: str, target: str) -> bool:
    """Whether a folder above `target` in the root being built is a link (following it could leave the root)."""
    parts = target.strip("/").split("/")[:-1]
    return any(os.path.islink(root + "/" + "/".join(parts[:i + 1])) for i in range(len(parts)))


def build(layout: Layout, root: str) -> list[str]:
    """Make every mount of `layout` below `root`; returns the targets to make read-only once all are made."""
    later = []
    order = sorted(layout.mounts, key=lambda m: (m[0].rstrip("/").count("/"), m[0]))
    for target, kind, source in order:
        at = root + target
        if _through_link(root, target):  # shown through a link made above it (/lib -> usr/lib): never followed here
            continue
        if kind in ("link", "text", "dir") and os.path.lexists(at):  # already shown by a folder bound whole
            continue
        try:
            if kind == "link":
                os.makedirs(os.path.dirname(at), exist_ok=True)
                os.symlink(str(source), at)
            elif kind == "text":
                os.makedirs(os.path.dirname(at), exist_ok=True)
                with open(at, "w") as f:
                    f.write(str(source))
            elif kind == "dir":
                os.makedirs(at, exist_ok=True)
            elif kind == "tmpfs":
                os.makedirs(at, exist_ok=True)
                mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, str(source))
                if source == "mode=0755":  # a folder shown in part (/dev, an import folder): read-only once made
                    later.append(at)
            else:
                _make_target(at, source)
                mount(f"/proc/self/fd/{source}", at, None, MS_BIND | (0 if kind == "dev" else MS_REC))
                os.close(int(source))  # type: ignore[call-overload]
                if kind == "ro":  # with whatever is mounted below it on the machine
                    read_only(at)
        except FileExistsError:
            continue
        except OSError as exc:
            raise SetupError(f"{target}: {exc.strerror}") from None
    return later


SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
MNT_DETACH = 2


def pivot(root: str) -> None:
    """`root` becomes / (pivot_root(2), as bubblewrap does); the machine's root is detached, out of reach."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown on {os.uname().machine}")
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def mount_layout(spec: dict) -> None:
    """The file system the eval sees: a tmpfs root holding only what plan() names, read-only but for the
    working folder, the build caches and the fresh folders."""
    layout = plan(spec)
    base = next((d for d in ("/tmp", "/run", "/mnt") if os.path.isdir(d) and not os.path.islink(d)), None)
    if base is None:
        raise SetupError("no folder to build the root in (/tmp, /run, /mnt)")
    mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    later = build(layout, base)
    for at in sorted(later, key=len, reverse=True):  # deepest first: a read-only parent keeps its own children
        read_only_top(at)
    pivot(base)
    read_only_top("/")


def read_only_top(path: str) -> None:
    """The one mount at `path` read-only, its flags the outer namespace locked (nosuid, nodev) said again; the
    mounts below it keep theirs (a writable cache below a read-only folder stays writable)."""
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY
    if _libc.mount(None, path.encode(), None, ctypes.c_ulong(flags), None) == 0:
        return
    stat = os.statvfs(path)
    extra = (MS_NOSUID if stat.f_flag & os.ST_NOSUID else 0) | (MS_NODEV if stat.f_flag & os.ST_NODEV else 0) | (
        MS_NOEXEC if stat.f_flag & os.ST_NOEXEC else 0)
    _check(_libc.mount(None, path.encode(), None, ctypes.c_ulong(flags | extra), None), f"read-only {path}")


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


_SPEC_LISTS = ("writable", "visible", "imports", "empty")


def spec_args(files: str, cwd: str, writable: list[str] | tuple[str, ...] = (),
              visible: list[str] | tuple[str, ...] = (), imports: list[str] | tuple[str, ...] = (),
              empty: list[str] | tuple[str, ...] = (), cache: str = "") -> list[str]:
    """The spec as this script's arguments (before `--`): a flag and its value, in pairs."""
    args = ["--files", files, "--cwd", cwd] + (["--cache", cache] if cache else [])
    for flag, paths in (("--writable", writable), ("--visible", visible), ("--imports", imports),
                        ("--empty", empty)):
        for path in paths:
            args += [flag, path]
    return args


def parse_spec(args: list[str]) -> tuple[dict, list[str]] | None:
    """(spec, ARGV) from spec_args' pairs, `--` and ARGV; None when they are not that (a value may be anything)."""
    spec: dict = {"files": None, "cwd": None, "cache": None, "writable": [], "visible": [], "imports": [], "empty": []}
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


def find_program(name: str) -> str:
    """`name` as execvp(3) finds it on PATH, without os.get_exec_path (it imports `warnings`, which the root
    built from nothing may not hold)."""
    if "/" in name:
        return name
    for folder in (os.environ.get("PATH") or "/usr/bin:/bin").split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return name


def main(args: list[str]) -> int:
    parsed = parse_spec(args)
    if parsed is None:
        print("usage: _sandbox.py --files DIR --cwd DIR [--cache DIR] [--writable DIR]... [--visible PATH]... "
              "[--imports DIR]... [--empty DIR]... -- ARGV...",
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
            os.execv(find_program(argv[0]), argv)
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
