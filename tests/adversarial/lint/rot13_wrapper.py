"""Class: the file's own function hands its parameter to getattr; the name is built at the call site
(rot13 through `codecs`), where no reach call is, and inside the function it is just a parameter."""
import codecs

import torch


def lookup(module, attribute):
    return getattr(module, attribute)


def indirect(attribute):
    return lookup(torch.cuda, attribute)


_Queue = indirect(codecs.decode("Fgernz", "rot13"))


def custom_kernel(data):
    return data
