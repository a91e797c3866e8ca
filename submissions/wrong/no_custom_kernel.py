#!POPCORN leaderboard vectoradd
"""Wrong: defines the kernel under another name, so there is no custom_kernel.

Every case fails with `submission.py defines no custom_kernel(data)`.
"""


def kernel(data):
    a, b = data
    return a + b
