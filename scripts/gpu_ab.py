#!/usr/bin/env python3
"""The A/B's calibration, sensitivity and speed, measured on a GPU (docs/benchmarks.md, "A/B").

Run from the repository root on a CUDA machine with popkit importable (no network needed):

    python3 scripts/gpu_ab.py --out OUTDIR

What it runs, in this order (a step is skipped when the time left, --minutes, is less than the last
step took); about 7 minutes on an H100 with a warm build cache, one more cold:
  build      `popkit test --precompile` of submissions/{vectoradd,softmax}/cuda.py, at once: its compile
             pre-step warms the eval's build cache (about a minute cold, seconds warm)
  calibrate  per task, one A/B of two byte-identical copies of cuda.py on a copy of the task with
             EXTRA_SHAPES benchmark shapes (more verdicts per eval process: each process costs seconds
             to start); the default design (looks at 4, 6, 8 rounds, warm-up on) with the budget ending
             it at the first look
  speed      `popkit bench A B` with its defaults on vectoradd's four shapes, identical copies (self),
             then cuda.py against its planted slowdown (slow); the wall time of each whole command is
             the speed result, and its shape verdicts count in the tables too
  sensitivity  per task, cuda.py against its planted slowdown, as calibrate
  speed      the same for softmax, if time is left

The planted slowdown is the same file plus one extra pass that multiplies a leading share of the
output by 1 in place (exact, so the checks still pass): SLOW_SHARE of the output's elements, about 2%
of the kernel's bytes, plus one kernel launch; written into a temporary file, never into the repo.

Pass criteria: at most 4 of at least 40 self-comparison shape verdicts name a winner; the
slowdown is named in at least 90% of its shape verdicts at the large shapes (LARGE_ELEMENTS outputs
and up); each speed A/B takes at most 60 s.

Writes OUTDIR/ab.json (raw reports, updated after every A/B) and OUTDIR/ab.md (the tables for
docs/benchmarks.md, with the card and the date); prints the markdown at the end. `--dry-run` runs the
whole script on the CPU against tests/fixtures/tasks/double (the tiny fixture eval) in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

TASKS = ("vectoradd", "softmax")
EXTRA_SHAPES = 18  # benchmark shapes of the calibration copies: 2 x 18 + 4 (speed) = 40 self verdicts
SLOW_SHARE = {"vectoradd": 0.03, "softmax": 0.02}  # output share rewritten: 2% of the kernel's bytes
FIRST_LOOK = 4  # rounds before the A/B's first interval (docs/design.md, "Looks and stopping")
A_FASTER, B_FASTER = "a_faster", "b_faster"  # verdicts of the popkit/ab document
LARGE_ELEMENTS = 16_000_000  # a "large shape" has at least this many output elements (vectoradd 4095² and up)
SPEED_LIMIT_S = 60.0
FALSE_WINNERS_ALLOWED = 4
SLOW_NAMED_SHARE = 0.9

SLOW_TAIL = '''

# --- planted by scripts/gpu_ab.py: the same kernel plus one tiny extra pass -------------------
_ab_inner_kernel = custom_kernel


def custom_kernel(data):
    out = _ab_inner_kernel(data)
    flat = out.view(-1)
    flat[: max(1, int(flat.numel() * {share}))].mul_(1)  # x * 1 == x exactly: the checks still pass
    return out
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def extended_shapes(task: str, count: int) -> list[dict]:
    """`count` benchmark shapes spread from the task's smallest to its largest (seeds from 100 up)."""
    if task == "vectoradd":
        sizes = [int(1024 + (8192 - 1024) * i / (count - 1)) for i in range(count)]
        return [{"size": s, "seed": 100 + i} for i, s in enumerate(sizes)]
    if task == "softmax":
        shapes = [(32768, 128), (8192, 1000), (1024, 32768), (16384, 4096), (4096, 4096), (8192, 2048),
                  (2048, 8192), (16384, 1024), (4096, 8192), (8192, 4096), (32768, 512), (1024, 16384),
                  (12288, 4096), (16384, 2048), (2048, 16384), (8192, 8192), (24576, 1024), (6144, 6144)]
        return [{"rows": r, "cols": c, "seed": 100 + i} for i, (r, c) in enumerate((shapes * 2)[:count])]
    return [{"size": 10 * (i + 1), "seed": 100 + i} for i in range(count)]  # the dry run's fixture task


