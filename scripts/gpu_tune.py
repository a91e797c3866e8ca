#!/usr/bin/env python3
"""`popkit tune` on a GPU: the bundled softmax and matmul CUDA templates and the public pmpp_v2 vectoradd and grayscale.

Run from the repository root on a CUDA machine with popkit importable (no network needed):

    python3 scripts/gpu_tune.py --out OUTDIR [--tasks-root .refk/problems] [--minutes 8]

What it does, in this order (about 7 minutes on an H100 from a cold build cache):
  render   `popkit new --task softmax` and `--task matmul` (CUDA, inline), and the bundled vectoradd and
           grayscale templates for the public pmpp_v2 vectoradd_py and grayscale_py tasks (pmpp_v2 passes an
           output buffer as the last input, which the rendered entry takes and leaves),
           each declaring its launch geometry tunable with every grid point compiled into one extension;
  build    the one build of each file's grid, all at once: a one-variant `popkit tune` of each (its
           build stage: the probe, then the compile pre-step in the grid's extensions folder under popkit's
           data folder, then that variant's check), so the tunes after it find them built; its wall time is
           reported apart;
  tune     per task, `popkit tune` (popkit.api.tune, the call behind the command) with --max-variants
           (default 6, a seeded sample of the grid that includes the default values), --confirm 1, A/Bs of 4
           rounds, and a time budget that shares what is left of --minutes among the tasks still to run.
           matmul runs on a copy of the task without its 8192^3 shape (one call of the naive kernel takes about
           0.1 s there, and the benchmark loop makes up to 100 of them per eval).

Per task it reports the tuned/default time ratio with its A/B interval (1 when the default values were
kept: no variant was faster in an A/B, or the default itself won the race), the variants, the builds, and
the wall time. Writes OUTDIR/tune.json (updated after every task, raw reports included) and
OUTDIR/tune.md, and prints the markdown table last. `--dry-run` does all of it on the CPU with the tiny
fixture task tests/fixtures/tasks/chunksum and its tunable PyTorch submission (a minute or two).
"""

from __future__ import annotations

import argparse
import json
import shutil
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

PUBLIC = Path("pmpp_v2") / "vectoradd_py"
# The public tasks tuned with a bundled template: folder, template task, and the entry's unpacking rewritten to
# take pmpp_v2's output buffer (vectoradd: (A, B, C); grayscale: (rgb, gray)).
PUBLIC_TASKS = ((PUBLIC, "vectoradd", ("\n    a, b = data\n", "\n    a, b, _ = data\n")),
                (Path("pmpp_v2") / "grayscale_py", "grayscale", ("\n    rgb = data\n", "\n    rgb, _ = data\n")))
ROOTS = (ROOT / ".refk" / "problems", Path("/work/refk/problems"))
MATMUL_DROPPED = {"m": 8192, "n": 8192, "k": 8192}
MARGIN_S = 20.0  # kept back from each task's budget for what runs after its last stage (the final check)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def plan(tmp: Path, tasks_root: Path | None, dry_run: bool) -> list[dict]:
    """The tasks to tune: name, task folder, the tunable file."""
    if dry_run:
        task_dir = ROOT / "tests" / "fixtures" / "tasks" / "chunksum"
        return [{"name": "chunksum (dry run)", "task": task_dir, "file": ROOT / "tests" / "fixtures" / "tune" / "chunksum.py"}]
    rows = []
    for name in ("softmax", "matmul"):
        task_dir = bundled_tasks() / name
        if name == "matmul":
            task_dir = trimmed_matmul(tmp)
        rows.append({"name": name, "task": task_dir, "file": rendered(tmp, name, name)})
    root = tasks_root or next((r for r in ROOTS if (r / PUBLIC).is_dir()), None)
    if root is None or not all((root / path).is_dir() for path, _, _ in PUBLIC_TASKS):
        wanted = " and ".join(str(path) for path, _, _ in PUBLIC_TASKS)
        raise SystemExit(f"no {wanted} under {tasks_root or ' or '.join(map(str, ROOTS))}: pass --tasks-root")
    for path, template, (entry, public_entry) in PUBLIC_TASKS:
        public = rendered(tmp, template, f"{template}_v2")
        text = public.read_text()
        assert entry in text, f"the bundled {template} template's entry changed: adapt it to {path} here"
        # pmpp_v2 passes an output buffer as the last input; the rendered entry takes it and returns a new tensor.
        public.write_text(text.replace(entry, public_entry))
        rows.append({"name": f"pmpp_v2 {template}", "task": root / path, "file": public})
    return rows


