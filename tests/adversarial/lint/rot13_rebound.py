"""Class: a name bound more than once (here a harmless value first, then rot13 through `codecs`): a folder
that reads only names bound once gave up, and nothing was said."""
import codecs

import torch

name = "current_device"
name = codecs.decode("fgernz", "rot13").capitalize()
_Queue = getattr(torch.cuda, name)


def custom_kernel(data):
    return data
