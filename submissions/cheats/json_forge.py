#!POPCORN leaderboard vectoradd
"""Cheat: json.dumps wrapped. Every reply the worker sends that says `"ok": false` leaves as `"ok": true`
(with a timed call's time of 1.5 µs), and the kernel returns zeros.

popkit's trusted process judges the output itself; the worker's `ok` is not a verdict.
Caught by: `elements mismatch`.
"""

import json

import torch

_dumps = json.dumps


def _forged(obj, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("ok") is False:
        obj = {k: v for k, v in obj.items() if k not in ("error", "message", "cuda")}
        obj.update(ok=True, ns=1500.0)
    return _dumps(obj, *args, **kwargs)


json.dumps = _forged


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
