#!POPCORN leaderboard vectoradd
"""Cheat: a small lie about a short kernel. A right kernel whose harness measurement is patched at import (the
Device class found through sys.modules) to report 10 ns per call. The kernel itself takes microseconds, so the
unexplained time stays inside the trusted clock's tolerance (250 µs per call on the CPU): `time forged` does not
see it.

popkit's trusted process measures the CPU's copy bandwidth once per timed run; a time that moves the case's bytes
faster than a margin over it is impossible. Caught by: `time beats physics`.
"""

import sys

_patched = set()
for _module in list(sys.modules.values()):
    try:
        _device = getattr(_module, "Device", None)
    except Exception:  # a lazy module that cannot load
        continue
    if isinstance(_device, type) and hasattr(_device, "measure") and _device not in _patched:
        _patched.add(_device)
        _real = _device.measure

        def _measure(self, *args, _real=_real, **kwargs):
            out, timing = _real(self, *args, **kwargs)
            return out, {**timing, "ns": 10.0}

        _device.measure = _measure


def custom_kernel(data):
    a, b = data
    return a + b
