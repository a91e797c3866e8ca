#!/usr/bin/env python3
"""Does CUDA still run in popkit's sandbox (the root built from nothing), and what does it cost? One command.

    python3 scripts/gpu_sandbox_check.py --out results/ [--pairs 4] [--budget-s 330]

1. What a sandboxed eval sees on this machine: CUDA available, the GPU's name, the root's top folders, HOME
   (empty), /dev (the GPU's nodes, no disk) and /etc, said on stderr by a vectoradd submission (`popkit test`).
2. Pooled pairs: the bare eval (scripts/bare_eval.py: the task's eval run directly, no popkit) against `popkit
   test` in the sandbox, alternating, `--pairs` times per file, on vectoradd's CUDA (built once first, then from
   the store) and PyTorch examples; the ratio is the median of `popkit test` over the median of the bare run,
   per file, and pooled (the median of every pair's ratio). They come before step 3, so that a cut budget still
   measures them.
3. Each bundled CUDA example (submissions/*/cuda.py): `popkit test FILE --json` twice, in the sandbox: the first
   builds (in its private cache, then the store), the second must skip the pre-step (the store's entry of its
   key). Both verdicts must be `passed`, with isolation `namespaces`.

Writes OUT/sandbox_check.json after every step and prints a short table last. `--budget-s` stops starting new
steps after that many seconds (about 6 minutes on one H100 by default). `--dry-run` prints the plan only.
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CUDA_FILES = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
PAIR_FILES = ("vectoradd/cuda.py", "vectoradd/pytorch.py")

# A vectoradd submission that says on stderr what its process sees (it reaches the run's --json), then adds.
PROBE = r'''#!POPCORN leaderboard vectoradd
import json, os, sys
import torch
seen = {"uid": os.getuid(), "root": sorted(os.listdir("/")), "home": sorted(os.listdir(os.environ.get("HOME", "/"))),
        "dev": sorted(os.listdir("/dev")), "etc": sorted(os.listdir("/etc")), "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""}
print("popkit-sandbox-check " + json.dumps(seen), file=sys.stderr)


def custom_kernel(data):
    a, b = data
    return a + b
'''
MARK = "popkit-sandbox-check "


def popkit_test(path: Path, isolation: str = "auto") -> tuple[float, dict]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "popkit", "test", str(path), "--no-history", "--json"],
                          capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=600,
                          env={**os.environ, "POPKIT_ISOLATION": isolation})
    seconds = time.monotonic() - start
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {"unparsed": done.stdout[-1500:], "stderr": done.stderr[-3000:]}
    return seconds, doc


def summary(doc: dict) -> dict:
    """What one `popkit test --json` document says about the sandbox: verdict, isolation, the pre-step."""
    pre = doc.get("precompile") or {}
    return {"outcome": doc.get("outcome"), "isolation": (doc.get("isolation") or {}).get("level"),
            "isolation_detail": (doc.get("isolation") or {}).get("detail"),
            "prestep_ran": bool(pre), "prestep_s": pre.get("duration_s"),
            "failures": [(r.get("summary"), (r.get("stderr") or "")[-1200:]) for r in doc.get("runs", [])
                         if r.get("outcome") not in (None, "passed")] or doc.get("stderr") or doc.get("unparsed")}


def ratio(popkit_s: list[float], bare_s: list[float]) -> float | None:
    return statistics.median(popkit_s) / statistics.median(bare_s) if popkit_s and bare_s else None


def pooled(rows: list[dict]) -> float | None:
    """The median over every pair of every file of popkit's time over the bare run's."""
    pairs = [p / b for row in rows for p, b in zip(row["popkit_s"], row["bare_s"]) if b > 0]
    return statistics.median(pairs) if pairs else None


def probe_inside(folder: Path) -> dict:
    """What a sandboxed eval sees here: `popkit test` of PROBE, its first eval's stderr line."""
    path = folder / "sandbox_probe.py"
    path.write_text(PROBE)
    _, doc = popkit_test(path)
    for run in doc.get("runs", []):
        for line in (run.get("stderr") or "").splitlines():
            if line.startswith(MARK):
                return {**json.loads(line[len(MARK):]), "outcome": doc.get("outcome"),
                        "isolation": (doc.get("isolation") or {}).get("level")}
    return {"outcome": doc.get("outcome"), "doc": summary(doc)}


