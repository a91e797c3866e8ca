"""Class: a name assembled in a loop through a list (`parts.append(chr(c))`, then `"".join(parts)`): the list
is bound once, to `[]`, so a folder that trusts single bindings would read an empty name."""
import torch

parts = []
for code in (115, 121, 110, 99, 104, 114, 111, 110, 105, 122, 101):
    parts.append(chr(code))
_sync = getattr(torch.cuda, "".join(parts))


def custom_kernel(data):
    return data
