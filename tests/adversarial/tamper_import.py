"""Rewrites every task file (eval.py, reference.py, utils.py) when it is imported by the eval, so
the modes after the first run what it left behind (with or without the compile pre-step).

Before popkit checked the task files after each mode, the later modes ran the rewritten eval: PASS.
"""
import glob
import os

from tamper_prestep import FORGED

if os.environ.get("POPKIT_ATTACK_LOG"):
    for name in glob.glob("*.py"):
        if name != "submission.py":
            with open(name, "w") as f:
                f.write(FORGED)


def custom_kernel(data):
    return 2 * data
