#!/usr/bin/env python3
"""Save to verdict with `popkit test --watch`, against the cold bare eval and a cold `popkit test`, on a GPU.

Run from the repository root on a machine with an NVIDIA GPU (no network needed; about 6-7 minutes on an H100):

    python3 scripts/gpu_watch.py --out results/ [--problems .refk/problems] [--repeats 3] [--only vectoradd,...]

Cases: the 6 bundled tasks with their PyTorch examples (submissions/T/pytorch.py), and 3 public tasks from a
problem-set checkout (`--problems`): pmpp_v2 vectoradd, grayscale and matmul, with small PyTorch submissions
written here (a missing task is skipped and said so). Per case, one `popkit test FILE --watch --json
--no-history` runs on a copy of the file for the whole case; then `--repeats` times, in alternating order
(bare, cold, warm, then warm, cold, bare):

- bare: the task's own eval in test mode, run directly with a result pipe (scripts/bare_eval.py), wall time;
- cold: `popkit test FILE --json --no-history` as a user runs it, wall time;
- warm: the copy is rewritten (a new last comment line) once the watch said `watch: ready`, and timed from
  the end of the write to the arrival of the verdict's JSON line on the watch's stdout.

Before every timed step the watch's next warm worker is ready, so its start-up never runs beside a timed
step. The target is warm <= 0.5 x bare (median over the repeats), per case.

Writes OUT/watch.json (after every case, so a cut-off run keeps what it measured) and OUT/watch.md (the
table, naming the card) and prints the markdown last. `--budget-s` stops starting new cases after that
many seconds. `--dry-run` writes the submissions and the plan, runs nothing (works without a GPU).
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bare_eval import bare_run  # noqa: E402

BUNDLED = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
TARGET = 0.5  # save to verdict with --watch at most half the cold bare eval's test time
STEP_TIMEOUT_S = 300.0

# Small PyTorch submissions for the public tasks, written for this script (not copied from the sets). Each
# returns what the task's reference returns: its output buffer where the reference writes one (vectoradd,
# grayscale), a new tensor where it returns one (matmul), so popkit's harness and the task's eval agree.
SUBMISSIONS = {
    "vectoradd": """import torch


def custom_kernel(data):
    a, b, out = data
    torch.add(a, b, out=out)
    return out
""",
    "grayscale": """import torch


def custom_kernel(data):
    rgb, out = data
    out.copy_(rgb[..., 0] * 0.2989 + rgb[..., 1] * 0.5870 + rgb[..., 2] * 0.1140)
    return out
""",
    "matmul": """import torch


def custom_kernel(data):
    a, b, _c = data
    return a @ b
""",
}
# (label, task directory relative to --problems, submission key)
PUBLIC = (
    ("vectoradd_v2", "pmpp_v2/vectoradd_py", "vectoradd"),
    ("grayscale_v2", "pmpp_v2/grayscale_py", "grayscale"),
    ("matmul_v2", "pmpp_v2/matmul_py", "matmul"),
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def plan(problems: Path, subs_dir: Path) -> list[dict]:
    """Every case: label, task (a bundled name or a directory), its directory (for the bare eval), submission."""
    cases = [{"label": f"{t} (bundled)", "key": t, "task": t, "task_dir": str(ROOT / "tasks" / t),
              "submission": str(ROOT / "submissions" / t / "pytorch.py"), "missing": False} for t in BUNDLED]
    subs_dir.mkdir(parents=True, exist_ok=True)
    for label, rel, key in PUBLIC:
        path = subs_dir / f"{key}.py"
        path.write_text(SUBMISSIONS[key])
        task_dir = problems / rel
        cases.append({"label": label, "key": label, "task": str(task_dir), "task_dir": str(task_dir),
                      "submission": str(path), "missing": not (task_dir / "task.yml").is_file()})
    return cases


def popkit_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "popkit", *args]


def watch_argv(case: dict, path: Path) -> list[str]:
    return popkit_argv("test", str(path), "--task", case["task"], "--watch", "--json", "--no-history")


def cold_argv(case: dict, path: Path) -> list[str]:
    return popkit_argv("test", str(path), "--task", case["task"], "--json", "--no-history")


class Watch:
    """One `popkit test --watch --json` process: its JSON lines (with their arrival times) and its stderr."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line))

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)

    def verdict(self, timeout: float = STEP_TIMEOUT_S) -> tuple[float, dict]:
        try:
            arrived, line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no verdict within {timeout:.0f} s: {''.join(self.err)[-800:]}") from None
        return arrived, json.loads(line)

    def wait_ready(self, count: int, timeout: float = STEP_TIMEOUT_S) -> float:
        """Wait until the watch said `watch: ready` `count` times in all; the seconds waited."""
        start = time.monotonic()
        while sum(line.startswith("watch: ready") for line in list(self.err)) < count:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the watch ended (exit {self.proc.returncode}): {''.join(self.err)[-800:]}")
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"no warm worker ready within {timeout:.0f} s: {''.join(self.err)[-800:]}")
            time.sleep(0.02)
        return time.monotonic() - start

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def run_bare(case: dict, text: str) -> dict:
    start = time.monotonic()
    result = bare_run(Path(case["task_dir"]), text, "test", timeout_s=STEP_TIMEOUT_S)
    return {"seconds": time.monotonic() - start, "outcome": "passed" if result["_passed"] else
            f"failed (exit {result['_exit']})"}