def elements(case: dict) -> int:
    if "rows" in case:
        return case["rows"] * case["cols"]
    return case["size"] ** 2


class Lab:
    """The temporary tasks, submissions and results of one run of this script."""

    def __init__(self, out: Path, minutes: float, dry_run: bool):
        self.out, self.deadline, self.dry_run = out, time.monotonic() + 60 * minutes, dry_run
        self.tmp = Path(tempfile.mkdtemp(prefix="popkit-gpu-ab-"))
        self.tasks = ("double",) if dry_run else TASKS
        self.results: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "device": device_name(dry_run), "runs": []}
        if dry_run:
            shutil.copytree(ROOT / "tests" / "fixtures" / "tasks", self.tmp / "tasks")
        else:
            shutil.copytree(ROOT / "tasks", self.tmp / "tasks")
        self.subs = {task: self._submissions(task) for task in self.tasks}

    def _submissions(self, task: str) -> dict[str, Path]:
        source = ROOT / ("tests/fixtures/submissions/good.py" if self.dry_run else f"submissions/{task}/cuda.py")
        folder = self.tmp / "subs" / task
        folder.mkdir(parents=True)
        text = source.read_text()
        paths = {name: folder / f"{name}.py" for name in ("a", "b", "slow")}
        paths["a"].write_text(text)
        paths["b"].write_text(text)  # byte-identical
        share = SLOW_SHARE.get(task, 0.02)
        if self.dry_run:  # the fixture's kernel returns an int: the planted pass is a Python loop
            paths["slow"].write_text(text + "\n_inner = custom_kernel\n\n\ndef custom_kernel(n):\n"
                                     "    sum(range(2000))\n    return _inner(n)\n")
        else:
            paths["slow"].write_text(text + SLOW_TAIL.format(share=share))
        return paths

    def extended_task(self, task: str) -> Path:
        """A copy of the task with EXTRA_SHAPES benchmark shapes, beside the other tasks (same relative files)."""
        src = self.tmp / "tasks" / task
        dest = self.tmp / "tasks" / f"{task}_ab"
        if not dest.exists():
            shutil.copytree(src, dest)
            spec = yaml.safe_load((src / "task.yml").read_text())
            spec["benchmarks"] = extended_shapes(task, EXTRA_SHAPES)
            spec["ranking_by"] = "geom"
            (dest / "task.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
        return dest

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "ab.json").write_text(json.dumps(self.results, indent=1, default=str))


def device_name(dry_run: bool) -> str:
    if dry_run:
        return "cpu (dry run)"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"


def build(lab: Lab) -> None:
    """`popkit test --precompile` of each task's cuda.py, at once: its compile pre-step warms the eval's build
    cache (`popkit compile` builds into a folder of its own) and records it, so the A/Bs skip their pre-steps."""

    def one(task: str) -> tuple[str, int, float]:
        start = time.monotonic()
        outcome = api.test(lab.subs[task]["a"], harness="task", task=str(lab.tmp / "tasks" / task), precompile=True,
                           record=False)
        step = outcome.report.precompile
        code = step.exit_code if step is not None else 0
        return task, code, time.monotonic() - start

    log("build: the compile pre-step of " + ", ".join(f"{t}/cuda.py" for t in lab.tasks))
    with ThreadPoolExecutor(len(lab.tasks)) as pool:
        for task, code, secs in pool.map(one, lab.tasks):
            lab.results.setdefault("build", {})[task] = {"exit_code": code, "seconds": round(secs, 1)}
            log(f"build {task}: exit {code}, {secs:.0f} s")
    lab.save()


