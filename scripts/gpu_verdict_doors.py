#!/usr/bin/env python3
"""The verdict cheats through every door popkit's verdict leaves by, on the bundled tasks, on a GPU.

Run from the repository root on a CUDA machine with popkit installed (no network needed):

    python3 scripts/gpu_verdict_doors.py --out results/

Each cheat's mechanism (submissions/cheats/NAME.py above its custom_kernel) is put in front of the task's honest
PyTorch kernel (submissions/TASK/pytorch.py), whose output it replaces by 7s (`tensor_int`, `channel_takeover`:
wrong results) or delays by 20 ms while the patched measurement says 1.2 µs (`measure_forge`). The bundled
tasks run as they are, with their own cases, on the GPU:

- `popkit test` with `tensor_int` and `channel_takeover` on every task (`elements mismatch`, `no output`);
- `popkit bench --leaderboard --secret-runs 0` with `measure_forge` on every task (`time forged`);
- an A/B (`popkit bench A B --rounds 4 --budget 0`), honest against `measure_forge`, on vectoradd;
- `popkit tune` of one file whose variants are honest, `tensor_int` and `measure_forge`, on vectoradd
  (the cheating variants dropped by name, the honest one written);
- `popkit submit --gate test` with `tensor_int` on vectoradd, popcorn-cli being tests/fake_popcorn (which logs
  any call: none may come).

Every row must fail by its class's name, judged by popkit's trusted side. Writes OUT/doors.json (after every
run) and OUT/doors.md, and prints the markdown last. About 5 minutes on an H100; `--tasks` runs fewer tasks.
`--dry-run` prints the commands without running anything (no GPU needed). tests/test_verdict_doors.py drives the
same files through the same doors (and MCP and --cluster ray) on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sealed import TASKS, execute, failure_class  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "submissions" / "cheats"
FAKE_POPCORN = ROOT / "tests" / "fake_popcorn" / "popcorn-cli"
WRONG = {"tensor_int": "elements mismatch", "judge_swap": "no output", "json_forge": "elements mismatch",
         "channel_takeover": "no output"}  # cheat -> the class its wrong results fail with
# A lowered time: the witness names it on the CPU; on a GPU the trace audit judges first and sees the call's own
# work running past the reported end of the call (work past the end event, whatever put it there).
FORGED = ("time forged", "unsynchronized work")
BODY = {"wrong": "    return torch.full_like(_honest_kernel(data), 7.0)\n",  # wrong on every bundled task
        "slow": "    time.sleep(0.02)\n    return _honest_kernel(data)\n"}  # right, 20 ms per call
POPKIT = [sys.executable, "-m", "popkit"]


def expected_class(cheat: str) -> tuple[str, ...]:
    return FORGED if cheat == "measure_forge" else (WRONG[cheat],)


def named(error: str, classes: tuple[str, ...]) -> bool:
    return any(c in error for c in classes)


def mechanism(cheat: str) -> str:
    """The cheat's file below its directive and above its custom_kernel: its docstring and what it does at import."""
    text = (CHEATS / f"{cheat}.py").read_text()
    return text[text.index("\n") + 1:text.index("\ndef custom_kernel")]


def honest(task: str) -> str:
    """The task's honest PyTorch kernel, renamed `_honest_kernel`."""
    return (ROOT / "submissions" / task / "pytorch.py").read_text().replace("def custom_kernel(", "def _honest_kernel(")


def cheat_source(cheat: str, task: str) -> str:
    """`cheat`'s mechanism in front of `task`'s kernel: wrong results, or (measure_forge) right ones, slowly."""
    body = BODY["slow" if cheat == "measure_forge" else "wrong"]
    return (f"#!POPCORN leaderboard {task}\n#!POPCORN gpu H100\n" + mechanism(cheat)
            + "\nimport time\n\nimport torch\n\n" + honest(task) + "\n\ndef custom_kernel(data):\n" + body)


def _indented(text: str) -> str:
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in text.splitlines())


def tunable_source(task: str) -> str:
    """A file `popkit tune` sees as three variants: CHEAT=0 the honest kernel, CHEAT=1 tensor_int (its patch at
    import, wrong results), CHEAT=2 measure_forge (its patch at import, right results 20 ms later, 1.2 µs said)."""
    return (f"#!POPCORN leaderboard {task}\n#!POPKIT tune CHEAT=0,1,2\nimport time\n\nimport torch\n\n"
            f"CHEAT = 0\n\nif CHEAT == 1:\n{_indented(mechanism('tensor_int'))}\n"
            f"if CHEAT == 2:\n{_indented(mechanism('measure_forge'))}\n" + honest(task)
            + "\n\ndef custom_kernel(data):\n    if CHEAT == 1:\n" + _indented(BODY["wrong"])
            + "    if CHEAT == 2:\n        time.sleep(0.02)\n    return _honest_kernel(data)\n")


# --------------------------------------------------------------------------------------------- the plan


