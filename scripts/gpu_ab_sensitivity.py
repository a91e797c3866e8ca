#!/usr/bin/env python3
"""How small a slowdown `popkit bench A B` names, on the bundled CUDA examples (docs/timing.md).

Run from the repository root on a CUDA machine with popkit importable (no network needed):

    python3 scripts/gpu_ab_sensitivity.py --out OUTDIR [--tasks vectorsum,softmax] [--repeats 1] [--minutes 8]

Steps (a step that would not fit in --minutes is skipped and said so):
  doctor     `popkit doctor --timing --json`: launch floor, event pair, copy bandwidth, clocks
  calibrate  one child with torch: each benchmark shape's input size (the key the planted code looks up)
             and what one extra in-place add over n float32 elements adds when queued behind other work
             (median time of a busy kernel and the add, less the busy kernel's alone; CUDA events)
  per task   `popkit bench submissions/TASK/cuda.py` once (each shape's median time t), then default A/Bs
             (8 rounds at most, 60 s budget) of cuda.py against: an identical copy (`same`), and the
             same file plus extra device work after each call sized for SHARES of t (`1%`, `5%`) —
             one add over a buffer of its own, picked from the calibration curve, never
             torch.cuda._sleep (the harness's marker); the output is untouched.
A shape whose target is below one extra kernel's least cost gets that least cost: its planted share
(the `planted` column, predicted from the curve) is then above the target, and the table says so.

Pass criteria: >= 5% named slower in >= 95% of its shape verdicts; 1% named in >= 90% of the
verdicts at shapes of 100 us or more; identical files: at most 1 winner in >= 60 verdicts (more tasks and
--repeats get there: the lead runs it in several calls); every A/B <= 60 s.

Writes OUTDIR/ab_sensitivity.json (every A/B's document, the calibration, doctor --timing), updated after
each step; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

TASKS = ("vectoradd", "vectorsum", "grayscale", "softmax", "matmul", "identity")
DEFAULT_TASKS = ("vectorsum", "softmax")
SHARES = {"1%": 0.01, "5%": 0.05}
LARGE_NS = 100_000  # the 1% criterion counts shapes of 100 us or more
AB_S = 70.0  # what one default A/B may take, for the time plan (60 s budget, set-up, the last block)

KEY_SOURCE = '''
def _plant_key(data):
    """The number of input elements: what tells the benchmark shapes apart."""
    if hasattr(data, "numel"):
        return int(data.numel())
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        return sum(_plant_key(x) for x in data)
    return 0
'''

PLANT_TAIL = '''

# --- planted by scripts/gpu_ab_sensitivity.py: the same kernel, then extra device work of its own -------
import torch as _plant_torch
{key_source}
_PLANT_SIZES = {sizes!r}  # input elements -> float32 elements of the extra add
_plant_buffers = {{}}
_plant_inner = custom_kernel


def custom_kernel(data):
    out = _plant_inner(data)
    n = _PLANT_SIZES.get(_plant_key(data))
    if n:
        device = out.device if hasattr(out, "device") else "cuda"
        if n not in _plant_buffers:
            _plant_buffers[n] = _plant_torch.zeros(n, dtype=_plant_torch.float32, device=device)
        _plant_buffers[n].add_(1.0)  # queued after the kernel, on the same queue: the timed call waits for it
    return out
'''

CALIBRATE_CHILD = KEY_SOURCE + '''
import importlib.util, json, sys, torch
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["tasks"])
keys = {}
for task, cases in spec["cases"].items():
    loader = importlib.util.spec_from_file_location(f"ref_{task}", f"{spec['tasks']}/{task}/reference.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    keys[task] = [_plant_key(module.generate_input(**case)) for case in cases]
    torch.cuda.synchronize()
curve = []
busy = torch.zeros(2**26, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
import statistics


def timed(work):
    times = []
    for _ in range(30):
        torch.cuda.synchronize()
        start.record()
        work()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e6)
    return statistics.median(times)


for power in range(8, 29):
    buf = torch.zeros(2**power, device="cuda")
    buf.add_(1.0)
    alone = timed(lambda: busy.add_(1.0))
    both = timed(lambda: (busy.add_(1.0), buf.add_(1.0)))
    curve.append([2**power, max(both - alone, 1.0)])
    del buf
print(json.dumps({"device": torch.cuda.get_device_name(0), "keys": keys, "curve": curve}))
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def plant_text(source: str, sizes: dict[int, int]) -> str:
    """The submission's text with the planted extra work after every call (sizes: input elements -> n)."""
    return source + PLANT_TAIL.format(key_source=KEY_SOURCE, sizes=dict(sizes))


