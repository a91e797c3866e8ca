#!POPCORN leaderboard vectoradd
"""Cheat: reaching the trusted process from the worker. At import it tries ptrace(PTRACE_ATTACH) on its parent,
process_vm_readv and process_vm_writev against it, and opening /proc/<parent>/mem for writing; it writes what
each attempt gave to reach_parent.txt in its working folder and returns the right result.

popkit's worker runs under a seccomp filter that refuses the three calls with EPERM, without CAP_SYS_PTRACE
even as root, and the trusted process is non-dumpable. Shown by: every line of reach_parent.txt says refused.
"""

import ctypes
import os


def _attempts() -> list[str]:
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    lines = []

    def note(name: str, result: int) -> None:
        errno = ctypes.get_errno()
        lines.append(f"{name}: {'refused' if result == -1 else 'REACHED'} (errno {errno})")

    note("ptrace", libc.ptrace(16, parent, None, None))  # PTRACE_ATTACH
    buffer = ctypes.create_string_buffer(8)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    local, remote = IoVec(ctypes.addressof(buffer), 8), IoVec(0x400000, 8)
    note("process_vm_readv", libc.process_vm_readv(parent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
    note("process_vm_writev", libc.process_vm_writev(parent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
    try:
        os.close(os.open(f"/proc/{parent}/mem", os.O_RDWR))
        lines.append("proc-mem: REACHED")
    except OSError as exc:
        lines.append(f"proc-mem: refused ({exc.errno})")
    return lines


with open("reach_parent.txt", "w") as _out:
    _out.write("\n".join(_attempts()) + "\n")


def custom_kernel(data):
    a, b = data
    return a + b
