#!POPCORN leaderboard vectoradd
"""Cheat: the harness's measurement patched. A right kernel that sleeps 20 ms per call; at import it
finds the harness's Device class through sys.modules and makes every measured call report 1234 ns.

popkit's trusted process runs its own clock around every timed call (request sent to reply received)
and fails a reported time far below what it saw. Caught by: `time forged`.
"""

import sys
import time

_patched = set()
for _module in list(sys.modules.values()):  # the harness's modules, wherever its layout puts the class
    try:
        _device = getattr(_module, "Device", None)
    except Exception:  # a lazy module that cannot load
        continue
    if isinstance(_device, type) and hasattr(_device, "measure") and _device not in _patched:
        _patched.add(_device)
        _real = _device.measure

        def _measure(self, *args, _real=_real, **kwargs):
            out, timing = _real(self, *args, **kwargs)
            return out, {**timing, "ns": 1234.0}

        _device.measure = _measure


def custom_kernel(data):
    a, b = data
    time.sleep(0.02)
    return a + b