def run_cold(case: dict, path: Path) -> dict:
    start = time.monotonic()
    done = subprocess.run(cold_argv(case, path), cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=STEP_TIMEOUT_S)
    seconds = time.monotonic() - start
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return {"seconds": seconds, "outcome": f"no report (exit {done.returncode}): {done.stderr[-300:]}"}
    return {"seconds": seconds, "outcome": doc.get("outcome", doc.get("message", "?")),
            "eval_s": sum(r.get("duration_s") or 0.0 for r in doc.get("runs") or [])}


def run_warm(watch: Watch, path: Path, text: str, index: int) -> dict:
    """Rewrite the file (a new last line) and time until its verdict's JSON line arrives."""
    watch.wait_ready(index)
    with open(path, "w") as f:
        f.write(text + f"# save {index}\n")
    saved = time.monotonic()
    arrived, doc = watch.verdict()
    report = doc.get("report") or {}
    runs = report.get("runs") or []
    return {"seconds": arrived - saved, "popkit_s": doc.get("save_to_verdict_s"), "outcome": doc.get("outcome"),
            "ready_at_save": doc.get("ready_at_save"), "warmup_s": doc.get("warmup_s"),
            "eval_s": runs[0].get("duration_s") if runs else None, "harness": doc.get("harness"),
            "verdict": doc.get("verdict")}


def measure(case: dict, repeats: int, work: Path) -> dict:
    """The case's three timings, `repeats` times in alternating order (module doc)."""
    text = Path(case["submission"]).read_text()
    path = work / f"{case['key']}.py"
    path.write_text(text)
    row = {**case, "bare": [], "cold": [], "warm": []}
    watch = Watch(watch_argv(case, path))
    try:
        _, first = watch.verdict()
        row["start_verdict"] = {"outcome": first.get("outcome"), "seconds": first.get("save_to_verdict_s"),
                                "error": (first.get("error") or {}).get("message")}
        saves = 0
        for r in range(repeats):
            order = ("bare", "cold", "warm") if r % 2 == 0 else ("warm", "cold", "bare")
            for step in order:
                watch.wait_ready(saves + 1)  # the next warm worker is up: nothing starts beside a timed step
                if step == "bare":
                    row["bare"].append(run_bare(case, text))
                elif step == "cold":
                    row["cold"].append(run_cold(case, path))
                else:
                    saves += 1
                    row["warm"].append(run_warm(watch, path, text, saves))
                log(f"  {case['label']} {step}: {row[step][-1]['seconds']:.2f} s, {row[step][-1]['outcome']}")
    finally:
        row["watch_exit"] = watch.stop()
    medians = {k: statistics.median(x["seconds"] for x in row[k]) for k in ("bare", "cold", "warm") if row[k]}
    row["median_s"] = medians
    if {"bare", "warm"} <= set(medians):
        row["warm_over_bare"] = medians["warm"] / medians["bare"]
    if {"cold", "warm"} <= set(medians):
        row["warm_over_cold"] = medians["warm"] / medians["cold"]
    return row


