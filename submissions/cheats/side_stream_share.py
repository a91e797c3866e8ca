#!POPCORN leaderboard softmax
"""Cheat: work on a side queue on a share of the calls only. On a deterministic share of its calls it runs
the reference on a second CUDA queue and returns at once (as the every-call side-queue cheat in this folder does), so the
harness's end event, recorded on the current queue, completes before that work: the event time misses it.
Every other call runs the reference on the current queue, honestly. The output is always right.

A rule that fails a case only when a share of its calls looks late ("at least half the calls drained
late", popkit's first defence) has a hole below that share: the reference on a second queue in 2 of every
5 calls passed test, benchmark and leaderboard on an H100 with softmax at 199 µs against the honest 304 µs.

Share: 0.4 (2 of every 5 calls) by default; the environment variable POPKIT_CHEAT_SHARE overrides it with a
fraction from 0 to 1 (0 is the honest reference on every call, 1 cheats on every call). Calls are counted here,
every call to custom_kernel (checked and timed alike), and call n (from 1) cheats when floor(n * share)
grows at n, so the cheating calls are spread evenly: 0.1 cheats on calls 10, 20, ...; 0.4 on 3, 5, 8, 10, ...

Any task: change the directive; the reference does the work. Without a GPU it just runs the reference.
Caught by: `unsynchronized work: call N of M left ... after its end event` (popkit's GPU-timestamp audit);
`popkit check` names the built name (`dynamic-name`).
"""

import math
import os

import torch
from reference import ref_kernel

_Queue = getattr(torch.cuda, "Str" + "eam")
_use = getattr(torch.cuda, "str" + "eam")  # the context manager that makes a queue current
_side = []
_calls = [0]


def _share() -> float:
    text = os.environ.get("POPKIT_CHEAT_SHARE", "").strip()
    if not text:
        return 0.4
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"POPKIT_CHEAT_SHARE must be a fraction from 0 to 1, got {text!r}")
    return value


SHARE = _share()


def cheats_on(n: int, share: float = SHARE) -> bool:
    """Whether call n (counted from 1) goes to the side queue: floor(n * share) grows at n."""
    return math.floor(n * share) > math.floor((n - 1) * share)


def custom_kernel(data):
    _calls[0] += 1
    if not torch.cuda.is_available() or not cheats_on(_calls[0]):
        return ref_kernel(data)
    if not _side:
        _side.append(_Queue())
    side = _side[0]
    ready = torch.cuda.Event()
    ready.record()  # on the current queue, after the harness's L2 flush
    side.wait_event(ready)  # the work starts after it: only the timer is dodged
    with _use(side):
        return ref_kernel(data)
