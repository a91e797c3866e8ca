"""Returns wrong results, and leaves a detached grandchild that writes `check: pass` on the result
pipe after the eval has exited (and written `check: fail`).

Before popkit stopped reading at the eval's exit, popkit read on for 5 s and later keys won: PASS.
The tiny fixture eval leaves POPCORN_FD inheritable, so the grandchild holds the pipe directly (with
popkit's harness it would reopen it through /proc/<eval pid>/fd/N, which root can do).
"""
import os
import time

import attack

EVAL = os.getpid()
FD = int(os.environ["POPCORN_FD"])


def write_late():
    while True:  # wait for the eval to exit
        try:
            os.kill(EVAL, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    time.sleep(0.3)
    os.write(FD, b"check: pass\n")


attack.record("eval")
attack.detach("late-writer", write_late)


def custom_kernel(data):
    return 2 * data + 1
