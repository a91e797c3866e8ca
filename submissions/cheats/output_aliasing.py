#!POPCORN leaderboard vectoradd
"""Cheat: output aliasing. Adds in place into input `a` and returns a view of it, saving the
output allocation (and writing over an input the harness may reuse).

Caught by: `output aliases input 0 (same storage)`.
"""


def custom_kernel(data):
    a, b = data
    a.add_(b)
    return a.view(a.shape)
