#!POPCORN leaderboard vectoradd
"""Wrong: a syntax error (a missing closing parenthesis).

The import fails, so every case fails with `SyntaxError: ...`; popkit's runner refuses the file
before running it.
"""


def custom_kernel(data):
    a, b = data
    return (a + b
