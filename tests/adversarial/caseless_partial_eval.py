"""Class: a `check: pass` that no case result of the mode backs. This eval reports only the first of the cases
it is given (with a timing in the timed modes), then `check: pass`: the other cases never ran."""
import os
import sys

kind = "test" if sys.argv[1] == "test" else "benchmark"
timing = "" if kind == "test" else f"{kind}.0.mean: 1000\n{kind}.0.runs: 3\n"
os.write(int(os.environ["POPCORN_FD"]),
         f"{kind}-count: 1\n{kind}.0.spec: size: 1\n{kind}.0.status: pass\n{timing}check: pass\n".encode())
