"""What the sealed check costs a ranked score: leaderboard mode with the trust checks on against off, per shape.

Run from the repository root on a CUDA machine (no popkit install needed; no network):

    python3 scripts/gpu_split_cost.py --out DIR [--tasks vectoradd,softmax] [--pairs 3] [--budget-s 500]

With the trust checks on (popkit's default), every timed call's output crosses to the eval's trusted process,
which judges it there with its own CUDA context while the worker waits; off (`POPKIT_TRUST=0`, what the
leaderboard's runner does) the worker checks its own output in its own process. Per bundled CUDA example
(submissions/TASK/cuda.py), the task's eval runs in leaderboard mode directly (scripts/bare_eval.py, no popkit
around it), once to build, then `--pairs` times each way in alternating order. Per shape: the median of each
run's median (the kernel's typical call) and of each run's mean (what the leaderboard ranks), sealed over open,
and the spread between runs of one way (largest run median over smallest), so a cost can be told from the
noise between processes. And the time witness's margin on the sealed side: per timed call, the trusted clock's
time beyond the report and the credited overhead (its tolerance on a GPU is 1 ms a call), median and largest.

Two more ways tell the parts of that cost apart: `untraced` (trust checks on, `POPKIT_TIMING_AUDIT=off`: the split
without the GPU trace audit) and `spun` (trust checks on, `POPKIT_WORKER_SPIN=1`: the worker polls for each request
instead of sleeping until it comes); `--ways` picks them. On the sealed side also the trace's own time of the
call's kernels (median over calls), so an event time far above it shows time between the events that no kernel
ran.

Writes OUT/split_cost.json and OUT/split_cost.md (the table, printed last) after every run. `--budget-s` starts
no new run after that many seconds. `--dry-run` prints the plan only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bare_eval import bare_run  # noqa: E402

TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
WAYS = {"sealed": {"POPKIT_TRUST": "1"}, "open": {"POPKIT_TRUST": "0"},
        "untraced": {"POPKIT_TRUST": "1", "POPKIT_TIMING_AUDIT": "off"},
        "spun": {"POPKIT_TRUST": "1", "POPKIT_WORKER_SPIN": "1"}}
PARTS = ("untraced", "spun")  # the ways that change one part of the sealed run


def shapes(result: dict) -> dict[str, tuple[float, float]]:
    """spec -> (median, mean) in ns of one run's timed shapes (those that passed)."""
    found = {}
    for i in range(int(result.get("benchmark-count", 0) or 0)):
        p = f"benchmark.{i}."
        if p + "median" in result and p + "mean" in result:
            found[result.get(p + "spec", str(i))] = (float(result[p + "median"]), float(result[p + "mean"]))
    return found


def per_call(result: dict, spec: str, key: str) -> list[float]:
    """One run's per-call list `benchmark.I.KEY` of a shape: `unexplained_ns` (the time witness's margins: the
    trusted clock's time beyond the report and the credited overhead) or `kernel_ns` (the trace's time of the
    call's kernels); both are written with the trust checks on, the second with the trace audit."""
    for i in range(int(result.get("benchmark-count", 0) or 0)):
        p = f"benchmark.{i}."
        if result.get(p + "spec", str(i)) == spec:
            return [float(x) for x in result.get(p + key, "").split(",") if x.strip()]
    return []


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """Per shape timed by the sealed and open ways (and each of PARTS that ran): the medians over runs, each
    over open, and each way's spread."""
    rows = []
    ways = [way for way in WAYS if runs.get(way)]
    specs = [s for s in shapes(runs["sealed"][0]) if all(s in shapes(r) for way in ways for r in runs[way])] \
        if runs.get("sealed") and runs.get("open") else []
    for spec in specs:
        row = {"shape": spec}
        for way in ways:
            medians = [shapes(r)[spec][0] for r in runs[way]]
            means = [shapes(r)[spec][1] for r in runs[way]]
            row[way] = {"median_ns": statistics.median(medians), "mean_ns": statistics.median(means),
                        "spread": max(medians) / min(medians), "runs": len(medians)}
        row["median_ratio"] = row["sealed"]["median_ns"] / row["open"]["median_ns"]
        row["mean_ratio"] = row["sealed"]["mean_ns"] / row["open"]["mean_ns"]
        for way in PARTS:
            if way in row:
                row[f"{way}_median_ratio"] = row[way]["median_ns"] / row["open"]["median_ns"]
        margins = sorted(x for r in runs["sealed"] for x in per_call(r, spec, "unexplained_ns"))
        if margins:  # how close honest calls come to the witness's tolerance (1 ms a call on a GPU)
            row["unexplained_ns"] = {"median": statistics.median(margins), "max": margins[-1]}
        kernels = [x for r in runs["sealed"] for x in per_call(r, spec, "kernel_ns")]
        if kernels:
            row["sealed"]["trace_kernel_ns"] = statistics.median(kernels)
        rows.append(row)
    return rows


