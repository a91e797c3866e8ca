#!/usr/bin/env python3
"""The side-queue cheat against every bundled task, and every honest CUDA example, on a GPU.

Run from the repository root on a CUDA machine with popkit installed (no network needed):

    python3 scripts/gpu_sealed.py --out results/

For each bundled task it runs `popkit bench FILE --task T --leaderboard --harness popkit --secret-runs 0
--json` on submissions/cheats/side_stream.py (which runs the reference on a second CUDA queue and
returns at once) and on submissions/T/cuda.py, and tabulates verdict, failure class, score and the
largest drain (how long the device stayed busy after a timed call's end event). The cheat must fail
with `unsynchronized work` (or `time beats physics`) on every task; every honest example must pass.
The CUDA examples are built first, in parallel, so the timed runs are not contended by compilers.

Writes OUT/sealed.json (after every run, so a cut-off run keeps what it got) and OUT/sealed.md, and
prints the markdown. About 4-5 minutes on an H100 (builds ~1.5 min, 12 chains).
`--dry-run` prints the commands without running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
CHEAT = ROOT / "submissions" / "cheats" / "side_stream.py"
CLASSES = ("unsynchronized work", "time beats physics")  # the classes the cheat may fail with
RUN_TIMEOUT_S = 600


def bench_argv(path: Path, task: str, precompile: bool = True) -> list[str]:
    argv = [sys.executable, "-m", "popkit", "bench", str(path), "--task", task, "--leaderboard", "--harness",
            "popkit", "--secret-runs", "0", "--no-history", "--json"]
    return argv if precompile else argv + ["--no-precompile"]


def compile_argv(path: Path) -> list[str]:
    return [sys.executable, "-m", "popkit", "compile", str(path), "--json"]


def run_json(argv: list[str], timeout: float = RUN_TIMEOUT_S) -> tuple[int, dict, float]:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              stdin=subprocess.DEVNULL, env={**os.environ, "MAX_JOBS": "4"})
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, str(exc.stdout or ""), str(exc.stderr or "")
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {"unparsed_stdout": out[-2000:], "stderr": err[-4000:]}
    return code, doc, time.monotonic() - start


def failure_class(error: str) -> str:
    """The named class of a case failure: its text up to the first colon."""
    return error.split(":", 1)[0].strip() if error else ""


def summarize(label: str, task: str, code: int, doc: dict, seconds: float) -> dict:
    """One table row from a `popkit bench --json` document (popkit/run/1)."""
    cases = [c for r in doc.get("runs") or [] for c in (r.get("tests") or []) + (r.get("benchmarks") or [])]
    errors = [c.get("error", "") for c in cases if not c.get("passed")]
    drains = [float(v) for r in doc.get("runs") or [] for k, v in (r.get("raw") or {}).items()
              if k.endswith(".drain_max")]
    return {"label": label, "task": task, "exit_code": code, "outcome": doc.get("outcome", "no report"),
            "class": failure_class(errors[0]) if errors else "", "error": errors[0] if errors else "",
            "classes": sorted({failure_class(e) for e in errors}), "score_s": doc.get("score_public_s"),
            "max_drain_ns": max(drains) if drains else None, "seconds": round(seconds, 1),
            "stderr": "" if cases else str(doc.get("stderr") or doc.get("message") or "")[-1000:]}


def expected(row: dict) -> bool:
    """The cheat fails with one of its classes; an honest example passes."""
    if row["label"] == "side_stream":
        return row["outcome"] == "failed" and bool(row["classes"]) and set(row["classes"]) <= set(CLASSES)
    return row["outcome"] == "passed"


def _us(ns: float | None) -> str:
    return "–" if ns is None else f"{ns / 1e3:.1f}"


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"Sealed timer on an {device}: `popkit bench --leaderboard --harness popkit --secret-runs 0`, the "
             "side-queue cheat (submissions/cheats/side_stream.py) and the honest CUDA examples.", "",
             "| task | submission | verdict | failure class | score (µs) | max drain (µs) | as expected |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        score = "–" if r["score_s"] is None else f"{r['score_s'] * 1e6:.1f}"
        lines.append(f"| {r['task']} | {r['label']} | {r['outcome']} | {r['class'] or '–'} | {score} | "
                     f"{_us(r['max_drain_ns'])} | {'yes' if expected(r) else '**no**'} |")
    ok = sum(expected(r) for r in rows)
    lines += ["", f"{ok} of {len(rows)} as expected. Drain: a device-wide synchronize timed after each timed "
              "call's end event (an honest call leaves the device idle; the rule fails a case above 50 µs)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sealed.json and sealed.md")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated bundled tasks")
    parser.add_argument("--only", choices=("all", "cheat", "honest"), default="all")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; bundled: {', '.join(TASKS)}")
    honest = [ROOT / "submissions" / t / "cuda.py" for t in tasks] if args.only != "cheat" else []
    plan = [("side_stream", t, bench_argv(CHEAT, t, precompile=False)) for t in tasks if args.only != "honest"]
    plan += [("cuda.py", p.parent.name, bench_argv(p, p.parent.name)) for p in honest]
    return execute(args.out, "sealed", honest, plan, args.dry_run, summarize, markdown, expected,
                   lambda row: f"{row['outcome']} {row['class']}")


def execute(out: Path, stem: str, honest: list[Path], plan: list[tuple[str, str, list[str]]], dry_run: bool,
            summarize, markdown, expected, describe) -> int:
    """Build the honest files in parallel, then run every command of `plan` alone, writing OUT/<stem>.json after
    each and OUT/<stem>.md at the end (gpu_sealed_verdict.py runs its own cheats through this too)."""
    if dry_run:
        for p in honest:
            print(" ".join(compile_argv(p)))
        for _, _, command in plan:
            print(" ".join(command))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"{Path(sys.argv[0]).stem}: no CUDA GPU here (use --dry-run to see the commands)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": device, "builds": [], "rows": []}

    def save() -> None:
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))

    with ThreadPoolExecutor(max_workers=6) as pool:  # builds only; every timed run below runs alone
        for path, (code, _, secs) in zip(honest, pool.map(lambda p: run_json(compile_argv(p)), honest)):
            results["builds"].append({"file": str(path.relative_to(ROOT)), "exit_code": code, "seconds": secs})
    save()
    for label, task, command in plan:
        row = summarize(label, task, *run_json(command))
        results["rows"].append(row)
        save()
        print(f"[{time.strftime('%H:%M:%S')}] {task} {label}: {describe(row)}", flush=True)
    text = markdown(results["rows"], device)
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0 if all(expected(r) for r in results["rows"]) else 1

if __name__ == "__main__":
    sys.exit(main())