def speed(lab: Lab, task: str, kind: str) -> None:
    """`popkit bench A B` with its defaults, timed from the outside."""
    subs = lab.subs[task]
    b = subs["b"] if kind == "self" else subs["slow"]
    argv = [sys.executable, "-m", "popkit", "bench", str(subs["a"]), str(b), "--task", str(lab.tmp / "tasks" / task),
            "--json", "--no-history"]
    if lab.dry_run:
        argv += ["--no-precompile"]
    log(f"speed {task} {kind}: {' '.join(argv[3:])}")
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    wall = time.monotonic() - start
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {"unparsed_stdout": done.stdout[-2000:], "stderr": done.stderr[-4000:]}
    record(lab, task, kind, "speed", report, wall, done.returncode)


def calibrate(lab: Lab, task: str, kind: str) -> None:
    """One A/B on the task's copy with EXTRA_SHAPES shapes; the budget ends it at the first look."""
    subs = lab.subs[task]
    b = subs["b"] if kind == "self" else subs["slow"]
    log(f"calibrate {task} {kind}: {EXTRA_SHAPES} shapes, {FIRST_LOOK} rounds")
    start = time.monotonic()
    outcome = api.bench(subs["a"], b, harness="task", task=str(lab.extended_task(task)), precompile=False, budget_s=1.0,
                        record=False, progress=lambda msg: log(f"  {msg}"))
    record(lab, task, kind, "calibrate", api.document(outcome), time.monotonic() - start, api.exit_code(outcome))


def record(lab: Lab, task: str, kind: str, step: str, report: dict, wall: float, code: int) -> None:
    lab.results["runs"].append({"task": task, "kind": kind, "step": step, "wall_s": round(wall, 1),
                                "exit_code": code, "report": report})
    verdicts = [s.get("verdict") for s in report.get("shapes", [])]
    log(f"  {task} {kind} ({step}): {wall:.1f} s, exit {code}, rounds {report.get('rounds')}, "
        f"stopped {report.get('stopped')}, verdicts {verdicts}")
    lab.save()


# ------------------------------------------------------------------------------------- the tables


def shape_rows(results: dict, kind: str) -> list[dict]:
    """Every shape verdict of `kind` (self or slow) with its task, step, size and interval."""
    rows = []
    for run in results["runs"]:
        if run["kind"] != kind:
            continue
        for shape in run["report"].get("shapes", []):
            case = dict(part.split(": ", 1) for part in shape["spec"].split("; "))
            size = {k: int(v) for k, v in case.items() if k in ("size", "rows", "cols")}
            rows.append({"task": run["task"], "step": run["step"], "spec": shape["spec"],
                         "large": elements(size) >= LARGE_ELEMENTS if size else False,
                         "ratio": shape.get("ratio"), "verdict": shape["verdict"], "rounds": shape["rounds"]})
    return rows


def _ratio(r: dict | None) -> str:
    if not r or r.get("low") is None:
        return "-"
    return f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def summary(results: dict) -> dict:
    own = shape_rows(results, "self")
    slow = [r for r in shape_rows(results, "slow") if r["large"]]
    speeds = [{"task": r["task"], "kind": r["kind"], "wall_s": r["wall_s"], "rounds": r["report"].get("rounds"),
               "stopped": r["report"].get("stopped"), "evals": len(r["report"].get("eval_s", [])),
               "eval_s": sum(r["report"].get("eval_s", [])) / max(1, len(r["report"].get("eval_s", [])))}
              for r in results["runs"] if r["step"] == "speed"]
    winners = sum(r["verdict"] in (A_FASTER, B_FASTER) for r in own)
    named = sum(r["verdict"] == A_FASTER for r in slow)  # A is the original: the slow B takes longer
    return {"self_verdicts": len(own), "self_winners": winners,
            "self_ok": len(own) >= 40 and winners <= FALSE_WINNERS_ALLOWED,
            "slow_large_verdicts": len(slow), "slow_large_named": named,
            "slow_ok": bool(slow) and named >= SLOW_NAMED_SHARE * len(slow),
            "speeds": speeds, "speed_ok": bool(speeds) and all(s["wall_s"] <= SPEED_LIMIT_S for s in speeds)}