def table(results: dict) -> str:
    lines = ["| task | shape | open median | sealed median | sealed / open (medians) | sealed / open (means) | "
             "untraced / open (medians) | spun / open (medians) | sealed: trace's kernel time | "
             "spread open, sealed | witness: unexplained median, max |", "|---" * 11 + "|"]
    for task, entry in results["tasks"].items():
        for row in entry.get("rows", []):
            margin, kernel = row.get("unexplained_ns"), row["sealed"].get("trace_kernel_ns")
            witness = f"{margin['median'] / 1e3:.1f} µs, {margin['max'] / 1e3:.1f} µs" if margin else "-"
            parts = " | ".join(f"{row[f'{way}_median_ratio']:.3f}" if f"{way}_median_ratio" in row else "-"
                               for way in PARTS)
            lines.append(f"| {task} | {row['shape']} | {row['open']['median_ns'] / 1e3:.1f} µs | "
                         f"{row['sealed']['median_ns'] / 1e3:.1f} µs | {row['median_ratio']:.3f} | "
                         f"{row['mean_ratio']:.3f} | {parts} | "
                         f"{f'{kernel / 1e3:.1f} µs' if kernel else '-'} | "
                         f"{row['open']['spread']:.2f}x, {row['sealed']['spread']:.2f}x | {witness} |")
        if entry.get("failed"):
            lines.append(f"| {task} | runs that did not pass: {', '.join(entry['failed'])} | | | | | | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=500.0)
    parser.add_argument("--tasks-root", type=Path, default=ROOT / "tasks", help=argparse.SUPPRESS)
    parser.add_argument("--file", default="cuda.py", help="the example file in submissions/TASK/")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, sealed and open among them: "
                                                              f"{', '.join(WAYS)}")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if not (args.tasks_root / t / "task.yml").is_file()]
    if unknown:
        parser.error(f"no task {', '.join(unknown)} under {args.tasks_root}")
    ways = tuple(w.strip() for w in args.ways.split(",") if w.strip())
    if not {"sealed", "open"} <= set(ways) or set(ways) - set(WAYS):
        parser.error(f"--ways {args.ways}: sealed and open, and any of {', '.join(PARTS)}")
    order = [ways if i % 2 == 0 else ways[::-1] for i in range(args.pairs)]
    if args.dry_run:
        for task in tasks:
            print(f"{task}: build once, then {', '.join('/'.join(o) for o in order)} (leaderboard mode)")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict = {"tasks": {}, "pairs": args.pairs}

    def save() -> None:  # both files after every run: a run cut by its time limit keeps its table
        (args.out / "split_cost.json").write_text(json.dumps(results, indent=1))
        (args.out / "split_cost.md").write_text(table(results) + "\n")

    for task in tasks:
        source = (ROOT / "submissions" / task / args.file).read_text()
        entry = results["tasks"].setdefault(task, {"runs": {way: [] for way in ways}, "failed": []})
        bare_run(args.tasks_root / task, source, "leaderboard", env=WAYS["sealed"])  # the build, untimed
        for pair in order:
            for way in pair:
                if time.monotonic() - started > args.budget_s:
                    results.setdefault("skipped", []).append(f"{task} {way}")
                    continue
                t = time.monotonic()
                result = bare_run(args.tasks_root / task, source, "leaderboard", env=WAYS[way])
                if not result["_passed"]:
                    entry["failed"].append(f"{way} (exit {result['_exit']})")
                    continue
                entry["runs"][way].append({**{k: v for k, v in result.items() if not k.startswith("_")},
                                           "_seconds": round(time.monotonic() - t, 2)})
                entry["rows"] = summarize(entry["runs"])
                save()
    save()
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
