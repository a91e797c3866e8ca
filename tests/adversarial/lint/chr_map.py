"""Class: a name assembled from `chr` by `map` or a comprehension over a list held in a name, then kept in
another name, so the reach call sees only a name whose value no folder computed."""
import torch

CODES = [83, 116, 114, 101, 97, 109]
NAME = "".join(map(chr, CODES))
SHIFTED = "".join(chr(c + 1) for c in (82, 115, 113, 100, 96, 108))
_Queue = getattr(torch.cuda, NAME)
_Other = getattr(torch.cuda, SHIFTED)


def custom_kernel(data):
    return data
