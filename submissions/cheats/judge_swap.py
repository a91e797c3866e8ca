#!POPCORN leaderboard vectoradd
"""Cheat: the harness's judge replaced. At import it walks sys.modules to the harness modules of its own
process and makes its output check always answer "right", then returns zeros.

popkit judges every output in its trusted process; the worker's code only hands the output over, and the
replaced verify hands nothing. Caught by: `no output`.
"""

import sys

import torch

for _harness in list(sys.modules.values()):  # the harness's modules, wherever its layout puts the classes
    for _cls in ("ReferenceTask", "Checker"):
        try:
            _owner = getattr(_harness, _cls, None)
        except Exception:  # a lazy module that cannot load
            continue
        if not isinstance(_owner, type):
            continue
        if _owner is not None and hasattr(_owner, "judge"):
            _owner.judge = lambda self, data, out: (True, "")
        if _owner is not None and hasattr(_owner, "verify"):
            _owner.verify = lambda self, *args, **kwargs: None


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
