#!/usr/bin/env python3
"""Time to verdict: wall time of `popkit test` against the bare protocol run, warm build cache.

Run from the repository root on a machine with an NVIDIA GPU (no network needed):

    python3 scripts/gpu_inner_loop.py --out results/

The bare protocol run is the task's eval invoked directly in `test` mode with a result pipe, in a
folder holding the task's files, no pre-step (scripts/bare_eval.py, which does not use popkit). `popkit test FILE --task T --no-history --json` is the whole command as a user runs it
(start-up, working directory, pre-step decision, system probe, report). Per case: the bare run, then
`popkit test`, REPEATS times; the ratio is median over median. The verdicts of both must agree.

Cases: the bundled tasks with their PyTorch examples (nothing to build), bundled vectoradd with its
load_inline CUDA example (the build-cache path), and public tasks from a problem-set checkout
(`--problems`, default .refk/problems) with small PyTorch submissions written here (right and wrong
ones). A case whose task directory is missing is skipped and said so. Only a case that builds gets a
warm-up `popkit test` first (the cold build, and the pre-step's cache record); for the others the card
query at the start has already brought torch and the driver into the disk cache.

Writes OUT/inner.json (after every case, so a cut-off run keeps what it measured) and OUT/inner.md (the
table for docs/benchmarks.md, naming the card), and prints the markdown last. `--budget-s` stops starting
new cases after that many seconds. `--dry-run` writes the submissions and the plan without running
anything (works without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bare_eval import bare_run as bare_eval_run  # noqa: E402

from popkit import api  # noqa: E402

BUNDLED = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")

# Small PyTorch submissions for public tasks, written for this script (not copied from the sets).
SUBMISSIONS = {
    "grayscale": """
import torch

def custom_kernel(data):
    rgb, out = data
    out.copy_(rgb[..., 0] * 0.2989 + rgb[..., 1] * 0.5870 + rgb[..., 2] * 0.1140)
    return out
""",
    "vectoradd": """
import torch

def custom_kernel(data):
    a, b, out = data
    torch.add(a, b, out=out)
    return out
""",
    "matmul_wrong": """
import torch

def custom_kernel(data):
    a, b, _c = data
    return a @ b + 1  # wrong on purpose: every element off by one
""",
    "histogram_wrong": """
import torch

def custom_kernel(data):
    values, out = data
    out.zero_()  # wrong on purpose: no counts
    return out
""",
    "cholesky": """
import torch

def custom_kernel(data):
    return torch.linalg.cholesky(data)
""",
    "cholesky_wrong": """
import torch

def custom_kernel(data):
    return torch.tril(data)  # wrong on purpose: not a factor
""",
    "fp8_quant": """
import torch

