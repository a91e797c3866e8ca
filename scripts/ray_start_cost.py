#!/usr/bin/env python3
"""What a local Ray instance costs popkit's `--cluster ray`, apart from the runs: `import ray`, the start of a
local instance as popkit makes it (`ray_session.connect`), one task (on a GPU where Ray sees one), and the
instance's shutdown as `connect` does it. Each start is a fresh Python process, so `import ray` is timed cold.

    python3 scripts/ray_start_cost.py --starts 3 [--cpus 8]     # one line per start, then their ranges

On the GPU machine, put an unpacked Ray (scripts/gpu_cluster.py's `--ray-tar` archive) on PYTHONPATH, its
bytecode compiled first as `pip install` does (`python3 -m compileall -q -j 0 DIR`): that machine sets
PYTHONDONTWRITEBYTECODE=1, so without it every Ray process compiles Ray's modules, and `ray.init` takes 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("import", "init", "first_task", "shutdown")

ONE_START = """
import json, sys, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
from popkit.distributed import ray_session
with ray_session.connect(None, lambda _said: None, slots=int(sys.argv[1])):
    t2 = time.perf_counter()
    gpus = 1 if ray.cluster_resources().get("GPU") else 0
    ray.get(ray.remote(num_gpus=gpus)(lambda: None).remote())
    t3 = time.perf_counter()
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "init": t2 - t1, "first_task": t3 - t2, "shutdown": t4 - t3, "gpu": gpus}))
"""


def one_start(cpus: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", ONE_START, str(cpus)], capture_output=True, text=True, env=env,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"ray_start_cost: a start failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(starts: list[dict]) -> str:
    spans = [f"{name.replace('_', ' ')} {min(s[name] for s in starts):.2f}-{max(s[name] for s in starts):.2f} s"
             for name in PHASES]
    totals = [sum(s[name] for name in PHASES) for s in starts]
    return f"{len(starts)} starts: " + ", ".join(spans) + f"; in all {min(totals):.2f}-{max(totals):.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="fresh processes, one start each (default 3)")
    parser.add_argument("--cpus", type=int, default=8,
                        help="CPU slots of the instance (default 8; popkit gives GPU runs one per GPU)")
    args = parser.parse_args(argv)
    if args.starts < 1 or args.cpus < 1:
        parser.error("--starts and --cpus must be at least 1")
    starts = []
    for _ in range(args.starts):
        starts.append(one_start(args.cpus))
        print(json.dumps({k: round(v, 3) for k, v in starts[-1].items()}), flush=True)
    print(summary(starts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
