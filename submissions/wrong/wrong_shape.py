#!POPCORN leaderboard vectoradd
"""Wrong: drops the last row of the result.

Caught by the check: `shape mismatch: expected (N, N), got (N-1, N)`.
"""


def custom_kernel(data):
    a, b = data
    return (a + b)[:-1]
