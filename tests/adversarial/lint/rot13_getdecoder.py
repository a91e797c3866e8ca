"""Class: a name built by a codec popkit did not fold (rot13 through `codecs.getdecoder`, `codecs.lookup`),
reaching getattr. The side queue's class name never appears as text, so the server's word ban misses it."""
import codecs

import torch

_Queue = getattr(torch.cuda, codecs.getdecoder("rot13")("Fgernz")[0])


def custom_kernel(data):
    return data