def custom_kernel(data):
    x, x_q, x_s = data
    tokens, hidden = x.shape
    groups = x_s.shape[1]
    grouped = x.float().reshape(tokens, groups, hidden // groups)
    scale = grouped.abs().amax(dim=-1).clamp(min=1e-10) / 448.0
    x_q.copy_((grouped / scale.unsqueeze(-1)).clamp(-448.0, 448.0).reshape(tokens, hidden))
    x_s.copy_(scale)
    return x_q, x_s
""",
}

# (label, task directory relative to --problems, submission key, expected verdict)
PUBLIC = (
    ("grayscale_v2", "pmpp_v2/grayscale_py", "grayscale", "passed"),
    ("vectoradd_v2", "pmpp_v2/vectoradd_py", "vectoradd", "passed"),
    ("matmul_v2 (wrong kernel)", "pmpp_v2/matmul_py", "matmul_wrong", "failed"),
    ("histogram_v2 (wrong kernel)", "pmpp_v2/histogram_py", "histogram_wrong", "failed"),
    ("cholesky (linalg)", "linalg/cholesky_py", "cholesky", "passed"),
    ("cholesky (linalg, wrong kernel)", "linalg/cholesky_py", "cholesky_wrong", "failed"),
    ("fp8_quant (helion)", "helion/fp8_quant_py", "fp8_quant", "passed"),
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def plan(problems: Path, subs_dir: Path) -> list[dict]:
    """Every case to time: label, task (name or directory), submission file, expected verdict."""
    cases = [{"label": "vectoradd (bundled, load_inline CUDA)", "task": "vectoradd", "builds": True,
              "submission": str(ROOT / "submissions" / "vectoradd" / "cuda.py"), "expect": "passed"}]
    subs_dir.mkdir(parents=True, exist_ok=True)
    for label, rel, key, expect in PUBLIC:
        path = subs_dir / f"{key}.py"
        path.write_text(SUBMISSIONS[key].lstrip())
        cases.append({"label": label, "task": str(problems / rel), "submission": str(path), "expect": expect,
                      "missing": not (problems / rel / "task.yml").is_file()})
    cases += [{"label": f"{t} (bundled)", "task": t, "submission": str(ROOT / "submissions" / t / "pytorch.py"),
               "expect": "passed"} for t in BUNDLED]
    return cases


def popkit_test(case: dict) -> tuple[float, str, str, float]:
    """`popkit test` as a user runs it: (seconds, outcome, why the pre-step was skipped, seconds its children
    ran: the evals and the pre-step, from the report; the rest is popkit's own time)."""
    argv = [sys.executable, "-m", "popkit", "test", case["submission"], "--task", case["task"], "--no-history",
            "--json"]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=900)
    secs = time.monotonic() - start
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return secs, f"no report (exit {done.returncode}): {done.stderr.strip()[-300:]}", "", secs
    children = sum(r.get("duration_s") or 0.0 for r in doc.get("runs") or []) + (
        (doc.get("precompile") or {}).get("duration_s") or 0.0)
    return secs, doc.get("outcome", doc.get("message", "?")), doc.get("precompile_skipped") or (
        "ran" if doc.get("precompile") else ""), children


def bare_outcome(result: dict) -> str:
    """The bare run's verdict in popkit's words: passed, failed (the checker said so), timed_out, crashed."""
    if result["_exit"] == 114:
        return "timed_out"
    if result["_passed"]:
        return "passed"
    return "failed" if result["_exit"] in (0, 112) and result.get("check") == "fail" else "crashed"


def bare_run(case: dict, probe: bool = False) -> tuple[float, str, float]:
    """The task's eval in test mode with a result pipe, the task's files in a fresh folder, no pre-step: (seconds,
    outcome, seconds the system probe outlived the eval). With `probe`, popkit's system probe (`popkit tasks
    --check`: the probe, then each task's needs) starts beside the eval, as popkit starts its probe with the
    evals: what the probe costs the eval, and how long popkit would wait for it after."""
    task = api.task_show(case["task"]).task
    source = Path(case["submission"]).read_text()
    beside = None
    start = time.monotonic()
    if probe:
        beside = threading.Thread(target=api.tasks, kwargs={"check": True}, daemon=True)
        beside.start()
    result = bare_eval_run(task.path, source, "test", timeout_s=task.test_timeout)
    secs = time.monotonic() - start
    if beside is None:
        return secs, bare_outcome(result), 0.0
    beside.join()
    return secs, bare_outcome(result), time.monotonic() - start - secs


def measure(case: dict, repeats: int, probe_beside: bool = False) -> dict:
    row = {**case, "bare_s": [], "popkit_s": [], "bare_outcomes": [], "popkit_outcomes": [], "prestep": [],
           "own_s": []}
    if probe_beside:
        row.update(probe_beside_s=[], probe_after_s=[])
    if case.get("builds"):  # the cold build and the pre-step's cache record happen here, not in a timed pair
        row["warmup_s"], row["warmup_outcome"], _, _ = popkit_test(case)
    for i in range(repeats):
        def bare() -> None:
            secs, outcome, _ = bare_run(case)
            row["bare_s"].append(secs)
            row["bare_outcomes"].append(outcome)

        def mine() -> None:
            secs, outcome, prestep, children = popkit_test(case)
            row["popkit_s"].append(secs)
            row["popkit_outcomes"].append(outcome)
            row["prestep"].append(prestep)
            row["own_s"].append(secs - children)

        for step in ((bare, mine) if i % 2 == 0 else (mine, bare)):  # alternating: a drift favours neither
            step()
        if probe_beside:
            secs, _, after = bare_run(case, probe=True)
            row["probe_beside_s"].append(secs)
            row["probe_after_s"].append(after)
    row["ratio"] = statistics.median(row["popkit_s"]) / statistics.median(row["bare_s"])
    row.update(paired(row))
    row["verdicts_agree"] = set(row["bare_outcomes"]) == set(row["popkit_outcomes"])
    row["as_expected"] = set(row["popkit_outcomes"]) == {case["expect"]}
    return row


def paired(row: dict) -> dict:
    """Statistics of one case's pairs (each bare run with the popkit run next to it): their ratios, and of
    `pair_stats` the median of the ratios, the ratio of the sums and its evals over the bare ones; with the ratio
    that popkit's own time alone implies (median bare plus median own, over median bare), which the eval's
    scatter between processes does not blur."""
    pairs = list(zip(row["popkit_s"], row["bare_s"], row["own_s"]))
    stats = pair_stats(pairs)
    bare = statistics.median(row["bare_s"])
    return {"pair_ratios": [p / b for p, b, _ in pairs], "pair_ratio_median": stats["pair_ratio_median"],
            "sum_ratio": stats["sum_ratio"], "own_ratio": (bare + statistics.median(row["own_s"])) / bare,
            "eval_ratio": stats["eval_ratio"]}


def pair_stats(pairs: list[tuple[float, float, float]]) -> dict:
    """Of (popkit, bare, popkit's own) times: the sum ratio, the median of the pair ratios, popkit's median own
    time and its share of the bare time, and its evals (popkit less own) over the bare ones."""
    bare = sum(b for _, b, _ in pairs)
    return {"pairs": len(pairs), "sum_ratio": sum(p for p, _, _ in pairs) / bare,
            "pair_ratio_median": statistics.median(p / b for p, b, _ in pairs),
            "own_median_s": statistics.median(o for _, _, o in pairs), "own_share": sum(o for _, _, o in pairs) / bare,
            "eval_ratio": sum(p - o for p, _, o in pairs) / bare}


def card_name() -> str:
    code = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA GPU')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or "unknown"


def cli_startup() -> dict:
    """`python -X importtime -m popkit --help`: popkit's own imports, and whether torch is among them."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "popkit", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    total = 0
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+\s+\|\s+(\d+)\s+\|\s?(\S.*)$", line)
        if m and m.group(2).strip() == "popkit.cli":
            total = int(m.group(1))
    imports_torch = any(re.search(r"\|\s+torch$", line) for line in done.stderr.splitlines())
    return {"popkit_cli_import_us": total, "imports_torch": imports_torch}


TORCH_FACTS = """
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": "cpu", "arch": None, "gpu_count": 0,
       "memory": None}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    out.update(device=props.name, arch="sm_%d%d" % (major, minor), gpu_count=torch.cuda.device_count(),
               memory=props.total_memory)