def choose(curve: list[list[float]], target_ns: float) -> tuple[int, float]:
    """The buffer (float32 elements) whose extra add costs closest to `target_ns` (log scale), never less
    than the curve's smallest, and the cost the curve predicts for it."""
    import math

    n, cost = min(curve, key=lambda point: abs(math.log(point[1] / target_ns)))
    return int(n), float(cost)


def benchmark_cases(task_dir: Path) -> list[dict]:
    return yaml.safe_load((task_dir / "task.yml").read_text())["benchmarks"]


def trace_agreement(cases) -> list[dict]:
    """Per shape with the harness's trace breakdown: kernels plus gaps against the event time (medians)."""
    rows = []
    for case in cases:
        b = case.breakdown
        event = case.median_ns or case.mean_ns
        if b and event:
            traced = b["kernel_ns"] + b.get("gap_ns", 0.0)
            rows.append({"spec": case.spec, "event_ns": event, "trace_ns": traced, "trace_over_event": traced / event,
                         "launches": b.get("launches")})
    return rows


def shape_rows(results: dict) -> list[dict]:
    """One row per shape verdict of every A/B: its task, kind, planted share, ratio and verdict."""
    rows = []
    for ab in results["abs"]:
        doc, plan = ab["report"], results["plans"].get(ab["task"], {})
        for i, shape in enumerate(doc.get("shapes", ())):
            base = plan.get("base_ns", [None] * (i + 1))[i]
            planted = plan.get("planted", {}).get(ab["kind"], [0.0] * (i + 1))[i] if ab["kind"] != "same" else 0.0
            ratio = shape.get("ratio") or {}
            rows.append({"task": ab["task"], "kind": ab["kind"], "spec": shape["spec"], "base_ns": base,
                         "planted": planted, "estimate": ratio.get("estimate"), "low": ratio.get("low"),
                         "high": ratio.get("high"), "verdict": shape["verdict"], "rounds": shape["rounds"],
                         "stalled": len(shape.get("stalled") or {}), "seconds": ab["seconds"]})
    return rows


def summary(rows: list[dict]) -> dict:
    """The issue's criteria over the shape verdicts."""
    def share(kind: str, large: bool = False) -> dict:
        mine = [r for r in rows if r["kind"] == kind and (not large or (r["base_ns"] or 0) >= LARGE_NS)]
        named = sum(r["verdict"] == "a_faster" for r in mine)
        return {"verdicts": len(mine), "named_slower": named, "share": named / len(mine) if mine else None}

    same = [r for r in rows if r["kind"] == "same"]
    return {"same_winners": sum(r["verdict"] in ("a_faster", "b_faster") for r in same), "same_verdicts": len(same),
            "5%": share("5%"), "1%": share("1%"), "1% at 100 us+": share("1%", large=True)}


def markdown(results: dict) -> str:
    rows = shape_rows(results)
    lines = [f"{results.get('device', '?')}, {results['started_at']}", "",
             "| task | B | shape | A median | planted | B / A [95% CI] | verdict | rounds (stalled) | A/B s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = f"{r['estimate']:.4f} [{r['low']:.4f}, {r['high']:.4f}]" if r["low"] is not None else "-"
        base = f"{r['base_ns'] / 1e3:.1f} µs" if r["base_ns"] else "-"
        lines.append(f"| {r['task']} | {r['kind']} | {r['spec']} | {base} | {r['planted'] * 100:.1f}% | {ci} | "
                     f"{r['verdict']} | {r['rounds']} ({r['stalled']}) | {r['seconds']:.0f} |")
    traced = [(task, t) for task, plan in results["plans"].items() for t in plan.get("trace", ())]
    if traced:
        lines += ["", "| task | shape | event time | kernels + gaps | ratio | launches |", "|---|---|---|---|---|---|"]
        lines += [f"| {task} | {t['spec']} | {t['event_ns'] / 1e3:.1f} µs | {t['trace_ns'] / 1e3:.1f} µs | "
                  f"{t['trace_over_event']:.3f} | {t['launches']} |" for task, t in traced]
    lines += ["", "```", json.dumps(summary(rows), indent=1), "```"]
    return "\n".join(lines)


class Run:
    def __init__(self, out: Path, minutes: float):
        self.out, self.deadline = out, time.monotonic() + 60 * minutes
        self.tmp = Path(tempfile.mkdtemp(prefix="popkit-ab-sensitivity-"))
        self.results: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "abs": [],
                              "plans": {}, "skipped": []}

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "ab_sensitivity.json").write_text(json.dumps(self.results, indent=1))


