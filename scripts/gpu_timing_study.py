#!/usr/bin/env python3
"""Which timing audit catches work left on another queue at any share of calls, and what it costs.

Run from the repository root on an NVIDIA GPU with popkit importable (no network needed):

    python3 scripts/gpu_timing_study.py --out results/

For every bundled task it runs popkit's harness in leaderboard mode alone (runner.run_submission with
chain=False: one eval process each, the ranked mode's 100 fresh inputs per shape, rechecked):
  cheat    submissions/cheats/side_stream_share.py (the reference, on a second CUDA queue on a share of its
           calls, POPKIT_CHEAT_SHARE) at share 0 (the honest reference on every call: the baseline) and at
           each --shares, under the trace audit (POPKIT_TIMING_AUDIT=trace), which also measures the drains;
  honest   submissions/<task>/cuda.py, --pairs pairs of runs alternating the trace audit and the drain rule
           (trace first in even pairs, drain first in odd ones): the A/B of the trace audit's overhead on
           honest event times (the drain rule's synchronize comes after the end event, so drain runs time
           exactly as the leaderboard does) and the honest runs that every rule must pass;
  drain    the cheat at share 0 and at each --drain-shares under the drain rule alone (no profiler in the
           process, whose tracer slows the cheat's own wait and launch on its second queue): the drain
           rule's hole as it is, and the cheat's fake speed-up there.
The CUDA examples are built first, in parallel (`python -m popkit test FILE --precompile`), so no timed run waits on a
compiler. With the defaults: 6 tasks x (5 trace cheat + 4 honest + 2 drain cheat) = 66 evals, about 6
minutes on an H100 after about 1.5 minutes of builds; --minutes (default 8) starts no eval that would end
past it (the rest is listed as skipped, the drain cheats first).

Per case it keeps the event times, every timed call's drain (host clock: ns a device-wide synchronize took
after the end event) and, from the GPU trace, how long each call's work ran past its end event (overrun:
against the end event's exact GPU time where the start was queued during the flush, else against the end
marker; marker overrun: against the end marker alone). From those it computes what each rule would say:
  drain     the share rule (eval.unsynchronized_work: at least 3 and half the calls drained over 50 µs);
  trace     any call whose work ended more than eval.TRACE_MARGIN_NS after its end event (eval.unsynchronized_trace);
  charge    no verdict: every call charged its overrun (event time + max(0, overrun), GPU clock), and, for
            comparison, the host-clock version "time to device idle" (event time + drain).
The drain rule's verdicts on the trace runs' drains are for comparison on the same calls; its verdicts as it
stands are the drain runs'.

Writes OUT/timing_study.json after every eval (a cut-off run keeps what it got) and OUT/timing_study.md,
and prints the markdown last. Exit 0 when the trace audit failed every cheating run by name and passed
every honest one and every planned eval ran; 1 otherwise; 2 without an NVIDIA GPU. `--dry-run` prints the
builds and the evals it would run, and runs nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
SHARES = (0.1, 0.2, 0.4, 0.49)
CHEAT = ROOT / "submissions" / "cheats" / "side_stream_share.py"
SECONDS_PER_EVAL = 5.5  # H100, leaderboard mode, warm build cache (docs/gpu-runs/HISTORY.md, "A sealed run"): the estimate


def load_eval():
    """The harness's pure rules (tasks/popkit_protocol.py, loaded by tasks/eval.py's own loader; it imports only
    the standard library)."""
    spec = importlib.util.spec_from_file_location("popkit_eval_for_study", ROOT / "tasks" / "eval.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    return entry.load(("popkit_protocol",))


ev = load_eval()


@dataclass(frozen=True)
class Job:
    """One leaderboard-mode eval of the study."""

    kind: str  # "cheat" or "honest"
    task: str
    audit: str  # POPKIT_TIMING_AUDIT
    share: float | None = None  # cheat only: POPKIT_CHEAT_SHARE
    pair: int | None = None  # honest only: the A/B pair it belongs to

    @property
    def path(self) -> Path:
        return CHEAT if self.kind == "cheat" else ROOT / "submissions" / self.task / "cuda.py"

    @property
    def env(self) -> dict[str, str]:
        env = {"POPKIT_TIMING_AUDIT": self.audit}
        if self.share is not None:
            env["POPKIT_CHEAT_SHARE"] = repr(self.share)
        return env

    @property
    def label(self) -> str:
        what = f"share {self.share:g}" if self.kind == "cheat" else f"cuda.py pair {self.pair}"
        return f"{self.task} {what} audit={self.audit}"


def plan(tasks: list[str], shares: list[float], pairs: int, drain_shares: list[float] = (), baseline: bool = True,
         honest: dict[str, int] | None = None) -> list[Job]:
    """The cheat at share 0 and at each share (trace audit) on every task first, then the honest A/B pairs, one
    pair of every task at a time (trace first in even pairs, drain first in odd ones), then the cheat at share
    0 and at each drain share under the drain rule: a run cut short by --minutes loses the drain cheats first,
    then its last honest pairs, never a task's trace runs."""
    jobs = [Job("cheat", task, "trace", share) for task in tasks for share in ((0.0,) if baseline else ()) + tuple(shares)]
    for pair in range(pairs):
        order = ("trace", "drain") if pair % 2 == 0 else ("drain", "trace")
        jobs += [Job("honest", task, audit, pair=pair) for task in tasks for audit in order]
    for task in tasks:  # honest runs under the trace audit alone (--honest): every one must pass
        jobs += [Job("honest", task, "trace", pair=pairs + i) for i in range((honest or {}).get(task, 0))]
    if drain_shares:
        jobs += [Job("cheat", task, "drain", share) for task in tasks for share in (0.0, *drain_shares)]
    return jobs


