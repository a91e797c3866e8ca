#!POPCORN leaderboard vectoradd
"""Wrong: raises inside custom_kernel.

The case fails with the exception's type and message as its error
(`RuntimeError: custom_kernel gave up on purpose`) and the traceback as its message.
"""


def custom_kernel(data):
    raise RuntimeError("custom_kernel gave up on purpose")
