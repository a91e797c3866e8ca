#!POPCORN leaderboard softmax
"""Cheat: work on a side queue. Runs the reference on a second CUDA queue and returns at once, so the
harness's end event (recorded on the current queue) completes before the work does: the event time
misses it. The banned word is built from pieces (`getattr(torch.cuda, "Str" + "eam")`), so the server's
word ban never sees it; the output is still right, because harnesses synchronize the device before a
verdict. Measured on an H100 before popkit checked for it: softmax timed at 44 µs against the honest
303 µs, and every check passed. Without a GPU it just runs the reference.

Any task: change the directive; the reference does the work. popkit times a device-wide synchronize
after every timed call's end event. Caught by: `unsynchronized work: N of N timed calls left work
running on the device after their end event` (and `popkit check` names the built name: `dynamic-name`).
"""

import torch
from reference import ref_kernel

_Queue = getattr(torch.cuda, "Str" + "eam")
_use = getattr(torch.cuda, "str" + "eam")  # the context manager that makes a queue current
_side = []


def custom_kernel(data):
    if not torch.cuda.is_available():
        return ref_kernel(data)
    if not _side:
        _side.append(_Queue())
    side = _side[0]
    ready = torch.cuda.Event()
    ready.record()  # on the current queue, after the harness's L2 flush
    side.wait_event(ready)  # the work starts after it: only the timer is dodged
    with _use(side):
        return ref_kernel(data)
