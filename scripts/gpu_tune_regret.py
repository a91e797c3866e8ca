#!/usr/bin/env python3
"""Measured regret of `popkit tune`: every grid point timed by the task's own eval, against what tune picks.

Run from the repository root on a CUDA machine with popkit importable (no network needed):

    python3 scripts/gpu_tune_regret.py --out OUTDIR [--points 10] [--repeats 3] [--minutes 8] [--tasks-root DIR]

Per task (the bundled softmax and matmul CUDA templates from `popkit new`, matmul without its 8192^3 shape as
in scripts/gpu_tune.py; with --tasks-root, also the public pmpp_v2 vectoradd and grayscale):
  build       every file's grid built at once, before anything is timed (scripts/gpu_tune.py's one-variant
              tune of each; its wall time apart), so the tunes find their grids built (0 builds);
  tune        `popkit tune` with --max-variants (--points) and --seed: the grid of the file's `#!POPKIT tune`
              lines, or a seeded sample of it that keeps the default values; one value set for every shape, so
              its pick is a grid point;
  exhaustive  every point tune ran, --repeats times, one benchmark-mode eval each through `popkit bench` (the
              task's own eval, the sealed run) in the extensions folder tune built, in rounds whose order
              alternates; a point's time is the task's score (ranking_by over the shapes' medians) per eval;
  regret      the mean time of tune's pick over the best point's, with a 95% interval (repeat i of one paired
              with repeat i of the other, as an A/B pairs rounds; exactly 1 when tune picked the best point),
              and the wall time tune's evals took (checks, race, A/B, final check) against the exhaustive evals'.
Writes OUTDIR/regret.json (raw scores of every eval, tune's report) and OUTDIR/regret.md, and prints the
markdown table last. `--dry-run` does it on the CPU with the fixture task tests/fixtures/tasks/chunksum.
About 8 minutes on an H100 with the defaults (10 points x 3 repeats per template, one cold build each);
`--devices 0,1,2` tunes on GPU 0 and spreads the exhaustive evals over the three at once.
Only popkit.api is used (scripts/ use no internals).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpu_tune", ROOT / "scripts" / "gpu_tune.py")
gpu_tune = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_tune)  # type: ignore[union-attr]

log = gpu_tune.log
MIN_REPEATS = 2  # a point's interval needs two evals; more repeats run only while the time allows


def plan(tmp: Path, tasks_root: Path | None, dry_run: bool) -> list[dict]:
    """The tasks: name, task folder, the tunable file (scripts/gpu_tune.py's files; the public one if found)."""
    if dry_run:
        return gpu_tune.plan(tmp, None, True)
    rows = [{"name": "softmax", "task": gpu_tune.bundled_tasks() / "softmax",
             "file": gpu_tune.rendered(tmp, "softmax", "softmax")},
            {"name": "matmul", "task": gpu_tune.trimmed_matmul(tmp),
             "file": gpu_tune.rendered(tmp, "matmul", "matmul")}]
    if tasks_root is not None:
        rows = gpu_tune.plan(tmp, tasks_root, False)
    return rows


def variant_text(text: str, values: dict) -> str:
    """The file with each tuned name's module-level assignment set to its value (one assignment per name, as
    `#!POPKIT tune` requires)."""
    for name, value in values.items():
        text, n = re.subn(rf"^{re.escape(name)}[ \t]*=[ \t]*[^#\n]*?(?=[ \t]*(#|$))", f"{name} = {value!r}", text,
                          count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"no module-level assignment of {name} to rewrite")
    return text


def points_of(report: Any) -> list[dict]:
    """The grid points tune ran (its report's variants, in order): label, values, build, whether they passed."""
    return [{"label": v.label, "values": dict(v.values), "build": v.build, "passed": v.passed}
            for v in report.variants if v.index >= 0]


def shape_times(report: Any) -> tuple[float, ...] | str:
    """Each benchmark shape's time (ns: median of the calls, else mean) of a passed benchmark eval, or why none."""
    if report.outcome != "passed":
        return report.outcome
    run = next((r for r in report.runs if r.mode == "benchmark" and not r.secret and r.passed), None)
    if run is None or not run.benchmarks:
        return "no passed benchmark run"
    times = tuple(float(c.median_ns or c.mean_ns or 0.0) for c in run.benchmarks)
    return times if all(t > 0 for t in times) else "a shape without a time"


def exhaustive(task: str, path: Path, points: Sequence[dict], repeats: int, deadline: float, build_root: str,
               folder: Path, bench: Callable[..., Any] = api.bench, clock: Callable[[], float] = time.monotonic,
               allow_cpu: bool = False, on_repeat: Callable[[list[dict]], None] = lambda rows: None,
               devices: Sequence[str] = ()) -> list[dict]:
    """Every point `repeats` times (at least MIN_REPEATS, more only before `deadline`), rounds alternating in order,
    each one benchmark-mode eval (`api.bench`, not recorded) in the extensions folder tune built the grid in.
    With `devices`, a repeat's evals run on those GPUs at once, one eval per GPU at a time, in the repeat's order:
    point i of repeat r on devices[(i + r) % n], so over n repeats every point meets every GPU once.
    The variant files are written under `folder`; `on_repeat` gets the rows after every repeat (a run cut short
    keeps them). Returns per point: label, values, scores (s, one per passed eval), failures, eval wall times."""
    text = path.read_text()
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, point in enumerate(points):
        variant = folder / f"{path.stem}.{i:03d}.py"
        variant.write_text(variant_text(text, point["values"]))
        rows.append({**point, "path": variant, "scores": [], "failures": [], "eval_s": []})

    def timed(row: dict, device: str | None = None) -> None:
        env = {"TORCH_EXTENSIONS_DIR": f"{build_root}/tune-{row['build']}"} if row["build"] and build_root else {}
        pin = {"device": device} if device is not None else {}
        t0 = clock()
        outcome = bench(row["path"], task=task, record=False, env=env, label="regret", allow_cpu=allow_cpu, **pin)
        row["eval_s"].append(clock() - t0)
        times = shape_times(outcome.report)
        if isinstance(times, str):
            row["failures"].append(times)
        else:
            row["scores"].append(api.score(times, outcome.report.ranking_by))

    for rep in range(repeats):
        if rep >= MIN_REPEATS and clock() > deadline:
            log(f"exhaustive: stopped after {rep} repeats (--minutes)")
            break
        step = 1 if rep % 2 == 0 else -1  # the order alternates from one repeat to the next
        if devices:
            n = len(devices)
            lanes = [[row for i, row in enumerate(rows) if (i + rep) % n == d][::step] for d in range(n)]
            with ThreadPoolExecutor(max_workers=n) as pool:  # list(): an eval's exception reaches the caller
                list(pool.map(lambda lane, dev: [timed(row, dev) for row in lane], lanes, devices))
        else:
            for row in rows[::step]:
                timed(row)
        log(f"exhaustive: repeat {rep + 1}/{repeats} of {len(rows)} points")
        on_repeat(rows)
    for row in rows:
        row["path"] = str(row["path"])
    return rows


def regret(points: Sequence[dict], picked: str) -> dict:
    """Tune's pick against the best point by mean score: the ratio with its 95% interval (repeat i of one paired
    with repeat i of the other, as an A/B pairs its rounds: api.ratio_interval), and the pick's rank."""
    timed = sorted((p for p in points if len(p["scores"]) >= MIN_REPEATS and not p["failures"]),
                   key=lambda p: sum(p["scores"]) / len(p["scores"]))
    if not timed:
        return {"picked": picked, "best": None, "regret": None, "rank": None, "timed": 0}
    best = timed[0]
    pick = next((p for p in timed if p["label"] == picked), None)
    if pick is None:
        return {"picked": picked, "best": best["label"], "regret": None, "rank": None, "timed": len(timed)}
    if pick is best:
        ratio = {"estimate": 1.0, "low": 1.0, "high": 1.0}
    else:
        ratio = api.ratio_interval([a / b for a, b in zip(pick["scores"], best["scores"])]).to_json()
    mean = lambda p: sum(p["scores"]) / len(p["scores"])  # noqa: E731
    return {"picked": picked, "best": best["label"], "regret": ratio, "rank": timed.index(pick) + 1,
            "timed": len(timed), "best_s": mean(best), "picked_s": mean(pick)}


def tune_seconds(report: dict) -> float:
    """The wall time of tune's evals (checks, race, A/B, final check), without its build and probes."""
    return sum(p["seconds"] for p in report.get("phases", ()) if p["name"] not in ("build", "probe"))


def summary(name: str, points: Sequence[dict], report: dict, found: dict) -> dict:
    exhaustive_s = sum(sum(p["eval_s"]) for p in points)
    spent = tune_seconds(report)
    return {"task": name, "points": len(points), "repeats": max((len(p["eval_s"]) for p in points), default=0),
            "best": found["best"], "picked": found["picked"], "rank": found["rank"], "regret": found["regret"],
            "decided_by": report.get("decided_by", ""), "tune_builds": report.get("builds"),
            "exhaustive_s": round(exhaustive_s, 1), "tune_s": round(spent, 1),
            "share": round(spent / exhaustive_s, 3) if exhaustive_s else None,
            "build_s": round(sum(p["seconds"] for p in report.get("phases", ()) if p["name"] == "build"), 1),
            "tune_wall_s": round(report.get("duration_s", 0.0), 1), "exit_code": report.get("exit_code"),
            "race_evals": report.get("race_evals", "")}


def _regret_text(row: dict) -> str:
    r = row["regret"]
    if not r:
        return "-"
    if r.get("low") is None:
        return f"{r['estimate']:.3f}"
    return f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"


def markdown(results: dict) -> str:
    lines = [f"`python3 scripts/gpu_tune_regret.py` on {results['device']}, "
             f"{results['started_at'][:16].replace('T', ' ')} UTC ({results['total_s']:.0f} s in all, "
             f"{results.get('prebuild_s', 0):.0f} s of them the grids' builds, all at once; race evals "
             f"{' / '.join(sorted({r.get('race_evals') or '?' for r in results['tasks']}))}):", "",
             "| task | points x repeats | best point | tune's pick (rank) | regret [95% CI] | decided by |"
             " tune's eval time | exhaustive time | share | tune's builds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["tasks"]:
        lines.append(f"| {row['task']} | {row['points']} x {row['repeats']} | {row['best']} | {row['picked']}"
                     f" ({row['rank']}) | {_regret_text(row)} | {row['decided_by'] or '-'} | {row['tune_s']:.0f} s |"
                     f" {row['exhaustive_s']:.0f} s | {row['share'] if row['share'] is not None else '-'} |"
                     f" {row['tune_builds']} |")
    lines += ["", "Regret: pooled time of tune's pick / the best point's (the task's score over the benchmark shapes,"
              " mean over repeats of one eval each; 95% interval by stats.ratio_ci95). Share: wall time of tune's"
              " evals (checks, race, A/B, final check) / the exhaustive evals'. Every grid was built before both"
              " (tune's builds: 0 when it found its grid built); the exhaustive evals ran in that build."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--points", type=int, default=10, help="grid points per task (0: the whole grid)")
    parser.add_argument("--repeats", type=int, default=3, help="evals per point in the exhaustive run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=8.0, help="the whole run's time budget")
    parser.add_argument("--tasks-root", type=Path, default=None, help="also the public pmpp_v2 vectoradd and grayscale")
    parser.add_argument("--only", default="", help="comma-separated task names (softmax, matmul, ...)")
    parser.add_argument("--always-ab", action="store_true", help="tune confirms by A/B even when the race decides")
    parser.add_argument("--cold-race", action="store_true", help="tune's race evals cold, not through warm pairs")
    parser.add_argument("--devices", default="",
                        help="GPUs as CUDA_VISIBLE_DEVICES names them, comma-separated: tune on the first, "
                             "the exhaustive evals on all of them at once")
    parser.add_argument("--dry-run", action="store_true", help="the CPU fixture task instead of the GPU tasks")
    args = parser.parse_args(argv)
    if args.repeats < MIN_REPEATS or args.points < 0:
        parser.error(f"--repeats must be at least {MIN_REPEATS} and --points at least 0")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if any(not d.isdigit() for d in devices):
        parser.error(f"--devices {args.devices}: give GPU indices, e.g. 0,1,2")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "device": gpu_tune.device_name(args.dry_run), "tasks": [], "raw": {}}
    tmp = Path(tempfile.mkdtemp(prefix="popkit-gpu-regret-"))
    try:
        rows = plan(tmp, args.tasks_root, args.dry_run)
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        rows = [r for r in rows if not only or r["name"] in only]
        if not rows:
            parser.error(f"--only {args.only}: no such task")
        built = gpu_tune.prebuild(rows, tmp)  # every grid's one build at once: the tunes below find them built
        results["prebuild"], results["prebuild_s"] = built, round(time.monotonic() - start, 1)
        for n, row in enumerate(rows):
            left = 60 * args.minutes - (time.monotonic() - start)
            share = left / (len(rows) - n)
            log(f"{row['name']}: tune on {args.points or 'every'} point(s), then each x {args.repeats}; {share:.0f} s")
            t0 = time.monotonic()
            report = api.tune(row["file"], tmp / "out" / f"{row['file'].stem}_tuned.py",
                              harness="task", task=str(row["task"]),
                              max_variants=args.points or 10_000, seed=args.seed, per_shape=False, record=False,
                              force=True, budget_s=max(90.0, 0.45 * share), always_ab=args.always_ab,
                              cold_race=args.cold_race, devices=devices[:1] or None,
                              allow_cpu=args.dry_run, progress=lambda m, name=row["name"]: log(f"{name}: {m}"))
            doc = api.document(report)
            points = [p for p in points_of(report) if p["passed"]]
            picked = report.winner_label or next((v.label for v in report.variants if v.incumbent), "")

            def keep(rows: list[dict], name: str = row["name"], doc: dict = doc) -> None:
                """What this task has measured so far, written before the exhaustive run ends."""
                results["raw"][name] = {"points": [{**r, "path": str(r["path"])} for r in rows], "tune": doc}
                (args.out / "regret.json").write_text(json.dumps(results, indent=1, default=str))

            keep([])
            found_points = exhaustive(str(row["task"]), row["file"], points, args.repeats,
                                      deadline=t0 + share, build_root=report.build_root,
                                      folder=tmp / "points" / row["file"].stem, allow_cpu=args.dry_run,
                                      on_repeat=keep, devices=devices)
            found = regret(found_points, picked)
            results["tasks"].append(summary(row["name"], found_points, doc, found))
            results["raw"][row["name"]] = {"points": found_points, "tune": doc}
            results["total_s"] = round(time.monotonic() - start, 1)
            (args.out / "regret.json").write_text(json.dumps(results, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["total_s"] = round(time.monotonic() - start, 1)
    (args.out / "regret.json").write_text(json.dumps(results, indent=1, default=str))
    text = markdown(results)
    (args.out / "regret.md").write_text(text)
    print(text)
    return 0 if all(r["exit_code"] == 0 for r in results["tasks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
