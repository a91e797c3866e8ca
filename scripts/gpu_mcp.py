#!/usr/bin/env python3
"""The agent loop through `popkit mcp` on a GPU, against the CLI's verdicts and scores.

Run from the repository root on a CUDA machine with popkit and the MCP SDK importable (no network needed):

    python3 scripts/gpu_mcp.py --out OUTDIR [--tasks vectoradd,softmax] [--pairs 2]

It starts `popkit mcp` (a fresh history under OUTDIR/home, temporary files under OUTDIR/tmp) and drives it
with the MCP SDK's stdio client, as an agent host does. Per bundled task, on its CUDA example
(submissions/<task>/cuda.py):
  1. `new` (a starting file from the task's template) and `check` of the example;
  2. `compile` (warms the build cache), then `test`, and the CLI's `popkit test --json`: the verdicts must
     agree and the documents be equal but for timestamps and durations;
  3. `bench` with leaderboard=true (public chain, no secret run) and the CLI's `popkit bench --leaderboard
     --secret-runs 0 --json`, --pairs pairs in alternating order: the median public scores must be within
     SCORE_TOLERANCE of each other;
  4. `bench` A/B of the example against its own text passed as `source_b` (byte-identical): the score's
     verdict must not name a winner;
then `history` (every run above is in it), and a cancelled `bench --leaderboard` of the first task: no
process of the run may be left after STOP_LIMIT_S, no folder in OUTDIR/tmp, and the next call must work.

About 3 minutes on an H100 with both tasks (a cold build adds about a minute per task). Writes
OUTDIR/gpu_mcp.json (after every step, so a cut-off run keeps what it measured) and OUTDIR/gpu_mcp.md,
and prints the markdown last; exit 0 when every check passed. `--dry-run` runs the same loop on the CPU
against the fixture task tests/fixtures/tasks/double (seconds, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
TASKS = ("vectoradd", "softmax")
SCORE_TOLERANCE = 0.03  # popkit's run-to-run spread is 0.73% (docs/benchmarks.md); MCP adds a process, no timing
STOP_LIMIT_S = 30.0
VOLATILE = {"started_at", "created_at", "duration_s", "eval_s"}
# Whichever of the two runs comes first builds the extension (popkit compile builds in a folder of its own), so the
# build's output and the pre-step's decision differ with the order, not with MCP or the CLI.
BUILD_OUTPUT = {"precompile", "precompile_skipped", "stdout", "stderr"}
WINNERS = ("a_faster", "b_faster")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def steady(doc):
    """`doc` without what differs from one run to the next: timestamps, durations, the build's output."""
    if isinstance(doc, dict):
        return {k: steady(v) for k, v in doc.items() if k not in VOLATILE | BUILD_OUTPUT}
    if isinstance(doc, list):
        return [steady(v) for v in doc]
    return doc


def plan(dry_run: bool, tasks: tuple[str, ...]) -> list[dict]:
    if dry_run:
        return [{"label": "double (fixture, dry run)", "task": str(FIX / "tasks" / "double"), "new_task": "vectoradd",
                 "submission": str(FIX / "submissions" / "good.py"), "slow": str(FIX / "submissions" / "slow.py")}]
    return [{"label": t, "task": t, "new_task": t, "submission": str(ROOT / "submissions" / t / "cuda.py"),
             "slow": str(ROOT / "submissions" / t / "cuda.py")} for t in tasks]


def cli_json(env: dict, *args: str) -> tuple[int, dict, float]:
    """`popkit ARGS --json` in a process of its own: (exit code, document, seconds)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "popkit", *args, "--json"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL, timeout=600)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = {"unparsed_stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:]}
    return done.returncode, doc, time.monotonic() - start


def ours(tmp: Path) -> list[str]:
    """Processes of this run: a worker or an eval, anything whose command line or folder is in `tmp`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            cwd = os.readlink(entry / "cwd") if os.access(entry / "cwd", os.R_OK) else ""
        except OSError:
            continue
        if str(tmp) in argv or cwd.startswith(str(tmp)):
            found.append(f"{entry.name}: {argv[:200]}")
    return found