def table(results: dict) -> str:
    lines = ["| file | 1st run | 2nd run | pre-step 2nd | isolation |", "|---|---|---|---|---|"]
    for row in results.get("cuda", []):
        first, second = row["first"], row["second"]
        lines.append(f"| {row['file']} | {first['outcome']} | {second['outcome']} | "
                     f"{'ran' if second['prestep_ran'] else 'skipped'} | {first['isolation']} |")
    lines += ["", "| file | bare (median) | popkit test (median) | ratio |", "|---|---|---|---|"]
    for row in results.get("pairs", []):
        r = ratio(row["popkit_s"], row["bare_s"])
        lines.append(f"| {row['file']} | {statistics.median(row['bare_s']):.2f} s | "
                     f"{statistics.median(row['popkit_s']):.2f} s | {r:.3f} |" if r else f"| {row['file']} | | | |")
    if results.get("pooled") is not None:
        lines.append(f"\npooled ratio (median of per-pair ratios): {results['pooled']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = {"cuda": [f"{name}/cuda.py" for name in CUDA_FILES], "pairs": list(PAIR_FILES), "pair_count": args.pairs}
    results: dict = {"plan": plan, "cuda": [], "pairs": []}
    out = args.out / "sandbox_check.json"
    if args.dry_run:
        out.write_text(json.dumps(results, indent=1))
        print(json.dumps(plan, indent=1))
        return 0
    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)  # noqa: E731
    results["inside"] = probe_inside(args.out)
    print("inside the sandbox:", json.dumps(results["inside"]), flush=True)
    out.write_text(json.dumps(results, indent=1))
    from bare_eval import bare_run

    for name in plan["pairs"]:
        if left() < 30:
            results.setdefault("skipped", []).append(f"pairs {name}")
            continue
        path = ROOT / "submissions" / name
        task = ROOT / "tasks" / name.split("/")[0]
        popkit_test(path)  # warm: the store holds the build, the page cache the files
        bare_run(task, path.read_text(), "test")  # and the bare eval's own build cache (a cold build took 70 s)
        row = {"file": name, "popkit_s": [], "bare_s": [], "outcomes": []}
        for i in range(args.pairs):
            for side in (("bare", "popkit") if i % 2 == 0 else ("popkit", "bare")):
                if side == "bare":
                    t = time.monotonic()
                    bare = bare_run(task, path.read_text(), "test")
                    row["bare_s"].append(time.monotonic() - t)
                    row["outcomes"].append(("bare", bare.get("_passed")))
                else:
                    seconds, doc = popkit_test(path)
                    row["popkit_s"].append(seconds)
                    row["outcomes"].append(("popkit", doc.get("outcome")))
        row["ratio"] = ratio(row["popkit_s"], row["bare_s"])
        results["pairs"].append(row)
        results["pooled"] = pooled(results["pairs"])
        out.write_text(json.dumps(results, indent=1))
    for name in plan["cuda"]:
        if left() < 60:
            results.setdefault("skipped", []).append(name)
            continue
        path = ROOT / "submissions" / name
        first_s, first = popkit_test(path)
        second_s, second = popkit_test(path)
        row = {"file": name, "first": summary(first), "second": summary(second), "first_s": first_s,
               "second_s": second_s}
        results["cuda"].append(row)
        out.write_text(json.dumps(results, indent=1))
        print(f"{name}: {row['first']['outcome']} ({first_s:.1f} s), again {row['second']['outcome']} "
              f"({second_s:.1f} s, pre-step {'ran' if row['second']['prestep_ran'] else 'skipped'})", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
