#!POPCORN leaderboard identity
"""Cheat: background thread. Returns the output buffer at once and fills it from a thread a few
milliseconds later, after the timer stopped (the same trick as work left running on another
stream, which the server refuses by name).

popkit synchronizes before reading a verdict and fails a call that leaves a thread running the
submission's code. Caught by: `background thread started by custom_kernel`.
"""

import threading
import time


def _fill_later(x, out):
    time.sleep(0.05)
    out.copy_(x)


def custom_kernel(data):
    x, out = data
    threading.Thread(target=_fill_later, args=(x, out), daemon=True).start()
    return out
