#!POPCORN leaderboard identity
"""Cheat: fabricated output. Returns the preallocated output buffer without writing it.

Works wherever the harness hands over a buffer that already holds the answer (or whatever a
previous run left there). popkit fills such buffers with poison bytes before every call.
Caught by: `fabricated output: custom_kernel returned the output buffer from data without writing it`.
"""


def custom_kernel(data):
    _x, out = data
    return out