class Client:
    """One MCP session: `call` returns {doc, error, exit_code, steps, seconds} and keeps it in the results."""

    def __init__(self, session, results: dict, save):
        self.session, self.results, self.save = session, results, save

    async def call(self, key: str, tool: str, **arguments) -> dict:
        steps: list[str] = []

        async def seen(_step, _total, message):
            steps.append(message)

        start = time.monotonic()
        result = await self.session.call_tool(tool, arguments, progress_callback=seen)
        entry = {"tool": tool, "doc": result.structured_content, "error": result.is_error,
                 "exit_code": (result.meta or {}).get("popkit/exit_code"), "steps": len(steps),
                 "seconds": round(time.monotonic() - start, 2)}
        self.results.setdefault("calls", {})[key] = entry
        self.save()
        log(f"{key}: {tool} -> exit {entry['exit_code']}{' (tool error)' if entry['error'] else ''}, "
            f"{entry['seconds']} s, {len(steps)} progress notes")
        return entry


def score(doc: dict | None) -> float | None:
    return (doc or {}).get("score_public_s")


async def run_task(client: Client, case: dict, env: dict, pairs: int, out: Path) -> dict:
    key, sub, task = case["label"], case["submission"], case["task"]
    row: dict = {"label": key}
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    new = await client.call(f"{key}: new", "new", task=case["new_task"], output=str(work / f"{case['new_task']}.py"),
                            force=True)
    row["new_ok"] = not new["error"]
    check = await client.call(f"{key}: check", "check", submission=sub)
    row["check_ok"] = check["exit_code"] == 0
    built = await client.call(f"{key}: compile", "compile", submission=sub, task=task)
    row["compile"] = (built["doc"] or {}).get("status")
    test = await client.call(f"{key}: test", "test", submission=sub, task=task, harness="task")  # the CLI's harness
    code, cli_test, _ = cli_json(env, "test", sub, "--task", task)
    row["test"] = [(test["doc"] or {}).get("outcome"), cli_test.get("outcome")]
    row["test_exit"] = [test["exit_code"], code]
    row["documents_equal"] = steady(test["doc"]) == steady(cli_test)
    row["mcp_scores_s"], row["cli_scores_s"] = [], []
    for i in range(pairs):  # alternating order: a drift favours neither side
        for side in (("mcp", "cli") if i % 2 == 0 else ("cli", "mcp")):
            if side == "mcp":
                bench = await client.call(f"{key}: bench {i}", "bench", submission=sub, task=task, leaderboard=True,
                                          secret_runs=0, harness="task")
                row["mcp_scores_s"].append(score(bench["doc"]))
            else:
                _, doc, _ = cli_json(env, "bench", sub, "--task", task, "--leaderboard", "--secret-runs", "0")
                row["cli_scores_s"].append(score(doc))
    mine, theirs = [s for s in row["mcp_scores_s"] if s], [s for s in row["cli_scores_s"] if s]
    row["score_ratio"] = statistics.median(mine) / statistics.median(theirs) if mine and theirs else None
    ab = await client.call(f"{key}: A/B", "bench", submission=sub, source_b=Path(sub).read_text(), task=task,
                           harness="task")
    row["ab_verdict"] = ((ab["doc"] or {}).get("score") or {}).get("verdict")
    row["ab_rounds"] = (ab["doc"] or {}).get("rounds")
    row["ok"] = bool(row["new_ok"] and row["check_ok"] and row["test"] == ["passed", "passed"]
                     and row["documents_equal"] and row["score_ratio"] is not None
                     and abs(row["score_ratio"] - 1) <= SCORE_TOLERANCE and row["ab_verdict"] not in WINNERS)
    return row


async def cancel_run(client: Client, case: dict, tmp: Path) -> dict:
    """A bench --leaderboard cancelled while its eval runs: what is left of it, and whether the server goes on."""
    import anyio

    running = anyio.Event()
    outcome: dict = {}

    async def seen(_step, _total, message):
        if message.split(" · ")[0] in ("test", "benchmark", "leaderboard") and " · " in message:
            running.set()  # a mode's eval is running (its live line)

    async with anyio.create_task_group() as group:
        async def bench():
            await client.session.call_tool("bench", {"submission": case["slow"], "task": case["task"],
                                                     "harness": "task", "leaderboard": True, "secret_runs": 0},
                                           progress_callback=seen)
            outcome["finished_before_cancel"] = True

        group.start_soon(bench)
        with anyio.move_on_after(300):
            await running.wait()
        outcome["running_processes"] = len(ours(tmp))
        group.cancel_scope.cancel()
    start = time.monotonic()
    while ours(tmp) and time.monotonic() - start < STOP_LIMIT_S:
        await anyio.sleep(0.2)
    outcome["stopped_s"] = round(time.monotonic() - start, 2)
    outcome["left_processes"] = ours(tmp)
    outcome["left_folders"] = sorted(p.name for p in tmp.iterdir())
    after = await client.call("after the cancel: tasks", "tasks")
    outcome["next_call_ok"] = not after["error"]
    outcome["ok"] = (not outcome.get("finished_before_cancel") and outcome["running_processes"] > 0
                     and not outcome["left_processes"] and not outcome["left_folders"] and outcome["next_call_ok"])
    return outcome


