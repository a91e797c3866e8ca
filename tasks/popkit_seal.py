"""popkit's harness: how each process is kept out of the other's memory.

make_non_dumpable (the trusted process: /proc/<pid>/fd and /proc/<pid>/mem become root's), die_with_parent (the
worker ends with the eval) and seal_worker (the worker's seccomp filter refusing ptrace and
process_vm_readv/writev, and CAP_SYS_PTRACE dropped).
"""

from __future__ import annotations

import sys



def make_non_dumpable() -> None:
    """Linux: /proc/<pid>/fd of a non-dumpable process is root's, so a same-user child cannot reopen the pipe."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the eval process dies (a timeout must not leave it running)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


# The worker's seccomp filter: system calls that reach another process's memory, refused with EPERM.
_REFUSED_CALLS = {"x86_64": (101, 310, 311),  # ptrace, process_vm_readv, process_vm_writev
                  "aarch64": (117, 270, 271)}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CAP_SYS_PTRACE = 19


def _bpf_program(arch: str) -> list[tuple[int, int, int, int]]:
    """A classic BPF program (code, jt, jf, k) that answers EPERM to one of _REFUSED_CALLS, to any call of
    another ABI (32-bit calls; x32 calls on x86_64, whose numbers have bit 30 set), and allows the rest."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    checks = [(jge_k, 0x40000000)] if arch == "x86_64" else []
    checks += [(jeq_k, number) for number in _REFUSED_CALLS[arch]]
    program = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, _AUDIT_ARCH[arch]), (ret_k, 0, 0, eperm), (ld_w_abs, 0, 0, 0)]
    refuse_at = len(program) + len(checks) + 1  # the last instruction
    for code, k in checks:
        program.append((code, refuse_at - len(program) - 1, 0, k))
    return program + [(ret_k, 0, 0, allow), (ret_k, 0, 0, eperm)]


def seal_worker() -> str:
    """Linux: the worker may not reach another process's memory (ptrace, process_vm_readv/writev refused by a
    seccomp filter, after PR_SET_NO_NEW_PRIVS) and, run as root, loses CAP_SYS_PTRACE (so /proc/<pid>/mem of
    the non-dumpable trusted process stays closed). "" when sealed, else why not."""
    import ctypes
    import platform

    arch = platform.machine()
    if not sys.platform.startswith("linux") or arch not in _REFUSED_CALLS:
        return f"no seccomp filter for {sys.platform}/{arch}"
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) == 0 and data[0].effective & (1 << CAP_SYS_PTRACE):
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[0], field, getattr(data[0], field) & ~(1 << CAP_SYS_PTRACE))
        libc.capset(ctypes.byref(header), data)
    libc.prctl(24, CAP_SYS_PTRACE, 0, 0, 0)  # PR_CAPBSET_DROP (needs CAP_SETPCAP; harmless without)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    steps = _bpf_program(arch)
    filters = (Filter * len(steps))(*[Filter(*step) for step in steps])
    program = Program(len(steps), filters)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return f"PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"seccomp filter refused (errno {ctypes.get_errno()})"
    return ""
