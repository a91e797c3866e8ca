#!POPCORN leaderboard vectoradd
"""Cheat: timer patching. Replaces the timers a harness uses so every call seems to take 1 ns:
time.perf_counter_ns (CPU timing) and torch.cuda.Event.elapsed_time (GPU timing).

popkit captures both before importing the submission, times with the captured ones, and verifies
them after the import. Caught by: `timer patched: time.perf_counter_ns was replaced`.
"""

import time

import torch

_calls = [0]


def _fake_counter_ns():
    _calls[0] += 1
    return _calls[0]


def _fake_elapsed_time(self, end_event):
    return 1e-6


time.perf_counter_ns = _fake_counter_ns
torch.cuda.Event.elapsed_time = _fake_elapsed_time


def custom_kernel(data):
    a, b = data
    return a + b
