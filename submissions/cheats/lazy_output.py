#!POPCORN leaderboard vectoradd
"""Cheat: lazy output. Returns a torch.Tensor subclass that does the addition only when someone
looks at it (any torch operation on it), so the timed call measures nothing.

Caught by: `lazy output: custom_kernel returned a LazySum (a torch.Tensor subclass)`.
"""

import torch


class LazySum(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for arg in args:
            if isinstance(arg, LazySum) and getattr(arg, "_pending", None) is not None:
                a, b = arg._pending
                arg._pending = None
                with torch._C.DisableTorchFunctionSubclass():
                    torch.add(a, b, out=arg)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def custom_kernel(data):
    a, b = data
    out = torch.empty_like(a).as_subclass(LazySum)
    out._pending = (a, b)
    return out
