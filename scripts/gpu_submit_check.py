#!/usr/bin/env python3
"""Submit-with-confidence on one GPU: risk verdicts, the predicted compile path, an ncu request, and evidence.

Run from the repository root on a machine with an NVIDIA GPU (about 5 minutes on one H100):

    python scripts/gpu_submit_check.py --out results/
    python scripts/gpu_submit_check.py --out results/ --parts risk,evidence --budget-s 400   # under a time limit
    python scripts/gpu_submit_check.py --out results/ --dry-run      # the commands only

Parts (comma-separated, in this order):
  compile   `popkit compile` of the CUDA examples (COMPILE_TASKS), then `popkit check --json`: the predicted
            precompile status with the artifact measured (unpacked and zipped) against 64 MiB / 1 MiB
  risk      `popkit risk --benchmarks --json` on the CUDA examples (RISK_TASKS) and the known-risk kernels
            (tests/fixtures/risk), each against the level it must get (EXPECTED)
  ncu       `bench --profile ncu` with a profile request's fields (kernel name, launch count); the local ncu
            version and its warnings
  evidence  `bench --leaderboard --harness popkit --evidence OUT/vectoradd-cuda.evidence.json` and `popkit
            verify` of it here; the lead verifies the same file on a second host with
            `python -m popkit verify results/vectoradd-cuda.evidence.json`

Results go to OUT/submit_check.json (rewritten after every step) and OUT/submit_check.md; the table of checks
is printed last.
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
PARTS = ("compile", "risk", "ncu", "evidence")
COMPILE_TASKS = ("vectoradd", "vectorsum")
RISK_TASKS = ("vectoradd", "vectorsum", "softmax")
RISKY = ROOT / "tests" / "fixtures" / "risk"
# file -> (task, the level it must get)
EXPECTED = {
    **{f"submissions/{t}/cuda.py": (t, "low") for t in RISK_TASKS},
    "submissions/vectorsum/pytorch.py": ("vectorsum", "low"),
    "tests/fixtures/risk/near_tolerance.py": ("vectorsum", "high"),
    "tests/fixtures/risk/nondeterministic.py": ("vectorsum", "medium"),
    "tests/fixtures/risk/off_grid.py": ("vectoradd", "high"),
}
EVIDENCE_FILE = "submissions/vectoradd/cuda.py"
NCU_FILE, NCU_KERNEL = "submissions/vectoradd/cuda.py", "add_kernel"
TIMEOUT_S = 600


def popkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "popkit", *args]


def commands(part: str, out: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of each step of a part, in order."""
    if part == "compile":
        steps = []
        for task in COMPILE_TASKS:
            steps.append((f"compile {task}", popkit("compile", f"submissions/{task}/cuda.py", "--json")))
            steps.append((f"check {task}", popkit("check", f"submissions/{task}/cuda.py", "--no-guard", "--json")))
        return steps
    if part == "risk":
        return [(f"risk {file}", popkit("risk", file, "--task", task, "--benchmarks", "--seeds", "1", "--repeats", "2",
                                          "--json"))
                for file, (task, _level) in EXPECTED.items()]
    if part == "ncu":
        return [("ncu request", popkit("bench", NCU_FILE, "--profile", "ncu", "--ncu-kernel-name", NCU_KERNEL,
                                       "--ncu-launch-count", "1", "--json"))]
    evidence = str(out / "vectoradd-cuda.evidence.json")
    return [("evidence write", popkit("bench", EVIDENCE_FILE, "--leaderboard", "--harness", "popkit", "--no-history",
                                      "--evidence", evidence, "--json")),
            ("evidence verify", popkit("verify", evidence, "--json"))]


