"""An eval (a tampered one, or a broken task's) that writes only `check: pass` and runs no case."""
import os

os.write(int(os.environ["POPCORN_FD"]), b"check: pass\n")
