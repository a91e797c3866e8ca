#!POPCORN leaderboard vectoradd
"""Cheat: output replay. Computes the first result for each input shape and returns it again for
every later call with that shape (a cache keyed on data_ptr behaves the same whenever the
allocator reuses an address). In the leaderboard's benchmark mode all timed calls get the same
input, so the replayed result would even be right there.

popkit checks one more never-seen input per case and rechecks every timed call's fresh input.
Caught by: `output replay: custom_kernel returned a previous call's result for a new input`.
"""

_cache = {}


def custom_kernel(data):
    a, b = data
    key = (tuple(a.shape), a.dtype)
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key]
