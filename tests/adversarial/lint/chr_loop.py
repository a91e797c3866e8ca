"""Class: a name assembled from `chr(...)` in a for loop (`name += chr(c)`), which no folder ran."""
import torch

name = ""
for code in [83, 116, 114, 101, 97, 109]:
    name += chr(code)
_Queue = getattr(torch.cuda, name)


def custom_kernel(data):
    return data