def markdown(results: dict) -> str:
    s = summary(results)
    lines = [f"A/B calibration on {results['device']}, {results['started_at'][:10]} (scripts/gpu_ab.py).", "",
             f"**Identical files**: {s['self_winners']} of {s['self_verdicts']} shape verdicts named a winner "
             f"(allowed: {FALSE_WINNERS_ALLOWED} of at least 40; a correct 95% interval names about 2).", "",
             "| task | A/B | shape | B / A [95% CI] | verdict | rounds |", "|---|---|---|---|---|---|"]
    for r in shape_rows(results, "self"):
        lines.append(f"| {r['task']} | {r['step']} | {r['spec']} | {_ratio(r['ratio'])} | {r['verdict']} "
                     f"| {r['rounds']} |")
    lines += ["", f"**Planted slowdown** (B = A plus one small extra pass): named at "
              f"{s['slow_large_named']} of {s['slow_large_verdicts']} shape verdicts at the large shapes "
              f"(≥ {LARGE_ELEMENTS:,} output elements; required: {SLOW_NAMED_SHARE:.0%}).", "",
              "| task | A/B | shape | large | B / A [95% CI] | verdict | rounds |", "|---|---|---|---|---|---|---|"]
    for r in shape_rows(results, "slow"):
        lines.append(f"| {r['task']} | {r['step']} | {r['spec']} | {'yes' if r['large'] else ''} | "
                     f"{_ratio(r['ratio'])} | {r['verdict']} | {r['rounds']} |")
    lines += ["", "**Speed**: `popkit bench A B` with its defaults (four shapes, warm build cache), whole command:",
              "", "| task | pair | wall time | rounds | stopped | counted evals, mean time each |",
              "|---|---|---|---|---|---|"]
    for sp in s["speeds"]:
        lines.append(f"| {sp['task']} | {sp['kind']} | {sp['wall_s']:.1f} s | {sp['rounds']} | {sp['stopped']} | "
                     f"{sp['evals']} × {sp['eval_s']:.1f} s |")
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    lines += ["", f"Calibration {verdict(s['self_ok'])} · sensitivity {verdict(s['slow_ok'])} · "
              f"speed {verdict(s['speed_ok'])}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for ab.json and ab.md")
    parser.add_argument("--minutes", type=float, default=7.5, help="start no step expected to end after this")
    parser.add_argument("--dry-run", action="store_true", help="run everything on the CPU fixture task")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    lab = Lab(args.out, args.minutes, args.dry_run)
    first = lab.tasks[0]
    steps = [(build, (lab,))] + [(calibrate, (lab, task, "self")) for task in lab.tasks]
    steps += [(speed, (lab, first, "self")), (speed, (lab, first, "slow"))]
    steps += [(calibrate, (lab, task, "slow")) for task in lab.tasks]
    steps += [(speed, (lab, task, kind)) for task in lab.tasks[1:] for kind in ("self", "slow")]
    last = 0.0
    try:
        for func, call_args in steps:
            if last and lab.left_s() < last:
                log(f"skipped {func.__name__}{call_args[1:]}: {lab.left_s():.0f} s left, the last step took"
                    f" {last:.0f} s")
                continue
            start = time.monotonic()
            func(*call_args)
            last = time.monotonic() - start if func is not build else 0.0
    finally:
        lab.results["summary"] = summary(lab.results)
        lab.save()
        text = markdown(lab.results)
        (args.out / "ab.md").write_text(text)
        shutil.rmtree(lab.tmp, ignore_errors=True)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
