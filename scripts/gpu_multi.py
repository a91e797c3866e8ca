#!/usr/bin/env python3
"""Multi-GPU tasks on a 2- or 4-GPU NVIDIA machine: popkit's verdict against the bare eval's, same world size.

Run from the repository root (kind nvidia-h100-x2 or nvidia-h100-x4; about 3-4 minutes):

    python3 scripts/gpu_multi.py --out OUTDIR [--problems .refk/problems] [--world-size W] [--cases K]

The amd_distributed tasks (all2all, gemm-rs, ag-gemm) ask for world_size 8. On a smaller machine popkit runs
them with `--world-size W` (default: the GPU count, at most 4), marked not leaderboard-faithful; the bare
eval gets the same cases with world_size W and POPCORN_GPUS set (scripts/bare_eval.py). Each task runs
its first K test cases (default 2; a copy of the set with the shorter list, so both sides see the same
cases) with a correct PyTorch submission written here, and gemm-rs also with a wrong one. The verdicts
must agree; the wrong one must fail in both.

Writes OUTDIR/multi.json (after every run) and OUTDIR/multi.md (the table for docs/benchmarks.md, naming
the card), and prints the markdown. `--dry-run` writes the submissions and the plan only (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bare_eval import bare_run  # noqa: E402

TASKS = ("all2all", "gemm-rs", "ag-gemm")

# Submissions written for this script (not copied from the sets).
SUBMISSIONS = {
    ("gemm-rs", "right"): '''
import torch
import torch.distributed as dist


def custom_kernel(data):
    # every rank: its partial product plus the bias; the sum over ranks, then this rank's rows
    x, weight, bias = data
    out = x @ weight.T
    if bias is not None:
        out = out + bias
    dist.all_reduce(out)
    rows = out.shape[0] // dist.get_world_size()
    rank = dist.get_rank()
    return out[rank * rows:(rank + 1) * rows].contiguous()
''',
    ("gemm-rs", "wrong"): '''
import torch
import torch.distributed as dist


def custom_kernel(data):
    # wrong on purpose: no reduction over ranks (only this rank's partial product)
    x, weight, bias = data
    out = x @ weight.T
    rows = out.shape[0] // dist.get_world_size()
    rank = dist.get_rank()
    return out[rank * rows:(rank + 1) * rows].contiguous()
''',
    ("ag-gemm", "right"): '''
import torch
import torch.distributed as dist


def custom_kernel(data):
    x, weight, bias = data
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    out = torch.cat(parts) @ weight.T
    return out + bias if bias is not None else out
''',
    ("all2all", "right"): '''
# The reference's own dispatch and combine (a PyTorch all-to-all through torch.distributed).
from reference import ref_kernel


def custom_kernel(data):
    return ref_kernel(data)
''',
}


def shortened_copy(problems: Path, dest: Path, cases: int) -> Path:
    """A copy of the amd_distributed set whose tasks keep only their first `cases` tests."""
    root = dest / "amd_distributed"
    shutil.copytree(problems / "amd_distributed", root)
    for name in TASKS:
        yml = root / name / "task.yml"
        spec = yaml.safe_load(yml.read_text())
        spec["tests"] = spec.get("tests", [])[:cases]
        yml.write_text(yaml.safe_dump(spec, sort_keys=False))
    return root


def popkit_verdict(sub: Path, task_dir: Path, world_size: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "popkit", "test", str(sub), "--task", str(task_dir), "--world-size",
                           str(world_size), "--json", "--no-history", "--no-precompile"],
                          capture_output=True, text=True, timeout=600)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return {"passed": False, "exit": done.returncode, "error": (done.stderr or done.stdout)[-500:]}
    return {"passed": doc.get("outcome") == "passed", "exit": done.returncode,
            "faithful": doc.get("leaderboard_faithful"), "summary": (doc.get("message") or "")[:200]}


def markdown(results: list[dict], card: str, gpus: int, world_size: int) -> str:
    lines = [f"Multi-GPU tasks on {gpus}× {card}: `popkit test --world-size {world_size}` against the bare eval "
             f"at world_size {world_size} (the tasks ask for 8; scaled down, marked not leaderboard-faithful).", "",
             "| task | submission | bare eval | popkit | same verdict | popkit s | bare s |", "|---|---|---|---|---|---|---|"]
    for r in results:
        bare = "pass" if r["bare"]["_passed"] else f"fail (exit {r['bare']['_exit']})"
        mine = "pass" if r["popkit"]["passed"] else f"fail (exit {r['popkit']['exit']})"
        same = "yes" if r["bare"]["_passed"] == r["popkit"]["passed"] else "**no**"
        lines.append(f"| {r['task']} | {r['kind']} | {bare} | {mine} | {same} | {r['popkit_s']:.1f} | {r['bare_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=Path, default=Path(".refk/problems"))
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--cases", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    subs = args.out / "submissions"
    subs.mkdir(exist_ok=True)
    plan = []
    for (task, kind), source in SUBMISSIONS.items():
        path = subs / f"{task}_{kind}.py"
        path.write_text(source.lstrip())
        plan.append((task, kind, path))
    if args.dry_run:
        (args.out / "multi.json").write_text(json.dumps({"plan": [[t, k, str(p)] for t, k, p in plan]}, indent=1))
        print("\n".join(f"{t} {k}: {p}" for t, k, p in plan))
        return 0
    import torch

    gpus = torch.cuda.device_count()
    card = torch.cuda.get_device_name() if gpus else "no GPU"
    world = args.world_size or min(gpus, 4)
    if gpus < 2 or world > gpus:
        print(f"needs at least 2 GPUs and world_size <= GPU count (GPUs: {gpus}, world_size: {world})",
              file=sys.stderr)
        return 11
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = shortened_copy(args.problems, Path(tmp), args.cases)
        for task, kind, path in plan:
            task_dir = root / task
            cases = [{**c, "world_size": world} for c in yaml.safe_load((task_dir / "task.yml").read_text())["tests"]]
            t0 = time.monotonic()
            bare = bare_run(task_dir, path.read_text(), "test", cases, gpus=gpus)
            t1 = time.monotonic()
            mine = popkit_verdict(path, task_dir, world)
            t2 = time.monotonic()
            results.append({"task": task, "kind": kind, "bare": bare, "popkit": mine, "bare_s": t1 - t0,
                            "popkit_s": t2 - t1})
            print(f"{task} {kind}: bare {'pass' if bare['_passed'] else 'fail'}, "
                  f"popkit {'pass' if mine['passed'] else 'fail'}", flush=True)
            (args.out / "multi.json").write_text(json.dumps(
                {"card": card, "gpus": gpus, "world_size": world, "results": results}, indent=1, default=str))
    text = markdown(results, card, gpus, world)
    (args.out / "multi.md").write_text(text)
    print(text)
    agree = all(r["bare"]["_passed"] == r["popkit"]["passed"] for r in results)
    expected = all(r["popkit"]["passed"] == (r["kind"] == "right") for r in results)
    return 0 if agree and expected else 1


if __name__ == "__main__":
    sys.exit(main())
