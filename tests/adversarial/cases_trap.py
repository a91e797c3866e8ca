"""Attack (class: files the submission can write that popkit writes after it). Right kernel.

When imported by the compile pre-step it replaces the next cases files in its working folder: `test.txt`
with a FIFO (popkit blocked forever writing it), `benchmark.txt` with a symbolic link to a file outside
the working folder (popkit wrote through it), `leaderboard.txt` with a folder (exit 70). The outside
file is named by POPKIT_ATTACK_TARGET. Caught by: popkit removes whatever is at a cases file's name and
creates the file anew, never following or opening what was there. load_inline (so the pre-step runs).
"""

import os

if __name__ == "__main__":
    for name, make in (("test.txt", lambda p: os.mkfifo(p)),
                       ("benchmark.txt", lambda p: os.symlink(os.environ.get("POPKIT_ATTACK_TARGET", "/dev/null"), p)),
                       ("leaderboard.txt", lambda p: os.mkdir(p))):
        try:
            make(name)
        except OSError:
            pass


def custom_kernel(data):
    return 2 * data