def compile_argv(path: Path) -> list[str]:
    """Builds the file's extension where the runs' compile pre-step looks for it (torch's extension folder, and
    popkit's build-cache index): a test run with the pre-step forced, so no timed run below waits on a compiler."""
    return [sys.executable, "-m", "popkit", "test", str(path), "--task", path.parent.name, "--precompile",
            "--no-history", "--json"]


def _numbers(text: str | None) -> list[float]:
    return [float(x) for x in text.split(",")] if text else []


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def case_signals(raw: dict, index: int, passed: bool, error: str) -> dict:
    """One benchmark case's event times, per-call signals and what each rule says, from its pipe keys."""
    p = f"benchmark.{index}."
    samples = _numbers(raw.get(p + "samples") or raw.get(p + "audit_samples"))
    drains = _numbers(raw.get(p + "drains"))
    overruns = _numbers(raw.get(p + "overruns"))
    markers = _numbers(raw.get(p + "marker_overruns"))
    audits = [ev.CallAudit(None if math.isnan(o) else o, None if math.isnan(m) else m, True, False)
              for o, m in zip(overruns, markers)]
    known = [o for o in overruns if not math.isnan(o)]
    charged = ([s + max(0.0, 0.0 if math.isnan(o) else o) for s, o in zip(samples, overruns)]
               if len(overruns) == len(samples) else [])
    idle = [s + d for s, d in zip(samples, drains)] if len(drains) == len(samples) else []
    return {
        "spec": raw.get(p + "spec", ""), "passed": passed, "error": error, "calls": len(samples),
        "event_mean_ns": _mean(samples), "samples_ns": samples, "drains_ns": drains, "overruns_ns": overruns,
        "marker_overruns_ns": markers, "late_starts": int(raw.get(p + "late_starts") or 0),
        "max_overrun_ns": max(known) if known else None,
        "late_calls_trace": sum(o > ev.TRACE_MARGIN_NS for o in known),
        "late_calls_drain": sum(d > ev.DRAIN_MARGIN_NS for d in drains),
        "drain_rule": (ev.unsynchronized_work(drains) or "") if drains else "",
        "trace_rule": (ev.unsynchronized_trace(audits) or "") if audits else "",
        "charged_mean_ns": _mean(charged), "idle_mean_ns": _mean(idle),
    }


def job_row(job: Job, report: dict, seconds: float) -> dict:
    """A job's result from its RunReport JSON: verdict, scores under each rule's view, per-case signals."""
    runs = report.get("runs") or []
    run = runs[-1] if runs else {}
    raw = run.get("raw") or {}
    cases = [case_signals(raw, i, bool(c.get("passed")), c.get("error", ""))
             for i, c in enumerate(run.get("benchmarks") or [])]
    ranking = report.get("ranking_by", "geom")

    def score(key: str) -> float | None:
        values = [c[key] for c in cases]
        return api.score(values, ranking) if values and all(v is not None for v in values) else None

    errors = [c["error"] for c in cases if not c["passed"]]
    return {**job.__dict__, "label": job.label, "seconds": round(seconds, 1), "outcome": report.get("outcome"),
            "summary": run.get("summary", report.get("message", "")), "errors": errors,
            "classes": sorted({e.split(":", 1)[0] for e in errors}), "audit_applied": raw.get("trust.audit", ""),
            "audit_note": raw.get("trust.audit_note", ""), "score_s": report.get("score_public_s"),
            "event_score_s": score("event_mean_ns"), "charged_score_s": score("charged_mean_ns"),
            "idle_score_s": score("idle_mean_ns"), "drain_rule_fails": any(c["drain_rule"] for c in cases),
            "trace_rule_fails": any(c["trace_rule"] for c in cases), "cases": cases}


