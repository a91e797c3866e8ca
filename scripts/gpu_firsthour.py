#!/usr/bin/env python3
"""The first hour on a leaderboard that is open today: docs/leaderboards.md's loop on pmpp_v2's vectoradd_v2.

Run from the repository root on a machine with an NVIDIA GPU, the public problem sets carried in
`.refk/problems` (no network needed; about 2-4 minutes, most of it the one CUDA build):

    python3 scripts/gpu_firsthour.py --out results/

Steps, each `python -m popkit ... --json` as a user types it, in a fresh folder with its own ledger and
POPKIT_TASKS_PATH set to the problem sets:
  tasks (vectoradd_v2 must be open) -> new --task vectoradd_v2 --gpu H100 (a skeleton: the task has no
  kernel.yml) -> test (the skeleton fails, as it says) -> the one line the skeleton asks to fill (out = in0 +
  in1, written here) -> test (passes) -> bench --leaderboard --html OUT/firsthour_bench.html -> check ->
  submit --dry-run; then check of a file for pmpp's closed `vectoradd` (refused, exit 8).
Writes OUT/firsthour.json after every step (a cut-off run keeps what it did) and OUT/firsthour.md, prints the
markdown table last. `--dry-run` writes the plan without running anything (works anywhere).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEADERBOARD = "vectoradd_v2"
# The skeleton's one line to fill, and the line a user writes there for vectoradd (out = a + b in float16).
SKELETON_LINE = "out[i] = in0[i];"
FILLED_LINE = "out[i] = __hadd(in0[i], in1[i]);"
CLOSED_FILE = "#!POPCORN leaderboard vectoradd\n#!POPCORN gpu H100\n\ndef custom_kernel(data):\n    return data[0]\n"


def fill_skeleton(text: str) -> str:
    """The skeleton with its kernel body written (ValueError when the skeleton has no such line)."""
    if SKELETON_LINE not in text:
        raise ValueError(f"the skeleton has no `{SKELETON_LINE}` line to fill")
    return text.replace(SKELETON_LINE, FILLED_LINE, 1)


def plan(out: Path) -> list[dict]:
    """The steps: (name, popkit arguments, exit codes that count as what the step expects)."""
    html = str(out.resolve() / "firsthour_bench.html")
    return [
        {"step": "tasks", "argv": ["tasks", "--json"], "expect": [0]},
        {"step": "new", "argv": ["new", "--task", LEADERBOARD, "--gpu", "H100", "-o", "v2.py", "--json"],
         "expect": [0]},
        {"step": "test (skeleton)", "argv": ["test", "v2.py", "--json"], "expect": [1]},
        {"step": "fill", "argv": [], "expect": [0]},
        {"step": "test", "argv": ["test", "v2.py", "--json"], "expect": [0]},
        {"step": "bench --leaderboard --html", "argv": ["bench", "v2.py", "--leaderboard", "--html", html, "--json"],
         "expect": [0]},
        {"step": "check", "argv": ["check", "v2.py", "--json"], "expect": [0]},
        {"step": "submit --dry-run", "argv": ["submit", "v2.py", "--dry-run", "--json"], "expect": [0]},
        {"step": "check (closed vectoradd)", "argv": ["check", "closed.py", "--json"], "expect": [8]},
    ]


def summary(step: str, doc: dict) -> str:
    """The one fact of a step's JSON document worth a table cell."""
    if step == "tasks":
        row = next((t for t in doc.get("tasks", []) if t.get("leaderboard") == LEADERBOARD), None)
        return f"{LEADERBOARD}: {row['standing']['state']} {row['standing']['gpus']}" if row else "not listed"
    if step == "new":
        return f"{doc.get('gpu')} · skeleton={doc.get('skeleton')} · standing {doc.get('standing', {}).get('state')}"
    if step.startswith("test") or step.startswith("bench"):
        score = doc.get("score_public_s") or (doc.get("report") or {}).get("score_public_s")
        outcome = doc.get("outcome") or (doc.get("report") or {}).get("outcome") or doc.get("message", "")[:80]
        return f"{outcome}" + (f" · score {score * 1e6:.2f} µs" if score else "")
    if step.startswith("check"):
        findings = (doc.get("findings") or [])
        return ", ".join(f"{f['rule']}" for f in findings) or "no findings"
    if step == "submit --dry-run":
        return " ".join((doc.get("plan") or {}).get("argv", [])[:6])
    return ""


def run(out: Path, problems: Path, dry_run: bool) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(out)
    if dry_run:
        (out / "firsthour.json").write_text(json.dumps({"dry_run": True, "steps": steps}, indent=2))
        return steps
    work = Path(tempfile.mkdtemp(prefix="popkit-firsthour-"))
    env = {**os.environ, "POPKIT_TASKS_PATH": str(problems.resolve()), "POPKIT_HOME": str(work / "ledger"),
           "XDG_DATA_HOME": str(work / "xdg"), "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    (work / "closed.py").write_text(CLOSED_FILE)
    done = []
    for step in steps:
        started = time.monotonic()
        if step["step"] == "fill":
            path = work / "v2.py"
            try:
                path.write_text(fill_skeleton(path.read_text()))
                rc, doc = 0, {}
            except (OSError, ValueError) as exc:
                rc, doc = 1, {"message": str(exc)}
        else:
            try:
                proc = subprocess.run([sys.executable, "-m", "popkit", *step["argv"]], cwd=work, env=env,
                                      capture_output=True, text=True, timeout=280)
                rc = proc.returncode
                try:
                    doc = json.loads(proc.stdout)
                except ValueError:
                    doc = {"message": (proc.stderr or proc.stdout)[-400:]}
            except subprocess.TimeoutExpired:
                rc, doc = 124, {"message": "timed out after 280 s"}
        record = {**step, "rc": rc, "ok": rc in step["expect"], "wall_s": round(time.monotonic() - started, 2),
                  "summary": summary(step["step"], doc)}
        done.append(record)
        print(f"{record['step']}: rc {rc} ({'as expected' if record['ok'] else 'NOT as expected'}), "
              f"{record['wall_s']} s · {record['summary']}", flush=True)
        (out / "firsthour.json").write_text(json.dumps({"problems": str(problems), "steps": done}, indent=2))
    return done


def markdown(done: list[dict]) -> str:
    lines = ["| step | exit | as expected | seconds | result |", "|---|---|---|---|---|"]
    for r in done:
        lines.append(f"| {r['step']} | {r.get('rc', '-')} | {'yes' if r.get('ok') else 'no'} | "
                     f"{r.get('wall_s', '-')} | {str(r.get('summary', '')).replace('|', '/')} |")
    total = sum(r.get("wall_s", 0) for r in done)
    return "\n".join(lines) + f"\n\ncommand time in all: {total:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=Path, default=ROOT / ".refk" / "problems")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if not args.dry_run and not (args.problems / "pmpp_v2.yaml").is_file():
        print(f"{args.problems}: no pmpp_v2.yaml (carry the public problem sets there)", file=sys.stderr)
        return 2
    done = run(args.out, args.problems, args.dry_run)
    text = markdown(done)
    (args.out / "firsthour.md").write_text(text + "\n")
    print(text)
    return 0 if args.dry_run or all(r["ok"] for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
