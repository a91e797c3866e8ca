#!/usr/bin/env python3
"""Does a CUDA eval run inside popkit's sandbox, and what does the sandbox cost? One command on a GPU machine.

    python3 scripts/gpu_sandbox_smoke.py --out results/ [--pairs 3]

For the bundled vectoradd and softmax examples (PyTorch and CUDA), runs `popkit test FILE --json` with
POPKIT_ISOLATION=auto (the sandbox) and =none, alternating, `--pairs` times each, after one build of each
CUDA file; prints verdicts, isolation and wall times (median per side) and writes OUT/sandbox_smoke.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("vectoradd/pytorch.py", "vectoradd/cuda.py", "softmax/pytorch.py", "softmax/cuda.py")


def popkit_test(path: Path, isolation: str) -> tuple[float, dict]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "popkit", "test", str(path), "--no-history", "--json"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "POPKIT_ISOLATION": isolation},
                          stdin=subprocess.DEVNULL, timeout=600)
    seconds = time.monotonic() - start
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {"unparsed": done.stdout[-1500:], "stderr": done.stderr[-3000:]}
    return seconds, doc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"unavailable": None, "rows": []}
    for name in FILES:
        path = ROOT / "submissions" / name
        _, first = popkit_test(path, "auto")  # builds the extension (and warms the page cache)
        if results["unavailable"] is None:  # the run's report says why it ran without the sandbox, if it did
            isolation = first.get("isolation") or {}
            results["unavailable"] = isolation.get("detail", "") if isolation.get("level") == "none" else ""
            print("sandbox unavailable:", repr(results["unavailable"]), flush=True)
        times = {"auto": [], "none": []}
        docs = {}
        for i in range(args.pairs):
            for iso in (("auto", "none") if i % 2 == 0 else ("none", "auto")):
                seconds, doc = popkit_test(path, iso)
                times[iso].append(seconds)
                docs[iso] = doc
        row = {"file": name, "times": times,
               "outcome": {k: d.get("outcome") for k, d in docs.items()},
               "isolation": {k: (d.get("isolation") or {}).get("level") for k, d in docs.items()},
               "device": (docs["auto"].get("system") or {}).get("device"),
               "stderr": {k: d.get("stderr", "")[-1500:] for k, d in docs.items() if "stderr" in d}}
        if docs["auto"].get("outcome") != "passed":
            row["auto_runs"] = [{"summary": r.get("summary"), "stderr": r.get("stderr", "")[-2500:]}
                                for r in docs["auto"].get("runs", [])]
        results["rows"].append(row)
        (args.out / "sandbox_smoke.json").write_text(json.dumps(results, indent=1))
        print(f"{name}: sandbox {row['outcome']['auto']} {statistics.median(times['auto']):.2f} s, "
              f"none {row['outcome']['none']} {statistics.median(times['none']):.2f} s, "
              f"ratio {statistics.median(times['auto']) / statistics.median(times['none']):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
