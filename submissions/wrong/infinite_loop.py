#!POPCORN leaderboard vectoradd
"""Wrong: never returns.

The eval has no timeout of its own; the runner kills it at the task's timeout (exit code 114).
"""


def custom_kernel(data):
    while True:
        pass
