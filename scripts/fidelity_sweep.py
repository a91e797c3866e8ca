#!/usr/bin/env python3
"""Fidelity sweep: every public task this machine can run, popkit's verdict against the bare eval's.

Run from the repository root on one GPU machine (about 8 minutes on an H100; kind nvidia-h100-x1):

    python3 scripts/fidelity_sweep.py [PROBLEMS] --out OUTDIR [--jobs 6] [--leaderboard vectoradd_v2,...]
        [--only linalg/,pmpp_v2/matmul] [--no-tests]

PROBLEMS is a checkout of the public problem sets (default .refk/problems). Which tasks can run here comes
from popkit's own check (`popkit tasks --check`, through popkit.api). Per runnable task, two submissions:
- right: the set's own submission.py where its imports are installed here, else a PyTorch one written here
  that returns the task's ref_kernel output;
- wrong: ref_kernel's output plus one (every tensor), which any checker must reject (princeton's
  cross-entropy, whose contract is two functions, gets zeros from both).
Each runs in test mode through `popkit test --json` and through the bare eval (scripts/bare_eval.py), the
test-mode jobs --jobs at a time (verdicts do not depend on timing; a job whose verdicts differ or that ran out of
GPU memory beside the others runs again alone, and the table says so). Then, one at a time and nothing else on
the GPU, the --leaderboard subset runs the right submission through `popkit bench --leaderboard` and the
bare eval's ranked chain (test, benchmark, leaderboard: each its own process, as the runner runs them), and
the public scores are compared (--lb-repeats pairs in alternating order, medians). --budget-s stops starting
new work.

Writes OUTDIR/sweep.json (after every job) and OUTDIR/sweep.md (the tables, naming the card), and prints
the markdown. `--dry-run` plans and writes the submissions without running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bare_eval import bare_run, mean_score_s  # noqa: E402

from popkit import api  # noqa: E402

LEADERBOARD_SUBSET = ("vectoradd_v2", "grayscale_v2", "matmul_v2", "fp8_quant")

REFERENCE_RIGHT = '''# fidelity sweep: the task's own reference output (a PyTorch submission written by the sweep)
from reference import ref_kernel


def custom_kernel(data):
    return ref_kernel(data)
'''
REFERENCE_WRONG = '''# fidelity sweep: wrong on purpose (the reference's output plus one)
import torch
from reference import ref_kernel


def _bump(x):
    if isinstance(x, torch.Tensor):
        return ~x if x.dtype == torch.bool else (x.float() + 1).to(x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_bump(v) for v in x)
    if isinstance(x, dict):
        return {k: _bump(v) for k, v in x.items()}
    return x + 1 if isinstance(x, (int, float)) else x


def custom_kernel(data):
    return _bump(ref_kernel(data))
'''
CROSS_ENTROPY_WRONG = '''# fidelity sweep: wrong on purpose (zeros)
import torch


def cross_entropy_forward(logits, targets):
    return torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)


def cross_entropy_backward(logits, targets, grad_output):
    return torch.zeros_like(logits)
'''


def imports_available(source: str) -> bool:
    """Whether every top-level import of `source` that is not a task file can be found here."""
    local = {"task", "reference", "utils", "submission", "eval"}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return all(n in local or n in sys.stdlib_module_names or importlib.util.find_spec(n) for n in names)


def submissions_for(task) -> dict[str, tuple[str, str]]:
    """kind -> (what it is, source)."""
    shipped = task.path / "submission.py"
    names = api.TaskDetail(task).entry_points
    custom = not names or tuple(names) == ("custom_kernel",)
    right = None
    if shipped.is_file() and imports_available(shipped.read_text()):
        right = ("the set's submission.py", shipped.read_text())
    elif custom:
        right = ("ref_kernel wrapper", REFERENCE_RIGHT)
    wrong = ("ref_kernel + 1", REFERENCE_WRONG) if custom else ("zeros", CROSS_ENTROPY_WRONG)
    return {k: v for k, v in (("right", right), ("wrong", wrong)) if v is not None}


def popkit_json(args: list[str], timeout: float) -> dict:
    done = subprocess.run([sys.executable, "-m", "popkit", *args, "--json", "--no-history"], capture_output=True,
                          text=True, timeout=timeout)
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"outcome": "no_json", "exit_code": done.returncode, "error": (done.stderr or done.stdout)[-400:]}


def test_job(task, kind: str, what: str, source: str, workdir: Path) -> dict:
    sub = workdir / f"{task.path.parent.name}__{task.name}__{kind}.py"
    sub.write_text(source)
    t0 = time.monotonic()
    bare = bare_run(task.path, source, "test", timeout_s=task.test_timeout + 30)
    t1 = time.monotonic()
    doc = popkit_json(["test", str(sub), "--task", str(task.path)], task.test_timeout + 120)
    return {"set": task.path.parent.name, "task": task.name, "leaderboard": task.leaderboard, "kind": kind,
            "submission": what, "bare_passed": bare["_passed"], "bare_exit": bare["_exit"],
            "popkit_passed": doc.get("outcome") == "passed", "popkit_exit": doc.get("exit_code"),
            "popkit_outcome": doc.get("outcome"), "bare_s": round(t1 - t0, 1),
            "popkit_s": round(time.monotonic() - t1, 1), "popkit_why": why_not_passed(doc),
            "bare_why": "" if bare["_passed"] else bare.get("_stderr_tail", "")[-600:]}


# torch's out-of-memory message; its last line names the allocator setting, so a tail of it still matches.
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def needs_rerun_alone(result: dict) -> bool:
    """A job run beside others whose verdicts differ, or where either side ran out of GPU memory (the other
    jobs' memory, not the submission's): its verdict says nothing until it has run with the GPU to itself."""
    text = result.get("popkit_why", "") + result.get("bare_why", "")
    return result["bare_passed"] != result["popkit_passed"] or any(m in text for m in OUT_OF_MEMORY)


def why_not_passed(doc: dict) -> str:
    """What popkit said about a run that did not pass (its first failing mode's summary and output tail),
    kept so a disagreement with the bare eval can be explained after the machine is gone."""
    if doc.get("outcome") == "passed":
        return ""
    for run in doc.get("runs") or []:
        if run.get("outcome") != "passed":
            tail = (run.get("stderr") or run.get("stdout") or "")[-600:]
            return f"{run.get('summary', '')}\n{tail}".strip()
    return str(doc.get("error") or doc.get("message") or "")[-600:]


def bare_chain(task, source: str) -> dict:
    """The runner's ranked chain through the bare eval: test, then benchmark, then leaderboard, each only if the
    previous passed, each its own process; the last run's result (its `_mode` says which)."""
    for mode, timeout in (("test", task.test_timeout), ("benchmark", task.benchmark_timeout),
                          ("leaderboard", task.ranked_timeout)):
        result = bare_run(task.path, source, mode, timeout_s=timeout + 30)
        result["_mode"] = mode
        if not result["_passed"]:
            break
    return result


def leaderboard_job(task, what: str, source: str, workdir: Path, repeats: int = 1) -> dict:
    """The right submission's public score, the bare chain's against `popkit bench --leaderboard`'s, `repeats`
    times in alternating order (a GPU warmed by the run before favours neither side); medians compared."""
    sub = workdir / f"{task.name}__lb.py"
    sub.write_text(source)
    row = {"task": task.name, "leaderboard": task.leaderboard, "submission": what, "bare_scores_s": [],
           "popkit_scores_s": [], "bare_passed": True, "popkit_passed": True}

    def bare() -> None:
        result = bare_chain(task, source)
        row["bare_passed"] &= result["_passed"] and result["_mode"] == "leaderboard"
        row["bare_scores_s"].append(mean_score_s(result, task.ranking_by))
        row.setdefault("bare_means_ns", []).append(
            [result.get(f"benchmark.{i}.mean") for i in range(int(result.get("benchmark-count", 0) or 0))])

    def mine() -> None:
        doc = popkit_json(["bench", str(sub), "--task", str(task.path), "--leaderboard", "--secret-runs", "0"],
                          task.test_timeout + task.benchmark_timeout + task.ranked_timeout + 60)
        row["popkit_passed"] &= doc.get("outcome") == "passed"
        row["popkit_scores_s"].append(doc.get("score_public_s"))
        ranked = [r for r in doc.get("runs") or [] if r.get("mode") == "leaderboard" and not r.get("secret")]
        row.setdefault("popkit_means_ns", []).append(
            [b.get("mean_ns") for b in (ranked[-1].get("benchmarks") or [])] if ranked else [])

    for i in range(repeats):
        for step in ((bare, mine) if i % 2 == 0 else (mine, bare)):
            step()
    for side in ("bare", "popkit"):
        scores = [x for x in row[f"{side}_scores_s"] if x]
        row[f"{side}_score_s"] = statistics.median(scores) if scores else None
    return row


def markdown(doc: dict) -> str:
    tests = doc.get("tests", [])
    same = sum(r["bare_passed"] == r["popkit_passed"] for r in tests)
    lines = [f"Fidelity sweep on {doc.get('card', '?')}: {len(doc.get('runnable', []))} of {doc.get('total', '?')} "
             f"public tasks runnable here; test-mode verdicts identical in {same} of {len(tests)} runs.", "",
             "| set | task | submission | bare eval | popkit | same |", "|---|---|---|---|---|---|"]
    for r in tests:
        bare = "pass" if r["bare_passed"] else f"fail ({r['bare_exit']})"
        mine = "pass" if r["popkit_passed"] else f"{r['popkit_outcome']} ({r['popkit_exit']})"
        alone = " (run alone: out of memory or different beside other jobs)" if r.get("first_try") else ""
        lines.append(f"| {r['set']} | {r['task']} | {r['kind']}: {r['submission']}{alone} | {bare} | {mine} | "
                     f"{'yes' if r['bare_passed'] == r['popkit_passed'] else '**no**'} |")
    ranked = doc.get("leaderboard", [])
    if ranked:
        lines += ["", "| task | bare score (ranked chain) | popkit score | popkit / bare |", "|---|---|---|---|"]
        for r in ranked:
            b, p = r["bare_score_s"], r["popkit_score_s"]
            ratio = f"{p / b:.3f}" if b and p else "-"
            lines.append(f"| {r['task']} | {b * 1e6:.2f} µs | {p * 1e6:.2f} µs | {ratio} |" if b and p else
                         f"| {r['task']} | {b or '-'} | {p or '-'} | - |")
    skipped = doc.get("not_runnable", [])
    if skipped:
        lines += ["", "Not runnable here (popkit tasks --check):", ""]
        lines += [f"- {r['task']} ({r['leaderboard']}): {'; '.join(r['reasons'])}" for r in skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", type=Path, nargs="?", default=Path(".refk/problems"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--leaderboard", default=",".join(LEADERBOARD_SUBSET),
                        help="task names (directory or leaderboard) for the ranked comparison; empty for none")
    parser.add_argument("--budget-s", type=float, default=450.0)
    parser.add_argument("--only", default="",
                        help="comma-separated substrings of SET/TASK: run only the tasks that match one")
    parser.add_argument("--lb-repeats", type=int, default=1,
                        help="score pairs per --leaderboard task, in alternating order (medians compared)")
    parser.add_argument("--no-tests", action="store_true", help="skip the test-mode jobs (the --leaderboard half only)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if not args.problems.is_dir():
        print(f"{args.problems}: no problem-set checkout there", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    subs_dir = args.out / "submissions"
    subs_dir.mkdir(exist_ok=True)
    start = time.monotonic()
    checked = api.tasks(roots=[args.problems], check=True)
    wanted_tasks = [w.strip() for w in args.only.split(",") if w.strip()]
    pairs = [(t, v) for t, v in zip(checked.tasks, checked.verdicts) if not t.bundled
             and (not wanted_tasks or any(w in f"{t.path.parent.name}/{t.name}" for w in wanted_tasks))]
    tasks, verdicts = [t for t, _ in pairs], [v for _, v in pairs]
    card = "cpu"
    try:
        import torch

        card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    doc: dict = {"card": card, "total": len(tasks), "runnable": [], "tests": [], "leaderboard": [],
                 "not_runnable": [v.to_json() for v in verdicts if not v.runnable]}
    plan = []
    for task, verdict in zip(tasks, verdicts):
        if verdict.runnable:
            doc["runnable"].append(task.leaderboard or task.name)
            plan += [(task, kind, what, source) for kind, (what, source) in submissions_for(task).items()]
    lock = threading.Lock()

    def save() -> None:
        (args.out / "sweep.json").write_text(json.dumps(doc, indent=1, default=str))

    if args.dry_run:
        doc["plan"] = [[t.name, k, w] for t, k, w, _ in plan]
        save()
        print("\n".join(f"{t.name} {k}: {w}" for t, k, w, _ in plan))
        return 0

    def run(item) -> None:
        if time.monotonic() - start > args.budget_s:
            return
        result = test_job(*item, subs_dir)
        with lock:
            doc["tests"].append(result)
            save()
        print(f"{result['task']} {result['kind']}: bare {result['bare_passed']}, popkit {result['popkit_passed']}",
              flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(run, [] if args.no_tests else plan))
    if args.jobs > 1:  # one at a time, the GPU to itself: what sharing it may have changed
        for item in plan:
            task, kind = item[0], item[1]
            index = next((i for i, r in enumerate(doc["tests"]) if r["task"] == task.name and r["kind"] == kind
                          and r["set"] == task.path.parent.name), None)
            if index is None or not needs_rerun_alone(doc["tests"][index]) or time.monotonic() - start > args.budget_s:
                continue
            first = doc["tests"][index]
            again = test_job(*item, subs_dir)
            again["first_try"] = {k: first[k] for k in ("bare_passed", "bare_exit", "popkit_passed", "popkit_exit",
                                                        "popkit_outcome", "popkit_why", "bare_why")}
            doc["tests"][index] = again
            save()
            print(f"{task.name} {kind} alone: bare {again['bare_passed']}, popkit {again['popkit_passed']}", flush=True)
    wanted = {n for n in args.leaderboard.split(",") if n}
    for task, kind, what, source in plan:  # one at a time: timings need the GPU to themselves
        if kind == "right" and (task.name in wanted or task.leaderboard in wanted):
            if time.monotonic() - start > args.budget_s:
                break
            doc["leaderboard"].append(leaderboard_job(task, what, source, subs_dir, args.lb_repeats))
            save()
    doc["tests"].sort(key=lambda r: (r["set"], r["task"], r["kind"]))
    save()
    text = markdown(doc)
    (args.out / "sweep.md").write_text(text)
    print(text)
    return 0 if all(r["bare_passed"] == r["popkit_passed"] for r in doc["tests"]) else 1


if __name__ == "__main__":
    sys.exit(main())
