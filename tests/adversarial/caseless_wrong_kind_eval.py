"""Class: a `check: pass` that no case result of the mode backs. In every mode this eval (a broken or tampered
task eval) writes one passing *test* result and `check: pass`: benchmark and leaderboard modes get no
benchmark result at all, test mode one result for several cases."""
import os

os.write(int(os.environ["POPCORN_FD"]), b"test-count: 1\ntest.0.spec: size: 1\ntest.0.status: pass\ncheck: pass\n")