def run_job(job: Job, system: dict) -> dict:
    start = time.monotonic()
    try:  # the ranked mode alone, in the sandbox as every run; `system` is probed per run (NVML: a tenth of a second)
        outcome = api.bench(job.path, task=str(ROOT / "tasks" / job.task), leaderboard=True, alone=True,
                            harness="popkit", secret_runs=0, env=job.env, label=job.label, record=False)
        report = outcome.report.to_json()
    except api.PopkitError as exc:
        report = {"outcome": "error", "message": str(exc)}
    return job_row(job, report, time.monotonic() - start)


def _us(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e6:.1f}"


def _verdict(failed: bool) -> str:
    return "fails" if failed else "passes"


def summarize(rows: list[dict]) -> dict:
    """Per task: the cheat rows against the share-0 baseline, and the honest A/B (trace / drain score ratio)."""
    out: dict = {"cheats": [], "honest": [], "rules": {}}
    for task in dict.fromkeys(r["task"] for r in rows):
        for r in rows:
            if r["task"] != task or r["kind"] != "cheat":
                continue
            base = next((b for b in rows if b["task"] == task and b["kind"] == "cheat" and b["share"] == 0.0
                         and b["audit"] == r["audit"]), None)
            base_score = base["event_score_s"] if base else None
            speedup = base_score / r["event_score_s"] if base_score and r["event_score_s"] else None
            out["cheats"].append({"task": task, "share": r["share"], "audit": r["audit"], "outcome": r["outcome"],
                                  "classes": r["classes"], "event_score_s": r["event_score_s"],
                                  "baseline_score_s": base_score, "fake_speedup": speedup,
                                  "charged_score_s": r["charged_score_s"], "idle_score_s": r["idle_score_s"],
                                  "drain_rule_fails": r["drain_rule_fails"], "trace_rule_fails": r["trace_rule_fails"],
                                  "audit_applied": r["audit_applied"],
                                  "max_overrun_ns": max((c["max_overrun_ns"] for c in r["cases"]
                                                         if c["max_overrun_ns"] is not None), default=None)})
        honest = [r for r in rows if r["task"] == task and r["kind"] == "honest"]
        pairs = sorted({r["pair"] for r in honest})
        side = {a: [r for r in honest if r["audit"] == a] for a in ("trace", "drain")}
        ratios = []
        for pair in pairs:
            t = next((r for r in side["trace"] if r["pair"] == pair and r["event_score_s"]), None)
            d = next((r for r in side["drain"] if r["pair"] == pair and r["event_score_s"]), None)
            if t and d:
                ratios.append(t["event_score_s"] / d["event_score_s"])
        interval = api.ratio_interval(ratios) if ratios else None
        scores = {a: [r["event_score_s"] for r in side[a] if r["event_score_s"]] for a in side}
        spread = {a: (max(v) / min(v) - 1 if len(v) > 1 else None) for a, v in scores.items()}
        overruns = [c["max_overrun_ns"] for r in honest for c in r["cases"] if c["max_overrun_ns"] is not None]
        out["honest"].append({
            "task": task, "runs": {a: len(side[a]) for a in side},
            "passed": {a: sum(r["outcome"] == "passed" for r in side[a]) for a in side},
            "trace_scores_s": scores["trace"], "drain_scores_s": scores["drain"],
            "ratio": interval.estimate if interval else None, "ratio_low": interval.low if interval else None,
            "ratio_high": interval.high if interval else None, "spread": spread,
            "max_overrun_ns": max(overruns) if overruns else None,
            "late_starts": sum(c["late_starts"] for r in side["trace"] for c in r["cases"]),
            "calls": sum(c["calls"] for r in side["trace"] for c in r["cases"]),
            "drain_rule_fails": sum(r["drain_rule_fails"] for r in honest),
            "trace_rule_fails": sum(r["trace_rule_fails"] for r in honest)})
    cheats = [c for c in out["cheats"] if c["share"] > 0 and c["audit"] == "trace"]
    honest_runs = sum(sum(h["runs"].values()) for h in out["honest"])
    for rule in ("drain", "trace"):
        out["rules"][rule] = {"cheats_caught": sum(c[f"{rule}_rule_fails"] for c in cheats), "cheats": len(cheats),
                              "honest_failed": sum(h[f"{rule}_rule_fails"] for h in out["honest"]),
                              "honest_runs": honest_runs}
    alone = [c for c in out["cheats"] if c["share"] > 0 and c["audit"] == "drain"]
    if alone:  # the drain rule as it stands: its own runs, no profiler in the process
        out["rules"]["drain alone"] = {"cheats_caught": sum(c["outcome"] == "failed" for c in alone),
                                       "cheats": len(alone), "honest_failed": None, "honest_runs": None}
    return out