def doctor_timing(run: Run) -> None:
    done = subprocess.run([sys.executable, "-m", "popkit", "doctor", "--timing", "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    try:
        run.results["doctor_timing"] = json.loads(done.stdout)
    except ValueError:
        run.results["doctor_timing"] = {"exit_code": done.returncode, "stderr": done.stderr[-2000:]}
    log(f"doctor --timing: exit {done.returncode}")


def calibrate(run: Run, tasks: list[str]) -> dict:
    spec = {"tasks": str(ROOT / "tasks"), "cases": {t: benchmark_cases(ROOT / "tasks" / t) for t in tasks}}
    done = subprocess.run([sys.executable, "-c", CALIBRATE_CHILD, json.dumps(spec)], capture_output=True, text=True,
                          cwd=run.tmp, timeout=300)
    if done.returncode:
        raise SystemExit(f"calibration failed: {done.stderr[-2000:]}")
    found = json.loads(done.stdout.splitlines()[-1])
    run.results.update(device=found["device"], calibration=found)
    log(f"calibrated on {found['device']}: one extra add costs {found['curve'][0][1] / 1e3:.2f} µs at least")
    return found


def one_task(run: Run, task: str, found: dict, repeats: int) -> None:
    source = (ROOT / "submissions" / task / "cuda.py").read_text()
    a = run.tmp / task / "a.py"
    a.parent.mkdir(parents=True)
    a.write_text(source)
    task_dir = str(ROOT / "tasks" / task)
    log(f"{task}: bench A for each shape's time")
    base = api.bench(a, harness="task", task=task_dir, record=False)
    cases = base.report.runs_of("benchmark")[0].benchmarks if base.report.runs_of("benchmark") else ()
    if api.exit_code(base) or not cases:
        run.results["skipped"].append(f"{task}: bench of cuda.py did not pass (exit {api.exit_code(base)})")
        return
    times = [c.median_ns or c.mean_ns for c in cases]
    plan = {"base_ns": times, "planted": {}, "sizes": {}, "trace": trace_agreement(cases)}
    files = {"same": run.tmp / task / "same.py"}
    files["same"].write_text(source)
    for kind, share in SHARES.items():
        picks = [choose(found["curve"], share * t) for t in times]
        sizes = dict(zip(found["keys"][task], (n for n, _ in picks)))
        plan["planted"][kind] = [cost / t for (_, cost), t in zip(picks, times)]
        plan["sizes"][kind] = [n for n, _ in picks]
        files[kind] = run.tmp / task / f"slow{kind[:-1]}.py"
        files[kind].write_text(plant_text(source, sizes))
    run.results["plans"][task] = plan
    for _ in range(repeats):
        for kind in ("same", "1%", "5%"):
            if run.left_s() < AB_S:
                run.results["skipped"].append(f"{task} {kind}: out of time")
                log(f"{task} {kind}: skipped, {run.left_s():.0f} s left")
                continue
            start = time.monotonic()
            outcome = api.bench(a, files[kind], harness="task", task=task_dir, record=False,
                                progress=lambda m: log(f"  {m}"))
            seconds = time.monotonic() - start
            run.results["abs"].append({"task": task, "kind": kind, "seconds": seconds,
                                       "exit_code": api.exit_code(outcome), "report": api.document(outcome)})
            log(f"{task} {kind}: {api.document(outcome).get('verdict')} in {seconds:.0f} s")
            run.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--no-doctor", action="store_true")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}: choose from {', '.join(TASKS)}")
    run = Run(args.out, args.minutes)
    if not args.no_doctor:
        doctor_timing(run)
    found = calibrate(run, tasks)
    run.save()
    for task in tasks:
        one_task(run, task, found, args.repeats)
    run.save()
    print(markdown(run.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
