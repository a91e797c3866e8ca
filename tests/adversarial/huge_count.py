"""Writes `test-count: 100000000` on the result pipe as the eval exits (the tiny fixture eval leaves
POPCORN_FD in the environment), after the eval wrote its own count: later keys win.

Before popkit bounded counts by the cases file's lines, popkit built a hundred million case results.
"""
import atexit
import os

import attack

attack.record("eval")
FD = os.dup(int(os.environ["POPCORN_FD"]))  # the eval closes its own copy before exiting
atexit.register(os.write, FD, b"test-count: 100000000\n")


def custom_kernel(data):
    return 2 * data
