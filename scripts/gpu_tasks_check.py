#!/usr/bin/env python3
"""`popkit tasks --check` over a checkout of the public problem sets, as a markdown table for the docs.

Run from the repository root, on any machine (no GPU needed; on a GPU machine the verdicts are that card's):

    python3 scripts/gpu_tasks_check.py --out OUTDIR [--problems .refk/problems]

Writes OUTDIR/tasks_check.json (popkit's --json document) and OUTDIR/tasks_check.md (the machine, then a
table: problem set, task, leaderboard, open or closed today, runnable here, reason), and prints the
markdown. Takes seconds: it reads the task files and probes the machine once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def markdown(doc: dict, problems: Path) -> str:
    system = doc.get("system") or {}
    device = system.get("device") or "cpu"
    where = f"{device} ({system.get('arch')})" if system.get("arch") else device
    rows = [r for r in doc["tasks"] if not r.get("bundled")]
    lines = [f"`popkit tasks --check` on **{where}**, torch {system.get('torch') or '-'}: "
             f"{sum(r['runnable'] for r in rows)} of {len(rows)} public tasks can run here.", "",
             "| problem set | task | leaderboard | today | runnable here | reason |", "|---|---|---|---|---|---|"]
    for r in rows:
        path = Path(r["path"])
        try:
            pset = path.resolve().relative_to(problems.resolve()).parts[0]
        except ValueError:
            pset = path.parent.name
        why = "; ".join(r["reasons"]) if r["reasons"] else "; ".join(r.get("notes") or []) or "-"
        board = r.get("standing") or {}
        today = {"open": "open", "closed": f"closed {str(board.get('deadline') or '')[:10]}"}.get(board.get("state"), "-")
        lines.append(f"| {pset} | {r['task']} | {r['leaderboard'] or '-'} | {today} | "
                     f"{'yes' if r['runnable'] else 'no'} | {why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=Path, default=Path(".refk/problems"))
    args = parser.parse_args(argv)
    if not args.problems.is_dir():
        print(f"{args.problems}: no problem-set checkout there (--problems)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "popkit", "tasks", "--check", "--json", "--tasks-root",
                           str(args.problems)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr)
        return done.returncode
    doc = json.loads(done.stdout)
    (args.out / "tasks_check.json").write_text(json.dumps(doc, indent=1))
    text = markdown(doc, args.problems)
    (args.out / "tasks_check.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