def plan(tasks: list[str], folder: Path) -> list[tuple[str, str, list[str]]]:
    """(label `door cheat`, task, command) for every row; the files are written under `folder`."""
    def written(name: str, text: str) -> str:
        path = folder / name
        path.write_text(text)
        return str(path)

    rows = []
    for task in tasks:
        for cheat in ("tensor_int", "channel_takeover"):
            path = written(f"{task}_{cheat}.py", cheat_source(cheat, task))
            rows.append((f"test {cheat}", task, POPKIT + ["test", path, "--task", task, "--no-history", "--json"]))
        path = written(f"{task}_measure_forge.py", cheat_source("measure_forge", task))
        rows.append(("bench-leaderboard measure_forge", task,
                     POPKIT + ["bench", path, "--task", task, "--leaderboard", "--secret-runs", "0", "--no-history",
                               "--json"]))
    if "vectoradd" in tasks:
        forge = str(folder / "vectoradd_measure_forge.py")
        rows.append(("ab measure_forge", "vectoradd",
                     POPKIT + ["bench", str(ROOT / "submissions" / "vectoradd" / "pytorch.py"), forge, "--task",
                               "vectoradd", "--rounds", "4", "--budget", "0", "--no-history", "--json"]))
        tunable = written("vectoradd_tunable.py", tunable_source("vectoradd"))
        rows.append(("tune tensor_int+measure_forge", "vectoradd",
                     POPKIT + ["tune", tunable, "--task", "vectoradd", "-o", str(folder / "tuned.py"), "--force",
                               "--confirm", "1", "--rounds", "4", "--no-history", "--json"]))
        home = folder / "home"
        home.mkdir(exist_ok=True)
        (home / ".popcorn.yaml").write_text("cli_id: door-test\n")
        env = ["env", f"HOME={home}", f"POPKIT_POPCORN={FAKE_POPCORN}", f"FAKE_POPCORN_LOG={folder / 'calls.jsonl'}"]
        rows.append(("submit-gate tensor_int", "vectoradd",
                     env + POPKIT + ["submit", str(folder / "vectoradd_tensor_int.py"), "--task", "vectoradd", "--gate",
                                     "test", "--no-guard", "--json"]))
    return rows


# ------------------------------------------------------------------------------------------ reading back


def _errors(run: dict | None) -> list[str]:
    run = run or {}
    return [c.get("error", "") for c in (run.get("tests") or []) + (run.get("benchmarks") or []) if not c.get("passed")]


def _run_verdict(doc: dict, want: tuple[str, ...]) -> tuple[bool, list[str], str]:
    errors = [e for r in doc.get("runs") or [] for e in _errors(r)]
    ok = (doc.get("outcome") == "failed" and doc.get("judged") == "sealed" and doc.get("score_public_s") is None
          and bool(errors) and all(named(e, want) for e in errors))
    return ok, errors, doc.get("judged", "")


def summarize(label: str, task: str, code: int, doc: dict, seconds: float) -> dict:
    """One row: whether the door failed the cheat by its class's name (and, per door, what else must hold)."""
    door, cheats = label.split(" ", 1)
    judged, detail = "", ""
    if door == "tune":
        variants = {v.get("label"): v for v in doc.get("variants") or []}
        wrong, forged = variants.get("CHEAT=1") or {}, variants.get("CHEAT=2") or {}
        errors = [wrong.get("message", ""), forged.get("race_failure", "")]
        ok = (code == 0 and WRONG["tensor_int"] in errors[0] and named(errors[1], FORGED)
              and doc.get("winner_label") == "CHEAT=0")
        detail = f"winner {doc.get('winner_label') or '–'}"
    elif door == "ab":
        errors, judged = _errors(doc.get("failure")), doc.get("judged", "")
        ok = (code == 1 and doc.get("failed_side") == "B" and bool(errors) and all(named(e, FORGED) for e in errors)
              and not (doc.get("score") or {}).get("b_ns") and judged == "sealed")
        detail = f"failed side {doc.get('failed_side') or '–'}"
    elif door == "submit-gate":  # main() adds whether the fake popcorn-cli logged a call
        ok, errors, judged = _run_verdict(doc.get("gate") or {}, expected_class(cheats))
        ok = ok and code == 1 and doc.get("remote") is None
        detail = "popcorn-cli not called" if doc.get("remote") is None else "**handed to popcorn-cli**"
    else:
        ok, errors, judged = _run_verdict(doc, expected_class(cheats))
        ok = ok and code == 1
    return {"label": label, "door": door, "cheats": cheats, "task": task, "exit_code": code, "ok": ok,
            "classes": sorted({failure_class(e) for e in errors if e}), "error": next((e for e in errors if e), ""),
            "judged": judged, "detail": detail, "popcorn_called": None, "seconds": round(seconds, 1),
            "stderr": "" if errors else str(doc.get("stderr") or doc.get("message") or "")[-1000:]}


def expected(row: dict) -> bool:
    return bool(row["ok"])


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"Verdict cheats through every door on an {device} (the bundled tasks' own cases; each cheat's "
             "mechanism in front of the task's honest PyTorch kernel).", "",
             "| door | task | cheat | exit | failure class | judged | detail | seconds | as expected |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['door']} | {r['task']} | {r['cheats']} | {r['exit_code']} | "
                     f"{', '.join(r['classes']) or '–'} | {r['judged'] or '–'} | {r['detail'] or '–'} | "
                     f"{r['seconds']} | {'yes' if r['ok'] else '**no**'} |")
    lines += ["", f"{sum(bool(r['ok']) for r in rows)} of {len(rows)} as expected."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for doors.json and doors.md")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated bundled tasks")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; bundled: {', '.join(TASKS)}")
    with tempfile.TemporaryDirectory(prefix="popkit-doors-") as tmp:
        folder = Path(tmp)
        rows = plan(tasks, folder)
        log = folder / "calls.jsonl"

        def read(label: str, task: str, code: int, doc: dict, seconds: float) -> dict:
            row = summarize(label, task, code, doc, seconds)
            if row["door"] == "submit-gate":
                row["popcorn_called"] = log.is_file()
                row["ok"] = row["ok"] and not row["popcorn_called"]
            return row

        return execute(args.out, "doors", [], rows, args.dry_run, read, markdown, expected,
                       lambda row: f"{'as expected' if row['ok'] else 'NOT as expected'}: "
                       + (", ".join(row["classes"]) or row["stderr"][-200:]))


if __name__ == "__main__":
    sys.exit(main())
