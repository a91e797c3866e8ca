#!POPCORN leaderboard vectoradd
"""Cheat: output replay keyed on the inputs' data_ptr and shape.

Every timed call in leaderboard mode gets a fresh input; the allocator soon reuses an address, the
cache hits, and the old result comes back for new data. popkit rechecks every timed call.
Caught by: `output replay: custom_kernel returned a previous call's result for a new input`.
"""

_cache = {}


def custom_kernel(data):
    a, b = data
    key = (a.data_ptr(), b.data_ptr(), tuple(a.shape))
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key]
