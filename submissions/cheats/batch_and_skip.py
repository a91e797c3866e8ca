#!POPCORN leaderboard vectoradd
"""Cheat: batch-and-skip. Does real work on one call in eight and claims the other calls were
covered by that batch, returning the last computed result (so seven of eight timings are ~0).

popkit gives every checked and timed call a new input and checks each output.
Caught by: `output replay: custom_kernel returned a previous call's result for a new input`.
"""

_state = {"calls": 0, "last": None}


def custom_kernel(data):
    a, b = data
    _state["calls"] += 1
    last = _state["last"]
    if last is None or last.shape != a.shape or _state["calls"] % 8 == 1:
        _state["last"] = a + b
    return _state["last"]