def _s(value) -> str:
    return "–" if value is None else f"{value:.2f} s"


def markdown(doc: dict) -> str:
    lines = [f"`popkit test --watch` on {doc.get('card', '?')}: save to verdict (warm worker) against the cold "
             f"bare eval's test time and a cold `popkit test`, medians of {doc.get('repeats')} alternating repeats.",
             "", "| task | bare eval (test) | popkit test (cold) | --watch save → verdict | warm / bare | "
             "warm / cold | verdicts (bare / cold / warm) | ready at save |",
             "|---|---|---|---|---|---|---|---|"]
    met = total = 0
    for row in doc["rows"]:
        if row.get("skipped") or row.get("error"):
            lines.append(f"| {row['label']} | {row.get('skipped') or 'error: ' + row['error'][:120]} "
                         "| | | | | | |")
            continue
        m = row["median_s"]
        ratio = row.get("warm_over_bare")
        total += 1
        met += ratio is not None and ratio <= TARGET
        verdicts = " / ".join(",".join(sorted({x["outcome"] for x in row[k]})) or "–" for k in ("bare", "cold", "warm"))
        ready = sum(bool(x.get("ready_at_save")) for x in row["warm"])
        mark = "" if ratio is None or ratio <= TARGET else " **(> 0.5)**"
        over_bare = "–" if ratio is None else f"{ratio:.2f}{mark}"
        over_cold = "–" if row.get("warm_over_cold") is None else f"{row['warm_over_cold']:.2f}"
        lines.append(f"| {row['label']} | {_s(m.get('bare'))} | {_s(m.get('cold'))} | {_s(m.get('warm'))} | "
                     f"{over_bare} | {over_cold} | {verdicts} | {ready}/{len(row['warm'])} |")
    lines += ["", f"{met} of {total} cases at or below {TARGET} x the bare eval. Warm: from the end of the write to "
              "the verdict's JSON line (the watch polls every 50 ms and waits one poll for the write to settle). "
              "Public tasks run popkit's harness warm (their own eval cold)."]
    return "\n".join(lines) + "\n"


def card() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "no GPU"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "no GPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for watch.json, watch.md and the submissions")
    parser.add_argument("--problems", type=Path, default=ROOT / ".refk" / "problems",
                        help="checkout of the public problem sets (default .refk/problems)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats per case (default 3)")
    parser.add_argument("--only", default="", help="comma-separated case keys (bundled names, vectoradd_v2, ...)")
    parser.add_argument("--budget-s", type=float, default=440.0, help="start no new case after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="write the plan and the submissions, run nothing")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    cases = plan(args.problems, args.out / "submissions")
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = sorted(wanted - {c["key"] for c in cases})
        if unknown:
            parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(c['key'] for c in cases)}")
        cases = [c for c in cases if c["key"] in wanted]
    doc: dict = {"card": "dry run" if args.dry_run else card(), "repeats": args.repeats, "plan": cases, "rows": []}
    save = lambda: (args.out / "watch.json").write_text(json.dumps(doc, indent=1, default=str))  # noqa: E731
    if args.dry_run:
        save()
        for case in cases:
            note = "  (task missing: skipped)" if case["missing"] else ""
            print(" ".join(watch_argv(case, Path(case["submission"]))) + note)
            print(" ".join(cold_argv(case, Path(case["submission"]))))
            print(f"bare eval: {case['task_dir']} test")
        return 0
    start = time.monotonic()
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    for case in cases:
        if case["missing"]:
            doc["rows"].append({**case, "skipped": f"task not found under {args.problems}"})
        elif time.monotonic() - start > args.budget_s:
            doc["rows"].append({**case, "skipped": f"budget of {args.budget_s:.0f} s spent"})
        else:
            log(f"{case['label']}")
            try:
                doc["rows"].append(measure(case, args.repeats, work))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, OSError) as exc:
                doc["rows"].append({**case, "error": f"{type(exc).__name__}: {exc}"})
        save()
    doc["seconds"] = time.monotonic() - start
    save()
    text = markdown(doc)
    (args.out / "watch.md").write_text(text)
    print(text)
    rows = [r for r in doc["rows"] if "median_s" in r]
    return 0 if rows and all((r.get("warm_over_bare") or 9) <= TARGET for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