def run(argv: list[str], deadline: float | None = None) -> dict:
    """One command, stopped at TIMEOUT_S or at `deadline` (time.monotonic()), whichever comes first."""
    start = time.monotonic()
    timeout = TIMEOUT_S if deadline is None else max(1.0, min(TIMEOUT_S, deadline - start))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = 124, exc.stdout or "", exc.stderr or ""
    try:
        doc = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        doc = None
    return {"argv": argv, "exit": code, "seconds": round(time.monotonic() - start, 1), "doc": doc,
            "stderr_tail": (stderr if isinstance(stderr, str) else stderr.decode("utf-8", "replace"))[-2000:]}


def checks(results: dict) -> list[tuple[str, bool, str]]:
    """(what, held, detail) for every expectation the results can answer."""
    found = []
    for name, step in results.items():
        doc = step.get("doc") or {}
        if name.startswith("check "):
            pre = doc.get("precompile") or {}
            artifact = next((e.get("artifact") for e in pre.get("extensions", []) if e.get("artifact")), None)
            detail = (f"{pre.get('status')}; artifact {artifact['unpacked_bytes']:,} B, {artifact['zipped_bytes']:,} B "
                      "zipped" if artifact else f"{pre.get('status')}; artifact not measured")
            found.append((f"precompile {name[6:]}: compiled, artifact measured", pre.get("status") == "compiled"
                          and artifact is not None, detail))
        elif name.startswith("risk "):
            file = name[5:]
            want = EXPECTED[file][1]
            got = doc.get("level")
            reason = doc.get("reason", step["stderr_tail"][-200:])
            found.append((f"risk {file}: {want}", got == want, f"{got}: {reason}"))
        elif name == "ncu request":
            kernels = [k.get("name", "") for k in doc.get("kernels", [])]
            found.append(("ncu request profiles only the named kernel", bool(kernels)
                          and all(NCU_KERNEL in k for k in kernels),
                          f"ncu {doc.get('ncu_version')}; kernels {kernels}; warnings {doc.get('warnings')}"))
        elif name == "evidence write":
            found.append(("evidence written after a passing ranked run", step["exit"] == 0,
                          f"score {doc.get('score_public_s')}"))
        elif name == "evidence verify":
            shapes = [f"{s['key']}: {s['status']}" for s in doc.get("shapes", [])]
            found.append(("evidence verifies on the host that wrote it", doc.get("reproduces") is True,
                          "; ".join(shapes) or step["stderr_tail"][-200:]))
    return found


def table(rows: list[tuple[str, bool, str]]) -> str:
    lines = ["| check | result | detail |", "|---|---|---|"]
    lines += [f"| {what} | {'PASS' if held else 'FAIL'} | {detail} |" for what, held, detail in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop every command this many seconds after the start (0: each has its own 600 s), so "
                             "a run under an outer time limit still writes what it measured")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s if args.budget_s > 0 else None
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.dry_run:
        for part in parts:
            for name, command in commands(part, args.out):
                print(f"{part}: {name}: {' '.join(command)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {}

    def save() -> None:
        (args.out / "submit_check.json").write_text(json.dumps(results, indent=1, default=str))

    for part in parts:
        steps = commands(part, args.out)
        if part in ("risk", "compile"):  # independent files three at a time; a compile before its check
            jobs = [[step] for step in steps] if part == "risk" else [steps[i:i + 2] for i in range(0, len(steps), 2)]
            with ThreadPoolExecutor(3) as pool:
                for job, found in zip(jobs, pool.map(lambda job: [run(argv, deadline) for _name, argv in job], jobs)):
                    for (name, _argv), result in zip(job, found):
                        results[name] = result
                        print(f"[{time.strftime('%H:%M:%S')}] {name}: exit {result['exit']} in {result['seconds']} s",
                              flush=True)
                        save()  # a run cut short keeps every step that ended
        else:
            for name, command in steps:
                results[name] = run(command, deadline)
                print(f"[{time.strftime('%H:%M:%S')}] {name}: exit {results[name]['exit']} in "
                      f"{results[name]['seconds']} s", flush=True)
                save()
    rows = checks(results)
    (args.out / "submit_check.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0 if all(held for _what, held, _detail in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