async def drive(results: dict, cases: list[dict], env: dict, pairs: int, out: Path, save) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "popkit", "mcp"], env=env, cwd=str(ROOT))
    with open(out / "server.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                client = Client(session, results, save)
                results["tools"] = [t.name for t in (await session.list_tools()).tools]
                for case in cases:
                    log(f"loop on {case['label']}")
                    results["rows"].append(await run_task(client, case, env, pairs, out))
                    save()
                history = await client.call("history", "history", limit=100)
                results["history_runs"] = len((history["doc"] or {}).get("runs", []))
                log("a cancelled bench")
                results["cancel"] = await cancel_run(client, cases[0], Path(env["TMPDIR"]))
                save()


def markdown(results: dict) -> str:
    lines = [f"popkit mcp on {results.get('card', '?')}, {results.get('started', '')[:10]} (`scripts/gpu_mcp.py`): "
             f"{len(results.get('tools', []))} tools listed.", "",
             "| task | test (MCP / CLI) | documents equal | score MCP | score CLI | ratio | A/B of identical copies |",
             "|---|---|---|---|---|---|---|"]
    for row in results.get("rows", []):
        mine = [s for s in row.get("mcp_scores_s", []) if s]
        theirs = [s for s in row.get("cli_scores_s", []) if s]
        us = (lambda xs: f"{statistics.median(xs) * 1e6:.2f} µs" if xs else "-")
        ratio = f"{row['score_ratio']:.4f}" if row.get("score_ratio") else "-"
        lines.append(f"| {row['label']} | {' / '.join(str(v) for v in row.get('test', []))} | "
                     f"{'yes' if row.get('documents_equal') else '**no**'} | {us(mine)} | {us(theirs)} | {ratio} | "
                     f"{row.get('ab_verdict')} ({row.get('ab_rounds')} rounds) |")
    cancel = results.get("cancel")
    if cancel:
        lines += ["", f"Cancelled `bench --leaderboard` while its eval ran ({cancel.get('running_processes')} "
                      f"processes): gone in {cancel.get('stopped_s')} s, {len(cancel.get('left_processes', []))} "
                      f"processes and {len(cancel.get('left_folders', []))} folders left; next call "
                      f"{'answered' if cancel.get('next_call_ok') else '**failed**'}."]
    lines += ["", f"History: {results.get('history_runs', '?')} runs recorded. Checks: "
                  f"{'PASS' if results.get('ok') else '**FAIL**'} (verdicts and documents equal, scores within "
                  f"{SCORE_TOLERANCE:.0%}, no winner between identical files, a clean cancel)."]
    return "\n".join(lines) + "\n"


def card_name(dry_run: bool) -> str:
    if dry_run:
        return "cpu (dry run)"
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name() "
                           "if torch.cuda.is_available() else 'no CUDA GPU')"], capture_output=True, text=True,
                          timeout=120)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_mcp.json and gpu_mcp.md")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated bundled tasks with a cuda.py")
    parser.add_argument("--pairs", type=int, default=2, help="MCP/CLI score pairs per task (alternating order)")
    parser.add_argument("--dry-run", action="store_true", help="the same loop on the CPU, on a fixture task")
    args = parser.parse_args(argv)
    tasks = tuple(t for t in args.tasks.split(",") if t)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        parser.error(f"--tasks: choose from {', '.join(TASKS)}")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for fresh in ("home", "tmp"):
        shutil.rmtree(out / fresh, ignore_errors=True)
        (out / fresh).mkdir()
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           "POPKIT_HOME": str(out / "home"), "TMPDIR": str(out / "tmp")}
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "card": card_name(args.dry_run), "rows": [],
                     "dry_run": args.dry_run}

    def save() -> None:
        (out / "gpu_mcp.json").write_text(json.dumps(results, indent=1, default=str))

    import anyio

    anyio.run(drive, results, plan(args.dry_run, tasks), env, args.pairs, out, save)
    results["ok"] = bool(results["rows"]) and all(r["ok"] for r in results["rows"]) and results["cancel"]["ok"]
    save()
    text = markdown(results)
    (out / "gpu_mcp.md").write_text(text)
    print(text)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
