#!/usr/bin/env python3
"""The CUDA templates on a GPU: the softmax template against a device copy, the matmul template against the example.

Run from the repository root on an NVIDIA machine with popkit importable (no network needed):

    python3 scripts/gpu_templates.py --out OUTDIR [--minutes 6]

What it does, in this order (about 5 minutes on an H100 from a cold build cache):
  build    `popkit new --task softmax` and `--task matmul` (CUDA, inline, default values: for matmul the example's
           128x128 tile, 2x4 warps, 2 stages); `popkit compile` of both and of submissions/softmax/cuda.py, at once;
  test     `popkit test` of both rendered files (they must pass);
  grid     in this process, every grid point of the matmul template against float64 a @ b on aligned and awkward
           shapes (16-byte and element-wise loads), with the task's tolerance;
  softmax  in this process, CUDA events and an L2 flush before every call (median of 30): the template and
           submissions/softmax/cuda.py at each benchmark shape, and `dst.copy_(src)` of the largest shape's bytes;
           bandwidth counts 8 bytes per element, reported as a share of the copy's;
  matmul   `popkit bench submissions/matmul/cuda.py TEMPLATE` (popkit's calibrated A/B) on a copy of the task
           without 8192^3: template / example time and its 95% interval, in what is left of --minutes.

Writes OUTDIR/templates.json and OUTDIR/templates.md and prints the markdown. `--dry-run` renders, checks the
grids and lints the files on the CPU, and marks the GPU steps as skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

MATMUL_DROPPED = {"m": 8192, "n": 8192, "k": 8192}
GRID_SHAPES = ((1, 1, 1), (65, 1, 77), (127, 129, 65), (333, 200, 300), (128, 256, 96), (520, 264, 1000))
HAND = {"softmax": ROOT / "submissions" / "softmax" / "cuda.py", "matmul": ROOT / "submissions" / "matmul" / "cuda.py"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def render(tmp: Path) -> dict[str, Path]:
    files = {}
    for task in ("softmax", "matmul"):
        files[task] = tmp / f"{task}_template.py"
        api.new(task, files[task], target="cuda", style="inline", force=True)
    return files


def trimmed_matmul(tmp: Path) -> Path:
    """A copy of the bundled matmul task (beside copies of its shared files) without the 8192^3 shape."""
    dest = tmp / "tasks" / "matmul"
    shutil.copytree(api.task_show("matmul").task.path.parent, tmp / "tasks", dirs_exist_ok=True)
    spec = yaml.safe_load((dest / "task.yml").read_text())
    spec["benchmarks"] = [c for c in spec["benchmarks"] if {k: c.get(k) for k in MATMUL_DROPPED} != MATMUL_DROPPED]
    (dest / "task.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest


def load(path: Path, report) -> object:
    """Import a submission in this process from the build `popkit compile` left (same folder, toolkit and
    architecture, so ninja finds it up to date)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = report.build_dir
    if report.arch_list:
        os.environ["TORCH_CUDA_ARCH_LIST"] = report.arch_list
    spec = importlib.util.spec_from_file_location(f"popkit_gpu_templates_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grid_points(path: Path) -> list[dict]:
    """The grid points the rendered file compiles: its dispatch's `if (BM == 128 && ...)` lines."""
    found = re.findall(r"^    if \(((?:\w+ == \d+(?: && )?)+)\) \{ \*err = ", path.read_text(), re.M)
    return [{k: int(v) for k, v in re.findall(r"(\w+) == (\d+)", cond)} for cond in found]


def check_grid(path: Path, module) -> dict:
    """Every grid point of the matmul template on GRID_SHAPES, within the task's tolerance of float64 a @ b."""
    import torch

    points, failures = grid_points(path), []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for point in points:
        for name, value in point.items():
            setattr(module, name, value)
        for m, n, k in GRID_SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
            b = (torch.randn(k, n, device="cuda", generator=gen) / k ** 0.5).half()
            ref = (a.double() @ b.double()).half().double()
            out = module.custom_kernel((a, b)).double()
            torch.cuda.synchronize()
            if not bool(((out - ref).abs() <= 5e-3 + 5e-3 * ref.abs()).all()):
                failures.append(f"{point} at {(m, n, k)}: max error {float((out - ref).abs().max()):.3g}")
    return {"points": len(points), "shapes": len(GRID_SHAPES), "failures": failures}


def median_us(fn, calls: int = 30) -> float:
    """Median time of `fn` in µs, CUDA events around each call, an L2 flush (256 MiB written) before each."""
    import torch

    flush = torch.empty(64 * 1024 * 1024, dtype=torch.float32, device="cuda")
    times = []
    for n in range(calls + 3):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if n >= 3:  # warm-up calls
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_softmax(template, hand) -> dict:
    import torch

    shapes = yaml.safe_load((api.task_show("softmax").task.path / "task.yml").read_text())["benchmarks"]
    rows = []
    for case in shapes:
        rows_, cols = case["rows"], case["cols"]
        x = torch.randn(rows_, cols, device="cuda") * 2 + torch.rand(rows_, 1, device="cuda") * 200 - 100
        ref = torch.softmax(x.double(), -1).float()
        row = {"shape": f"{rows_}x{cols}", "bytes": 8 * rows_ * cols}
        for side, module in (("template", template), ("example", hand)):
            out = module.custom_kernel(x)
            row[f"{side}_ok"] = bool(((out - ref).abs() <= 1e-8 + 1e-5 * ref.abs()).all())
            row[f"{side}_us"] = round(median_us(lambda m=module: m.custom_kernel(x)), 1)
        rows.append(row)
    largest = max(rows, key=lambda r: r["bytes"])
    src = torch.randn(largest["bytes"] // 8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = median_us(lambda: dst.copy_(src))
    for row in rows:
        row["copy_share_template"] = round(copy_us * row["bytes"] / largest["bytes"] / row["template_us"], 3)
    return {"shapes": rows, "copy_us": round(copy_us, 1), "copy_tb_s": round(largest["bytes"] / copy_us / 1e6, 2),
            "largest": largest["shape"], "share_template": round(copy_us / largest["template_us"], 3),
            "share_example": round(copy_us / largest["example_us"], 3)}


def ab_matmul(template: Path, task_dir: Path, budget_s: float) -> dict:
    doc = api.document(api.bench(HAND["matmul"], template,
                                 harness="task", task=str(task_dir), rounds=8, budget_s=budget_s,
                                 record=False, progress=lambda m: log(f"matmul A/B: {m}")))
    score = doc.get("score") or {}
    shapes = [{"shape": s["spec"], "example_us": round(statistics.median(s["a_ns"]) / 1e3, 1) if s["a_ns"] else None,
               "template_us": round(statistics.median(s["b_ns"]) / 1e3, 1) if s["b_ns"] else None}
              for s in doc.get("shapes", [])]
    return {"ratio": score.get("ratio"), "verdict": doc.get("verdict"), "rounds": doc.get("rounds"),
            "stopped": doc.get("stopped"), "exit_code": doc.get("exit_code"), "shapes": shapes}


def markdown(res: dict) -> str:
    lines = [f"`python3 scripts/gpu_templates.py` on {res['device']}, {res['started_at'][:16].replace('T', ' ')} UTC "
             f"({res.get('total_s', 0):.0f} s in all)", ""]
    lines.append("Builds (popkit compile, cold): " + ", ".join(f"{k} {v}" for k, v in res["builds"].items()) + ".")
    lines.append("Tests (popkit test): " + ", ".join(f"{k} {v}" for k, v in res["tests"].items()) + ".")
    if res.get("grid"):
        g = res["grid"]
        lines.append(f"Matmul grid: {g['points']} points x {g['shapes']} shapes, {len(g['failures'])} failures"
                     + "".join(f"; {f}" for f in g["failures"][:5]) + ".")
    sm = res.get("softmax")
    if sm:
        lines += ["", f"Softmax (median µs, CUDA events, L2 flushed; copy of {sm['largest']}'s bytes: {sm['copy_us']} µs"
                  f" = {sm['copy_tb_s']} TB/s):", "",
                  "| shape | template µs | example µs | template / copy bandwidth | outputs right (template, example) |",
                  "|---|---|---|---|---|"]
        for r in sm["shapes"]:
            lines.append(f"| {r['shape']} | {r['template_us']} | {r['example_us']} | {r['copy_share_template']:.0%} |"
                         f" {r['template_ok']}, {r['example_ok']} |")
        lines += ["", f"At {sm['largest']}: template {sm['share_template']:.0%} of the copy's bandwidth "
                  f"(goal: >= 90%), the hand-written example {sm['share_example']:.0%}."]
    mm = res.get("matmul")
    if mm:
        ratio = mm["ratio"] or {}
        text = (f"{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]" if ratio.get("low") is not None
                else str(ratio.get("estimate")))
        lines += ["", f"Matmul A/B (popkit bench, {mm['rounds']} rounds, stopped: {mm['stopped']}): template / example "
                  f"time {text} (goal: <= 1.25), verdict {mm['verdict']}.", "",
                  "| shape | example µs | template µs |", "|---|---|---|"]
        lines += [f"| {s['shape']} | {s['example_us']} | {s['template_us']} |" for s in mm["shapes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=6.0, help="the whole run's time budget")
    parser.add_argument("--dry-run", action="store_true", help="render, check the grids and lint on the CPU")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    res: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "builds": {}, "tests": {}}
    tmp = Path(tempfile.mkdtemp(prefix="popkit-gpu-templates-"))
    ok = True

    def save() -> None:
        res["total_s"] = round(time.monotonic() - start, 1)
        (args.out / "templates.json").write_text(json.dumps(res, indent=1, default=str))

    try:
        files = render(tmp)
        res["grid_points"] = {t: len(grid_points(p)) for t, p in files.items()}
        if args.dry_run:
            res["device"] = "cpu (dry run)"
            for task, path in files.items():
                report = api.check(path, leaderboard=task, gpu="H100")
                res["tests"][task] = "lint ok" if report.ok else "lint FAILED"
                ok &= report.ok
            res["builds"] = {t: "skipped (dry run)" for t in files}
            save()
        else:
            if "CUDA_HOME" not in os.environ and Path("/usr/local/cuda/bin/nvcc").exists():  # as popkit's builds
                os.environ["CUDA_HOME"] = "/usr/local/cuda"
            import torch

            res["device"] = torch.cuda.get_device_name()
            builds = {"softmax template": files["softmax"], "matmul template": files["matmul"],
                      "softmax example": HAND["softmax"]}
            log("build: " + ", ".join(builds) + ", at once")
            with ThreadPoolExecutor(len(builds)) as pool:
                reports = dict(zip(builds, pool.map(lambda p: api.compile(p, timeout_s=480.0), builds.values())))
            res["builds"] = {k: f"{r.status} {r.cold_s or 0:.0f} s" for k, r in reports.items()}
            if not all(r.ok for r in reports.values()):
                save()
                raise SystemExit("a build failed: " + json.dumps(res["builds"]))
            for task, path in files.items():
                log(f"test {path.name}")
                outcome = api.test(path, harness="task", task=task, record=False)
                res["tests"][task] = outcome.report.outcome
                ok &= api.exit_code(outcome) == 0
            save()
            log("matmul grid, in this process")
            res["grid"] = check_grid(files["matmul"], load(files["matmul"], reports["matmul template"]))
            ok &= not res["grid"]["failures"]
            save()
            log("softmax timing, in this process")
            res["softmax"] = time_softmax(load(files["softmax"], reports["softmax template"]),
                                          load(HAND["softmax"], reports["softmax example"]))
            ok &= all(r["template_ok"] for r in res["softmax"]["shapes"])
            save()
            left = 60 * args.minutes - (time.monotonic() - start) - 45
            log(f"matmul A/B, budget {left:.0f} s")
            res["matmul"] = ab_matmul(files["matmul"], trimmed_matmul(tmp), max(30.0, left))
            ok &= res["matmul"]["exit_code"] == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save()
    text = markdown(res)
    (args.out / "templates.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