def bundled_tasks() -> Path:
    """The folder of popkit's bundled tasks (beside their shared files)."""
    return api.task_show("softmax").task.path.parent


def rendered(tmp: Path, template_task: str, name: str) -> Path:
    """`popkit new --task TEMPLATE_TASK` (CUDA, inline) written to TMP/NAME.py."""
    path = tmp / f"{name}.py"
    api.new(template_task, path, target="cuda", style="inline", force=True)
    return path


def trimmed_matmul(tmp: Path) -> Path:
    """A copy of the bundled matmul task (beside copies of its shared files) without the 8192^3 shape."""
    dest = tmp / "tasks" / "matmul"
    if not dest.exists():
        shutil.copytree(bundled_tasks(), tmp / "tasks", dirs_exist_ok=True)
        spec = yaml.safe_load((dest / "task.yml").read_text())
        spec["benchmarks"] = [c for c in spec["benchmarks"] if {k: c.get(k) for k in MATMUL_DROPPED} != MATMUL_DROPPED]
        (dest / "task.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest


def prebuild(rows: list[dict], tmp: Path) -> dict:
    """Each file's grid built at once: a one-variant tune (its build stage on the default values, then that
    variant's check); the grid's build stays in its extensions folder for the tune that follows."""

    def one(row: dict) -> tuple[str, dict]:
        start = time.monotonic()
        report = api.tune(row["file"], tmp / "prebuilt" / row["file"].name,
                          harness="task", task=str(row["task"]), max_variants=1,
                          confirm=1, rounds=4, per_shape=False, record=False, force=True)
        failed = [v.message for v in report.variants if v.outcome == "compile_failed"]
        return row["name"], {"builds": report.builds, "seconds": round(time.monotonic() - start, 1),
                             "failed": failed[0] if failed else ""}

    log("build: " + ", ".join(r["name"] for r in rows) + ", at once")
    with ThreadPoolExecutor(len(rows)) as pool:
        done = dict(pool.map(one, rows))
    for name, info in done.items():
        log(f"build {name}: {info['seconds']} s{' FAILED: ' + info['failed'] if info['failed'] else ''}")
    return done


def summary(name: str, report: dict, wall_s: float, prebuilt: dict) -> dict:
    """One row of the table from a TuneReport's JSON."""
    winner = next((v for v in report["variants"] if v["index"] == report["winner"]), None)
    ratio = ((winner or {}).get("ab") and winner["ab"].get("score") and winner["ab"]["score"].get("ratio")
             or (winner or {}).get("race_ratio"))  # decided by the race's own rounds: no A/B ran
    kept = report["winner"] is None or bool(winner and winner["incumbent"])
    return {
        "task": name, "variants": len([v for v in report["variants"] if v["index"] != -1]),
        "grid_points": report["grid_points"], "passed": len([v for v in report["variants"] if v["outcome"] == "passed"]),
        "builds": report["builds"], "prebuilt": prebuilt.get("builds", 0), "prebuild_s": prebuilt.get("seconds"),
        "default": ", ".join(f"{p['name']}={p['default']}" for p in report["parameters"]),
        "winner": report["winner_label"] or "(default kept)", "confirmed": report["confirmed"], "kept": kept,
        "ratio": None if kept else ratio, "race_rounds": report["race_rounds"], "stopped": report["stopped"],
        "wall_s": round(wall_s, 1), "exit_code": report["exit_code"], "notes": report["notes"],
    }


def _ratio_text(row: dict) -> str:
    if row["kept"]:
        return "1 (default kept)"
    ratio = row["ratio"]
    if not ratio:
        return "- (not confirmed)"
    if ratio.get("low") is None:
        return f"{ratio['estimate']:.3f}"
    return f"{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def markdown(results: dict) -> str:
    lines = [f"`python3 scripts/gpu_tune.py` on {results['device']}, {results['started_at'][:16].replace('T', ' ')} UTC"
             f" ({results['total_s']:.0f} s in all, {results.get('prebuild_s', 0):.0f} s of them the grids' builds, all"
             " at once; each tune's own build step then found its grid built):", "",
             "| task | variants (of grid) | passed checks | builds | winner | tuned / default time [95% CI] | race rounds"
             " | wall time |",
             "|---|---|---|---|---|---|---|---|"]
    for row in results["tasks"]:
        lines.append(f"| {row['task']} | {row['variants']} (of {row['grid_points']}) | {row['passed']} | {row['builds']} |"
                     f" {row['winner']} | {_ratio_text(row)} | {row['race_rounds']} | {row['wall_s']:.0f} s |")
    lines += ["", "Default values: " + "; ".join(f"{r['task']}: {r['default']}" for r in results["tasks"]) + ".",
              "Ratio: the A/B's score interval (or, where the race's own rounds decided, the race's paired interval),"
              " time tuned / time default over rounds of fresh evals (95%)."]
    return "\n".join(lines) + "\n"


def device_name(dry_run: bool) -> str:
    if dry_run:
        return "cpu (dry run)"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks-root", type=Path, default=None, help="the public problem sets (pmpp_v2 inside)")
    parser.add_argument("--minutes", type=float, default=7.5, help="the whole run's time budget")
    parser.add_argument("--max-variants", type=int, default=6)
    parser.add_argument("--only", default="", help="comma-separated row names to run (softmax, matmul, pmpp_v2 "
                        "vectoradd); default all")
    parser.add_argument("--dry-run", action="store_true", help="the CPU fixture task instead of the GPU tasks")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "device": device_name(args.dry_run), "tasks": [], "reports": {}}
    tmp = Path(tempfile.mkdtemp(prefix="popkit-gpu-tune-"))
    try:
        rows = plan(tmp, args.tasks_root, args.dry_run)
        only = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = only - {row["name"] for row in rows}
        if unknown:
            parser.error(f"--only {', '.join(sorted(unknown))}: rows are {', '.join(row['name'] for row in rows)}")
        rows = [row for row in rows if not only or row["name"] in only]
        built = prebuild(rows, tmp)
        results["prebuild_s"] = round(time.monotonic() - start, 1)
        for n, row in enumerate(rows):
            left = 60 * args.minutes - (time.monotonic() - start)
            budget = max(30.0, left / (len(rows) - n) - MARGIN_S)
            log(f"tune {row['name']}: {row['file'].name}, budget {budget:.0f} s")
            t0 = time.monotonic()
            report = api.tune(row["file"], tmp / "out" / f"{row['file'].stem}_tuned.py",
                              harness="task", task=str(row["task"]),
                              max_variants=args.max_variants, confirm=1, rounds=4, ab_budget_s=30.0, budget_s=budget,
                              record=False, force=True, progress=lambda m, name=row["name"]: log(f"{name}: {m}"))
            doc = api.document(report)
            results["reports"][row["name"]] = doc
            results["tasks"].append(summary(row["name"], doc, time.monotonic() - t0, built.get(row["name"], {})))
            results["total_s"] = round(time.monotonic() - start, 1)
            (args.out / "tune.json").write_text(json.dumps(results, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["total_s"] = round(time.monotonic() - start, 1)
    (args.out / "tune.json").write_text(json.dumps(results, indent=1, default=str))
    text = markdown(results)
    (args.out / "tune.md").write_text(text)
    print(text)
    return 0 if all(r["exit_code"] == 0 for r in results["tasks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
