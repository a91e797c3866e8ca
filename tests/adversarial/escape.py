"""Leaves a detached grandchild holding stdout open, then never returns from the kernel.

Before popkit's watchdog this made a 2 s timeout wait forever: the grandchild left the process group,
so killing the group missed it, and reading stdout to its end never ended.
"""
import time

import attack

attack.record("eval")
attack.detach("grandchild", attack.forever)


def custom_kernel(data):
    time.sleep(10**6)
    return 2 * data
