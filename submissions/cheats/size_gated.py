#!POPCORN leaderboard vectoradd
"""Cheat: size-gated shortcut. Exact at the small test sizes; at benchmark sizes it adds only the
first half of the rows (half the memory traffic) and leaves the rest as `a`.

popkit checks every benchmark shape before timing it (with several seeds).
Caught in benchmark/leaderboard mode by the check: `... elements mismatch (rtol=..., atol=...)`.
"""

SMALL = 64 * 64  # the largest test shape it expects to be checked at


def custom_kernel(data):
    a, b = data
    if a.numel() <= SMALL:
        return a + b
    out = a.clone()
    half = a.shape[0] // 2
    out[:half] += b[:half]
    return out
