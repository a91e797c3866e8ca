#!POPCORN leaderboard vectoradd
"""Cheat: the harness's measurement patched. A right kernel that sleeps 20 ms per call; at import it
finds the harness's Device class through sys.modules and makes every measured call report 1234 ns.

popkit's trusted process runs its own clock around every timed call (request sent to reply received)
and fails a reported time far below what it saw. Caught by: `time forged`.
"""

import sys
import time

for _name in ("__mp_main__", "__main__"):
    _device = getattr(sys.modules.get(_name), "Device", None)
    if _device is not None and hasattr(_device, "measure"):
        _real = _device.measure

        def _measure(self, *args, _real=_real, **kwargs):
            out, timing = _real(self, *args, **kwargs)
            return out, {**timing, "ns": 1234.0}

        _device.measure = _measure


def custom_kernel(data):
    a, b = data
    time.sleep(0.02)
    return a + b
