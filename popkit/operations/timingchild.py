"""doctor --timing's measurements, run as a child (`python -c <this file's text>`): stdlib, and torch if present.

Prints one JSON line. It runs no submission code. On the CPU: the timer's resolution and cost, and the
memory's copy bandwidth. On a CUDA GPU (torch sees one): the launch floor (a one-element kernel between
CUDA events, as the harness times a call), the event pair's own time, back-to-back launches, and the
device's copy bandwidth. Times are medians over repeats; bandwidths count the bytes read plus written.
"""

import json
import statistics
import sys
import time

CPU_COPY_BYTES = 128 * 2**20
GPU_COPY_BYTES = 1 * 2**30
REPEATS = 200


def cpu() -> dict:
    calls = 200_000
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(calls):
        clock()
    cost = (clock() - t0) / calls
    steps = [b - a for a, b in zip(*[iter([clock() for _ in range(20_000)])] * 2) if b > a]
    src = bytearray(CPU_COPY_BYTES)
    dst = bytearray(CPU_COPY_BYTES)
    view = memoryview(dst)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        view[:] = src
        best = min(best, time.perf_counter() - t0)
    return {"timer_resolution_ns": min(steps) if steps else None, "timer_call_ns": cost,
            "copy_bandwidth_bytes_per_s": 2 * CPU_COPY_BYTES / best, "copy_bytes": CPU_COPY_BYTES}


def gpu() -> dict:
    try:
        import torch
    except ImportError as exc:
        return {"error": f"no torch: {exc}"}
    if not torch.cuda.is_available():
        return {"error": "torch sees no GPU"}
    one = torch.zeros(1, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def per_call(work) -> float:
        times = []
        for i in range(REPEATS + 20):
            torch.cuda.synchronize()
            start.record()
            work()
            end.record()
            torch.cuda.synchronize()
            if i >= 20:
                times.append(start.elapsed_time(end) * 1e3)  # ms -> us
        return statistics.median(times)

    launch = per_call(one.zero_)
    pair = per_call(lambda: None)
    torch.cuda.synchronize()
    start.record()
    for _ in range(1000):
        one.zero_()
    end.record()
    torch.cuda.synchronize()
    back_to_back = start.elapsed_time(end) * 1e3 / 1000
    src = torch.empty(GPU_COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copies = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        copies.append(start.elapsed_time(end) / 1e3)
    return {"device": torch.cuda.get_device_name(0), "launch_floor_us": launch, "event_pair_us": pair,
            "back_to_back_launch_us": back_to_back, "copy_bandwidth_bytes_per_s": 2 * GPU_COPY_BYTES / min(copies),
            "copy_bytes": GPU_COPY_BYTES, "torch": torch.__version__}


if __name__ == "__main__":
    out = {"cpu": cpu(), "gpu": gpu() if "--cpu-only" not in sys.argv else {"error": "not asked"}}
    print(json.dumps(out))
