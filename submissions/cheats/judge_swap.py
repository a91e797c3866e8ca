#!POPCORN leaderboard vectoradd
"""Cheat: the harness's judge replaced. At import it walks sys.modules to the harness module of its own
process and makes its output check always answer "right", then returns zeros.

popkit judges every output in its trusted process; the worker's code only hands the output over, and the
replaced verify hands nothing. Caught by: `no output`.
"""

import sys

import torch

for _name in ("__mp_main__", "__main__"):
    _harness = sys.modules.get(_name)
    for _cls in ("ReferenceTask", "Checker"):
        _owner = getattr(_harness, _cls, None)
        if _owner is not None and hasattr(_owner, "judge"):
            _owner.judge = lambda self, data, out: (True, "")
        if _owner is not None and hasattr(_owner, "verify"):
            _owner.verify = lambda self, *args, **kwargs: None


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