def expected(summary: dict) -> bool:
    """The trace audit failed every cheating run by name and passed every honest run (and the baseline)."""
    traced = [c for c in summary["cheats"] if c["audit"] == "trace"]
    cheats_ok = all(c["outcome"] == "failed" and "unsynchronized work" in c["classes"]
                    for c in traced if c["share"] > 0)
    baseline_ok = all(c["outcome"] == "passed" for c in traced if c["share"] == 0)
    honest_ok = all(h["passed"]["trace"] == h["runs"]["trace"] for h in summary["honest"])
    return cheats_ok and baseline_ok and honest_ok


def markdown(summary: dict, device: str) -> str:
    lines = [f"Timing audit study on an {device} (`python3 scripts/gpu_timing_study.py`): leaderboard mode, "
             "popkit's harness.", "",
             "Side-queue cheat (submissions/cheats/side_stream_share.py; share 0 = the reference on every call), "
             "run under the trace audit (each rule also judged from the same calls) or under the drain rule alone:",
             "", "| task | share | run under | harness verdict | event score µs | × faster than share 0 | "
             "drain rule | trace rule | charged score µs | time-to-idle score µs | max overrun µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["cheats"]:
        verdict = c["outcome"] + (f" ({', '.join(c['classes'])})" if c["classes"] else "")
        if c["audit_applied"] and c["audit_applied"] != c["audit"]:
            verdict += f" [audit: {c['audit_applied']}]"
        speed = "–" if c["fake_speedup"] is None else f"{c['fake_speedup']:.2f}"
        top = "–" if c["max_overrun_ns"] is None else f"{c['max_overrun_ns'] / 1e3:.1f}"
        trace = _verdict(c["trace_rule_fails"]) if c["audit"] == "trace" else "–"
        lines.append(f"| {c['task']} | {c['share']:g} | {c['audit']} | {verdict} | {_us(c['event_score_s'])} | "
                     f"{speed} | {_verdict(c['drain_rule_fails'])} | {trace} | "
                     f"{_us(c['charged_score_s'])} | {_us(c['idle_score_s'])} | {top} |")
    lines += ["", "Honest CUDA examples: A/B of the trace audit against the drain rule (same file, alternating "
              "processes); ratio = trace score / drain score, 95% interval over pairs:", "",
              "| task | passed trace / drain | trace scores µs | drain scores µs | ratio [95%] | "
              "spread trace / drain | max overrun µs | late starts / calls | drain rule fails | trace rule fails |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for h in summary["honest"]:
        ratio = "–" if h["ratio"] is None else (
            f"{h['ratio']:.4f}" + (f" [{h['ratio_low']:.4f}, {h['ratio_high']:.4f}]" if h["ratio_low"] else ""))
        spread = " / ".join("–" if v is None else f"{v:.2%}" for v in (h["spread"]["trace"], h["spread"]["drain"]))
        top = "–" if h["max_overrun_ns"] is None else f"{h['max_overrun_ns'] / 1e3:.1f}"
        passed = " / ".join(f"{h['passed'][a]}/{h['runs'][a]}" for a in ("trace", "drain"))
        lines.append(f"| {h['task']} | {passed} | {', '.join(_us(s) for s in h['trace_scores_s'])} | "
                     f"{', '.join(_us(s) for s in h['drain_scores_s'])} | {ratio} | {spread} | {top} | "
                     f"{h['late_starts']}/{h['calls']} | {h['drain_rule_fails']} | {h['trace_rule_fails']} |")
    lines.append("")
    for rule, r in summary["rules"].items():
        honest = "" if r["honest_runs"] is None else f"; failed {r['honest_failed']} of {r['honest_runs']} honest runs"
        lines.append(f"- {rule} rule: caught {r['cheats_caught']} of {r['cheats']} cheating runs{honest}.")
    lines.append(f"- trace audit as expected (every cheat failed by name, every honest run passed): "
                 f"{'yes' if expected(summary) else '**no**'}.")
    return "\n".join(lines) + "\n"


def _shares(text: str) -> list[float]:
    if text.strip().lower() == "none":
        return []
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(not 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"shares must be fractions in (0, 1], got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for timing_study.json and timing_study.md")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated bundled tasks (default: all 6)")
    parser.add_argument("--shares", type=_shares, default=list(SHARES), help="cheat shares (default 0.1,0.2,0.4,0.49)")
    parser.add_argument("--pairs", type=int, default=2, help="honest A/B pairs per task (default 2: 2 runs per rule)")
    parser.add_argument("--drain-shares", type=_shares, default=[0.4],
                        help="cheat shares also run under the drain rule alone (default 0.4)")
    parser.add_argument("--minutes", type=float, default=8.0,
                        help="start no eval expected to end after this many minutes from the start (0: no limit)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the cheat at share 0 (the reference)")
    parser.add_argument("--honest", default="", help="TASK=N,...: N more honest runs under the trace audit alone "
                        "(after the pairs), e.g. identity=3,vectoradd=5")
    parser.add_argument("--dry-run", action="store_true", help="print the builds and evals, run nothing")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; bundled: {', '.join(TASKS)}")
    if args.pairs < 0:
        parser.error("--pairs must be at least 0")
    try:
        honest = {k.strip(): int(v) for k, v in (item.split("=") for item in args.honest.split(",") if item.strip())}
    except ValueError:
        parser.error(f"--honest {args.honest!r}: give TASK=N pairs separated by commas")
    jobs = plan(tasks, args.shares, args.pairs, args.drain_shares, baseline=not args.no_baseline, honest=honest)
    builds = [ROOT / "submissions" / t / "cuda.py" for t in tasks]
    if args.dry_run:
        for path in builds:
            print(" ".join(compile_argv(path)))
        for job in jobs:
            env = " ".join(f"{k}={v}" for k, v in job.env.items())
            print(f"{env} leaderboard eval (popkit harness, mode alone): {job.path.relative_to(ROOT)} "
                  f"--task {job.task}")
        print(f"{len(jobs)} evals, about {len(jobs) * SECONDS_PER_EVAL / 60:.0f} minutes after the builds")
        return 0
    import torch

    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        print("gpu_timing_study: needs an NVIDIA GPU (use --dry-run to see the plan)", file=sys.stderr)
        return 2

    started = time.monotonic()
    device = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": device, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "config": {"tasks": tasks, "shares": args.shares, "pairs": args.pairs,
                                "drain_shares": args.drain_shares,
                                "trace_margin_ns": ev.TRACE_MARGIN_NS, "drain_margin_ns": ev.DRAIN_MARGIN_NS},
                     "builds": [], "rows": []}

    def save() -> None:
        (args.out / "timing_study.json").write_text(json.dumps(results, indent=1, default=str))

    env = {**os.environ, "MAX_JOBS": "4"}
    with ThreadPoolExecutor(max_workers=len(builds)) as pool:  # builds only; every timed run below runs alone
        done = pool.map(lambda p: subprocess.run(compile_argv(p), capture_output=True, text=True, cwd=ROOT, env=env,
                                                 stdin=subprocess.DEVNULL, timeout=600), builds)
        for path, proc in zip(builds, done):
            results["builds"].append({"file": str(path.relative_to(ROOT)), "exit_code": proc.returncode})
    save()
    system: dict = {}
    results["skipped"] = []
    for job in jobs:
        took = [r["seconds"] for r in results["rows"]]
        expect = sum(took) / len(took) if took else SECONDS_PER_EVAL
        if args.minutes and time.monotonic() - started + expect > args.minutes * 60:
            results["skipped"].append(job.label)
            continue
        row = run_job(job, system)
        results["rows"].append(row)
        save()
        print(f"[{time.strftime('%H:%M:%S')}] {job.label}: {row['outcome']} {', '.join(row['classes'])} "
              f"({row['seconds']} s)", flush=True)
    results["summary"] = summarize(results["rows"])
    save()
    text = markdown(results["summary"], device)
    if results["skipped"]:
        text += f"\nNot run (--minutes {args.minutes:g}): {'; '.join(results['skipped'])}.\n"
    (args.out / "timing_study.md").write_text(text)
    print(text)
    return 0 if expected(results["summary"]) and not results["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
