"""Class: getattr under another name (`builtins.getattr`, a local alias, `functools.partial`), so no rule saw
a getattr call at all; the name itself is rot13 through `codecs`."""
import builtins
import codecs
import functools

import torch

fetch = getattr
_Queue = fetch(torch.cuda, codecs.decode("Fgernz", "rot13"))
_sync = builtins.getattr(torch.cuda, codecs.decode("flapuebavmr", "rot13"))
_from_cuda = functools.partial(getattr, torch.cuda)
_event = _from_cuda(codecs.decode("Rirag", "rot13"))


def custom_kernel(data):
    return data