print(json.dumps(out))
"""


def torch_facts() -> dict:
    """What torch itself says about this machine (the answer popkit's probe must give)."""
    done = subprocess.run([sys.executable, "-c", TORCH_FACTS], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": done.stderr.strip()[-300:]}


def probes() -> dict:
    """popkit's system probe (from the driver where it can; `popkit tasks --check` runs it) against torch's own
    answer: each one's answer and seconds."""
    out = {}
    for name, call in (("probe", lambda: dict(api.tasks(check=True).system)), ("torch", torch_facts)):
        start = time.monotonic()
        out[name] = call()
        out[name + "_s"] = round(time.monotonic() - start, 3)
    return out


def builds_toolkit() -> tuple[str | None, str]:
    """(the CUDA toolkit popkit's builds use, doctor's line saying so) when it is not torch's guess; else (None, "")."""
    for check in api.doctor().checks:
        fix = re.search(r"export CUDA_HOME=(\S+)$", check.fix or "")
        if check.name == "CUDA_HOME" and check.status == "info" and check.fix.startswith("only for builds") and fix:
            return fix.group(1), check.value
    return None, ""


def markdown(results: dict) -> str:
    lines = [f"Time to verdict on {results.get('card', '?')}, warm build cache, median of "
             f"{results.get('repeats', '?')} (`scripts/gpu_inner_loop.py`):", "",
             "| task | verdict (popkit / bare) | compile pre-step | bare test mode | popkit test | ratio | "
             "median of pair ratios | sum ratio | (bare + own) / bare | its evals / bare |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results.get("rows", []):
        if row.get("skipped"):
            lines.append(f"| {row['label']} | {row['skipped']} | | | | | | | | |")
            continue
        verdict = f"{row['popkit_outcomes'][0]} / {row['bare_outcomes'][0]}"
        if not row["verdicts_agree"]:
            verdict += " **(differ)**"
        if not row["as_expected"]:
            verdict += f" (expected {row['expect']})"
        prestep = "skipped: " + row["prestep"][-1] if row["prestep"][-1] not in ("", "ran") else (
            "ran" if row["prestep"][-1] == "ran" else "off")
        lines.append(f"| {row['label']} | {verdict} | {prestep} | {statistics.median(row['bare_s']):.2f} s | "
                     f"{statistics.median(row['popkit_s']):.2f} s | {row['ratio']:.2f} |"
                     + "".join(f" {row[k]:.2f} |" if k in row else " |" for k in
                               ("pair_ratio_median", "sum_ratio", "own_ratio", "eval_ratio")))
    lines += pooled_line(results.get("rows", []))
    lines += overhead_lines(results.get("rows", []))
    probe = results.get("probes")
    if probe:
        keys = ("device", "arch", "gpu_count", "memory", "torch", "cuda")
        same = [k for k in keys if probe["probe"].get(k) == probe["torch"].get(k)]
        lines += ["", f"System probe: {probe['probe_s']:.2f} s (popkit's) against {probe['torch_s']:.2f} s importing "
                      f"torch; same {', '.join(same) or 'nothing'}"
                      + "".join(f"; {k}: {probe['probe'].get(k)} / {probe['torch'].get(k)}"
                                for k in keys if k not in same) + "."]
    startup = results.get("cli_startup")
    if startup:
        lines += ["", f"CLI start-up: `python -X importtime -m popkit --help` imports popkit.cli in "
                      f"{startup['popkit_cli_import_us'] / 1000:.0f} ms; torch imported: "
                      f"{'yes' if startup['imports_torch'] else 'no'}."]
    return "\n".join(lines) + "\n"


def pooled(rows: list[dict], draws: int = 10000, seed: int = 1) -> dict | None:
    """Every pair of the timed rows together: `pair_stats`, with a 95% bootstrap interval over pairs (`low`,
    `high`) for the sum ratio. None without a timed pair."""
    pairs = [(p, b, o) for r in rows if not r.get("skipped")
             for p, b, o in zip(r.get("popkit_s", ()), r.get("bare_s", ()), r.get("own_s", ()))]
    if not pairs:
        return None
    pick = random.Random(seed)
    boots = sorted(pair_stats([pick.choice(pairs) for _ in pairs])["sum_ratio"] for _ in range(draws))
    return {**pair_stats(pairs), "low": boots[int(0.025 * draws)], "high": boots[int(0.975 * draws) - 1]}


def pooled_line(rows: list[dict]) -> list[str]:
    found = pooled(rows)
    if found is None:
        return []
    return ["", f"All {found['pairs']} pairs: popkit test took {found['sum_ratio']:.3f}x the bare eval (sum ratio, "
                f"95% bootstrap interval over pairs [{found['low']:.3f}, {found['high']:.3f}]; median of pair ratios "
                f"{found['pair_ratio_median']:.3f}); popkit's own time {found['own_median_s']:.2f} s (median), "
                f"{100 * found['own_share']:.1f}% of the bare time; its evals {found['eval_ratio']:.3f}x the bare "
                "ones."]


def overhead_lines(rows: list[dict]) -> list[str]:
    """Where popkit's time beyond the eval goes, per case: its own (wall less its children's run time), and with
    --probe-beside the bare eval with the system probe beside it, and how long the probe outlived the eval."""
    timed = [r for r in rows if r.get("own_s")]
    if not timed:
        return []
    probe = any(r.get("probe_beside_s") for r in timed)
    head = "| task | popkit's own time (wall less its evals) |" + (
        " bare test mode, probe beside | probe outlived the eval |" if probe else "")
    out = ["", head, "|---|---|" + ("---|---|" if probe else "")]
    for r in timed:
        line = f"| {r['label']} | {statistics.median(r['own_s']):.2f} s |"
        if probe:
            line += (f" {statistics.median(r['probe_beside_s']):.2f} s | {statistics.median(r['probe_after_s']):.2f} s |"
                     if r.get("probe_beside_s") else " | |")
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for inner.json and inner.md (required unless --pool)")
    parser.add_argument("--problems", type=Path, default=ROOT / ".refk" / "problems",
                        help="checkout of the public problem sets (default .refk/problems)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="bare/popkit pairs per case (default 1: about 5 minutes on an H100; 2 doubles it)")
    parser.add_argument("--only", default="", help="comma-separated substrings of case labels to run")
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no new case after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="write the submissions and the plan; run nothing")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="INNER_JSON",
                        help="print the pooled statistics of these inner.json files' pairs (with --out unused); "
                             "run nothing")
    parser.add_argument("--probe-beside", action="store_true",
                        help="also time each bare run with popkit's system probe beside it (one more eval per pair)")
    args = parser.parse_args(argv)
    if args.pool:
        rows = [row for path in args.pool for row in json.loads(path.read_text()).get("rows", [])]
        print("\n".join(pooled_line(rows)).strip() or "no timed pairs")
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.out is None:
        parser.error("--out is required")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    cases = plan(args.problems, out / "submissions")
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c["label"] for w in wanted)]
    results: dict = {"repeats": args.repeats, "rows": [], "plan": cases}

    def save() -> None:
        (out / "inner.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "inner.md").write_text(markdown(results))

    if args.dry_run:
        results["card"] = "dry run"
        save()
        for case in cases:
            log(f"would time {case['label']}: {case['submission']} on {case['task']}"
                + (" (task missing: skipped)" if case.get("missing") else ""))
        print(markdown(results))
        return 0
    # popkit test gives builds the toolkit it found as CUDA_HOME when torch's guess cannot build; the bare run
    # must build with the same one, or each would see the other's build.ninja as changed and rebuild.
    home, said = builds_toolkit()
    if home:
        os.environ["CUDA_HOME"] = home
        log(said)
    results["cuda_home"] = os.environ.get("CUDA_HOME")
    results["card"] = card_name()  # also the warm-up: torch and the CUDA driver come from the disk once
    results["cli_startup"] = cli_startup()
    results["probes"] = probes()
    save()
    started = time.monotonic()
    for case in cases:
        if case.get("missing"):
            results["rows"].append({**case, "skipped": f"task not found under {args.problems}"})
        elif time.monotonic() - started > args.budget_s:
            results["rows"].append({**case, "skipped": f"not run: past the {args.budget_s:g} s budget"})
        else:
            log(f"timing {case['label']}")
            row = measure(case, args.repeats, args.probe_beside)
            results["rows"].append(row)
            log(f"{case['label']}: bare {statistics.median(row['bare_s']):.2f} s, popkit "
                f"{statistics.median(row['popkit_s']):.2f} s, ratio {row['ratio']:.2f}, verdicts "
                f"{row['popkit_outcomes'][0]} / {row['bare_outcomes'][0]}")
        save()
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
