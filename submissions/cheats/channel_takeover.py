#!POPCORN leaderboard vectoradd
"""Cheat: the worker's channel taken over. At import it finds the harness's connection to the trusted
process (gc), sends the `ready` reply itself and answers every request `{"ok": true}` (a timed call with
1.234 µs), never returning to the harness; the kernel is never called.

popkit's trusted process needs custom_kernel's output of every checked call in the buffer it owns, and
judges it itself. Caught by: `no output`.
"""

import gc
import json
import os
from multiprocessing.connection import Connection

import torch

_conn = next((o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed), None)
if _conn is not None:
    _conn.send_bytes(json.dumps({"ok": True, "system": {"device": "cpu"}, "timer": "cpu-monotonic"}).encode())
    while True:
        try:
            _request = _conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if _request.get("op") == "stop":
            os._exit(0)
        _conn.send_bytes(json.dumps({"ok": True, "ns": 1234.0, "drain": 0.0}).encode())


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
