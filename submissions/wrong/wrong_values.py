#!POPCORN leaderboard vectoradd
"""Wrong: computes a - b instead of a + b.

Caught by the check: `... elements mismatch (rtol=0.001, atol=0.001); at (0, 0): expected ..., got ...`.
"""


def custom_kernel(data):
    a, b = data
    return a - b
