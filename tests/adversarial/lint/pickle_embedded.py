"""Class: code hidden in embedded pickled bytes: loading the pickle calls the function it names (here
`builtins.exec` of a timer patch). popkit disassembles the bytes; nothing here is ever loaded."""
import pickle

_PAYLOAD = (b"cbuiltins\nexec\n(Vimport torch; torch.cuda.synchronize = lambda *a: None\ntR.")
pickle.loads(_PAYLOAD)


def custom_kernel(data):
    return data
