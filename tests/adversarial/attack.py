"""Helpers the attack submissions import (the tests put this folder on PYTHONPATH)."""

import os
import time


def record(role: str) -> None:
    """Append `ROLE PID CWD` to $POPKIT_ATTACK_LOG, so a test can check the process is gone."""
    with open(os.environ["POPKIT_ATTACK_LOG"], "a") as log:
        log.write(f"{role} {os.getpid()} {os.getcwd()}\n")


def detach(role: str, body) -> None:
    """Start a grandchild that leaves the process group and session (setsid, double fork) and runs body()."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            record(role)
            try:
                body()
            finally:
                os._exit(0)
        os._exit(0)
    os.wait()


def forever() -> None:
    while True:
        time.sleep(1)
