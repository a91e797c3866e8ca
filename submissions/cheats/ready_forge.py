#!POPCORN leaderboard vectoradd
"""Cheat: the worker's `ready` reply rewritten. It names another device (one with no physics floor) and
turns the timing audit off, through a wrapped json.dumps; the kernel is right.

popkit's trusted process decides the device, the timer and the audit rule itself; the worker's reply is
data. Shown by: the run's system.device and trust.audit are the trusted side's.
"""

import json

_dumps = json.dumps


def _forged(obj, *args, **kwargs):
    if isinstance(obj, dict) and "system" in obj:
        obj = {**obj, "system": {**obj["system"], "device": "forged-device"}, "audit": "off"}
    return _dumps(obj, *args, **kwargs)


json.dumps = _forged


def custom_kernel(data):
    a, b = data
    return a + b
