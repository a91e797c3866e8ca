"""Writes 100 MB on stdout and on stderr, then computes the right result.

Before popkit kept a bounded head and tail of each, this took 1.9 GB of popkit's memory and a 420 MB
history row.
"""
import sys

import attack

attack.record("eval")
CHUNK = b"x" * (1 << 20)
for _ in range(100):
    sys.stdout.buffer.write(CHUNK)
    sys.stderr.buffer.write(CHUNK)
sys.stdout.flush()


def custom_kernel(data):
    return 2 * data
