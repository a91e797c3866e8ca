#!/usr/bin/env python3
"""The verdict cheats (a worker that writes its own verdict or time) and every honest CUDA example, on a GPU.

Run from the repository root on a CUDA machine with popkit installed (no network needed):

    python3 scripts/gpu_sealed_verdict.py --out results/

Runs `popkit bench FILE --task T --leaderboard --harness popkit --secret-runs 0 --json` on each cheat of
VERDICT_CHEATS (submissions/cheats/, all on vectoradd: a patched Tensor.__int__, the judge swapped, json.dumps
wrapped, the channel taken over, the measurement patched, a short time lowered under the witness's tolerance,
the ready reply forged) and on submissions/T/cuda.py for every bundled task. Each cheat must fail with its class (`ready_forge` is a right
kernel: it must pass with the trusted side's device name and the trace audit); every honest example must
pass. The CUDA examples are built first, in parallel, so the timed runs are not contended by compilers.

Writes OUT/verdict.json (after every run) and OUT/verdict.md, and prints the markdown. About 4 minutes on
an H100. `--dry-run` prints the commands without running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sealed import TASKS, bench_argv, execute, failure_class  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "submissions" / "cheats"
# cheat file -> the failure classes it may end in (() : a right kernel that must pass, judged by the trusted side).
# A lowered time (measure_forge): on a GPU the trace audit judges before the witness and sees the call's own work
# running past the reported end of the call; on the H100 it named it `unsynchronized work` (2026-11-28).
VERDICT_CHEATS = {"tensor_int.py": ("elements mismatch",), "judge_swap.py": ("no output",),
                  "json_forge.py": ("elements mismatch",), "channel_takeover.py": ("no output",),
                  "measure_forge.py": ("time forged", "unsynchronized work"),
                  "physics_forge.py": ("time beats physics",), "ready_forge.py": ()}


def summarize(label: str, task: str, code: int, doc: dict, seconds: float) -> dict:
    """One table row from a `popkit bench --json` document (popkit/run/1)."""
    runs = doc.get("runs") or []
    cases = [c for r in runs for c in (r.get("tests") or []) + (r.get("benchmarks") or [])]
    errors = [c.get("error", "") for c in cases if not c.get("passed")]
    raw = (runs[0].get("raw") or {}) if runs else {}
    return {"label": label, "task": task, "exit_code": code, "outcome": doc.get("outcome", "no report"),
            "error": errors[0] if errors else "", "classes": sorted({failure_class(e) for e in errors}),
            "score_s": doc.get("score_public_s"), "device": raw.get("system.device", ""),
            "audit": raw.get("trust.audit", ""), "seconds": round(seconds, 1),
            "stderr": "" if cases else str(doc.get("stderr") or doc.get("message") or "")[-1000:]}


def expected(row: dict) -> bool:
    """A cheat fails with its class (ready_forge passes as judged by the trusted side); honest examples pass."""
    want = VERDICT_CHEATS.get(row["label"])
    if not want:
        trusted = row["label"] != "ready_forge.py" or (row["device"] != "forged-device" and row["audit"] == "trace")
        return row["outcome"] == "passed" and trusted
    return row["outcome"] == "failed" and bool(row["classes"]) and all(c.startswith(want) for c in row["classes"])


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"Verdict cheats on an {device}: `popkit bench --leaderboard --harness popkit --secret-runs 0`, "
             "the cheats of submissions/cheats/ that write their own verdict or time, and the honest CUDA examples.",
             "", "| task | submission | verdict | failure | score (µs) | device / audit | as expected |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        score = "–" if r["score_s"] is None else f"{r['score_s'] * 1e6:.1f}"
        failure = r["error"][:90].replace("|", "/") or "–"
        lines.append(f"| {r['task']} | {r['label']} | {r['outcome']} | {failure} | {score} | {r['device']} / "
                     f"{r['audit']} | {'yes' if expected(r) else '**no**'} |")
    ok = sum(expected(r) for r in rows)
    return "\n".join(lines + ["", f"{ok} of {len(rows)} as expected."]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for verdict.json and verdict.md")
    parser.add_argument("--only", choices=("all", "cheat", "honest"), default="all")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    honest = [ROOT / "submissions" / t / "cuda.py" for t in TASKS] if args.only != "cheat" else []
    plan = [(name, "vectoradd", bench_argv(CHEATS / name, "vectoradd", precompile=False))
            for name in VERDICT_CHEATS if args.only != "honest"]
    plan += [("cuda.py", p.parent.name, bench_argv(p, p.parent.name)) for p in honest]
    return execute(args.out, "verdict", honest, plan, args.dry_run, summarize, markdown, expected,
                   lambda row: f"{row['outcome']} {row['error'][:80]}")

if __name__ == "__main__":
    sys.exit(main())
