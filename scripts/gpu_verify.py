#!/usr/bin/env python3
"""popkit's GPU verification: one run that builds, tests and times everything on a CUDA machine.

Run from the repository root on a machine with an NVIDIA GPU (no network needed):

    python scripts/gpu_verify.py --out results/            # everything
    python scripts/gpu_verify.py --out results/ --parts tests,examples

Parts (comma-separated, in this order):
  install     pip-install popkit from this checkout (no network: --no-build-isolation --no-deps)
  ceilings    measured device-to-device copy bandwidth and fp16 matmul rate
  build       cold/warm `popkit compile` of every CUDA example, one at a time (a cold time measured beside
              other builds is a contended one); then warms the build cache of all submissions in parallel
  examples    `popkit test` and `popkit bench --leaderboard` on every CUDA example
  roofline    `popkit bench --baseline reference` on every CUDA example at every benchmark shape (a task
              ranked by its last shape runs from a copy ranked by the mean, so that every shape is timed)
  overhead    wall time of `popkit test` (warm), `popkit test --no-precompile` and the bare protocol run
  templates   `popkit new` for every task x style, then `popkit test` and `popkit bench --leaderboard`
  pytest      the `gpu`-marked tests
  fidelity    popkit's timing against CUDA events (same flush) and triton's do_bench, in-process;
              `popkit bench` REPEATS times per task for repeatability

A machine without network needs popkit's build backend as wheels in .whl/ (the `install` part installs
them first): `python3 -m pip download --no-deps -d .whl hatchling trove-classifiers`.

Results go to OUT/results.json (updated after every step, so a cut-off run keeps what it measured) and a
markdown summary OUT/summary.md; the summary is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import bare_eval  # noqa: E402

from popkit import api  # noqa: E402

TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
FIDELITY_TASKS = ("vectoradd", "softmax", "matmul")
PARTS = ("install", "ceilings", "build", "examples", "roofline", "overhead", "templates", "pytest", "fidelity")
REPEATS = 4  # `popkit bench` runs per fidelity task (--repeats)
INDEPENDENT = True  # time each fidelity task with CUDA events and do_bench too (--no-independent)
RESULTS: dict = {}
OUT = Path(".")


def save() -> None:
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(argv: list[str], timeout: float = 900, env: dict | None = None, cwd: Path | None = None):
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        return 124, exc.stdout or "", exc.stderr or "", time.monotonic() - start


def popkit_json(*args: str, timeout: float = 900) -> tuple[int, dict, float]:
    code, out, err, secs = sh([sys.executable, "-m", "popkit", *args, "--json"], timeout=timeout)
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {"unparsed_stdout": out[-2000:], "stderr": err[-4000:]}
    return code, doc, secs


# ------------------------------------------------------------------------------------------ parts


def part_install() -> None:
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    if wheels:
        sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels])
    code, out, err, _ = sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-build-isolation", "."])
    RESULTS["install"] = {"exit_code": code, "stderr": err[-2000:]}
    if code != 0:
        raise SystemExit(f"install failed: {err[-2000:]}")


def part_ceilings() -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    RESULTS["device"] = {
        "name": props.name, "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None), "torch": torch.__version__, "cuda": torch.version.cuda,
        "capability": f"sm_{props.major}{props.minor}",
        "nvidia_smi": sh(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
                          "--format=csv,noheader"])[1].strip(),
    }
    n = 1 << 28  # 1 GiB of float32
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    copy_bw = 2 * n * 4 / statistics.median(times)  # bytes read + bytes written
    del src, dst
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.float16)
    y = torch.randn(m, m, device="cuda", dtype=torch.float16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x @ y
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    RESULTS["ceilings"] = {"copy_bytes_per_s": copy_bw, "fp16_flops_per_s": 2 * m**3 / statistics.median(times)}
    log(f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, fp16 matmul {RESULTS['ceilings']['fp16_flops_per_s'] / 1e12:.0f} TFLOP/s")


def part_pytest() -> None:
    code, out, err, secs = sh([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                               "tests"], timeout=1200)
    tail = out.strip().splitlines()[-1] if out.strip() else err[-500:]
    RESULTS["pytest_gpu"] = {"exit_code": code, "summary": tail, "seconds": secs,
                             "failures": [l for l in out.splitlines() if l.startswith(("FAILED", "ERROR"))],
                             "output_tail": "" if code == 0 else out[-8000:]}
    log(f"pytest -m gpu: {tail}")


def cuda_examples() -> list[Path]:
    return [ROOT / "submissions" / t / "cuda.py" for t in TASKS]


def rendered(tmp: Path) -> list[tuple[str, str, Path]]:
    out = []
    for task in TASKS:
        for style in ("inline", "library"):
            path = tmp / f"{task}_{style}.py"
            if not path.exists():
                code, doc, _ = popkit_json("new", "--task", task, "--target", "cuda", "--style", style,
                                           "-o", str(path), "--force")
                if code != 0:
                    RESULTS.setdefault("render_errors", []).append({"task": task, "style": style, "doc": doc})
                    continue
            out.append((task, style, path))
    return out


def _ext_name(path: Path) -> str:
    match = re.search(r"name\s*=\s*['\"]([^'\"]+)['\"]", path.read_text())
    return match.group(1) if match else path.stem


def warm_build_cache(files: list[Path]) -> None:
    """Run each file once (as the compile pre-step does), files sharing an extension name one after another."""
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(_ext_name(f), []).append(f)

    def build(group: list[Path]) -> list[tuple[str, int, float]]:
        done = []
        for f in group:
            code, _, err, secs = sh([sys.executable, str(f)], timeout=600, cwd=f.parent, env={"MAX_JOBS": "4"})
            done.append((str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f), code, secs))
        return done

    with ThreadPoolExecutor(max_workers=6) as pool:
        for results in pool.map(build, groups.values()):
            for name, code, secs in results:
                RESULTS.setdefault("warm_cache", []).append({"file": name, "exit_code": code, "seconds": secs})


def part_build(tmp: Path) -> None:
    def compile_one(f: Path) -> dict:
        code, doc, secs = popkit_json("compile", str(f), "--clean", timeout=900)
        return {"file": str(f.relative_to(ROOT)), "exit_code": code, "cold_s": doc.get("cold_s"),
                "warm_s": doc.get("warm_s"), "torch_import_s": doc.get("torch_import_s"), "status": doc.get("status")}

    RESULTS["compile"] = []
    for f in cuda_examples():
        RESULTS["compile"].append(compile_one(f))
        save()
    log("compile: " + ", ".join(f"{Path(c['file']).parent.name} {c['status']} cold {c['cold_s']}" for c in RESULTS["compile"]))
    warm_build_cache(cuda_examples() + [p for _, _, p in rendered(tmp)])


def _summary(doc: dict) -> dict:
    runs = doc.get("runs") or []
    return {"outcome": doc.get("outcome"), "exit_code": doc.get("exit_code"),
            "score_public_s": doc.get("score_public_s"), "scores_secret_s": doc.get("scores_secret_s"),
            "secret_seeds": doc.get("secret_seeds"),
            "failure": next((r.get("summary") for r in runs if r.get("outcome") != "passed"), None),
            "message": doc.get("message")}


def test_and_rank(label: str, path: Path, task: str) -> dict:
    code, doc, secs = popkit_json("test", str(path), "--task", task, "--no-history")
    entry = {"label": label, "task": task, "test": _summary(doc), "test_s": secs}
    code, doc, secs = popkit_json("bench", str(path), "--task", task, "--leaderboard", "--no-history")
    entry.update(leaderboard=_summary(doc), leaderboard_s=secs)
    log(f"{label}: test {entry['test']['outcome']}, leaderboard {entry['leaderboard']['outcome']} "
        f"score {entry['leaderboard']['score_public_s']}")
    return entry


def _case_bytes_and_flops(task: str) -> list[dict]:
    """Bytes that must move (inputs read once, output written once) and FLOPs, per benchmark shape."""
    import importlib

    import torch
    import yaml

    sys.path.insert(0, str(ROOT / "tasks" / task))
    sys.path.insert(0, str(ROOT / "tasks"))
    for mod in ("reference", "utils", "task"):
        sys.modules.pop(mod, None)
    ref = importlib.import_module("reference")
    cases = yaml.safe_load((ROOT / "tasks" / task / "task.yml").read_text())["benchmarks"]
    rows = []
    for case in cases:
        data = ref.generate_input(**case)
        tensors = [t for t in (data if isinstance(data, (tuple, list)) else [data]) if isinstance(t, torch.Tensor)]
        out = ref.ref_kernel(data)
        # a preallocated output buffer in data (identity's) is written, not read
        read = sum(t.nbytes for t in tensors if t.data_ptr() != out.data_ptr())
        flops = 2 * case["m"] * case["n"] * case["k"] if task == "matmul" else 0
        rows.append({"spec": "; ".join(f"{k}: {v}" for k, v in case.items()), "bytes": read + out.nbytes,
                     "flops": flops})
        del data, out, tensors
    torch.cuda.empty_cache()
    sys.path.remove(str(ROOT / "tasks" / task))
    sys.path.remove(str(ROOT / "tasks"))
    return rows


def part_examples() -> None:
    RESULTS["examples"] = []
    for task in TASKS:
        path = ROOT / "submissions" / task / "cuda.py"
        RESULTS["examples"].append(test_and_rank(f"submissions/{task}/cuda.py", path, task))
        save()


def _every_shape_task(task_name: str, tmp: Path) -> str:
    """The task as popkit finds it, or, under `ranking_by: last`, a copy ranked by the mean (all shapes timed)."""
    text = (ROOT / "tasks" / task_name / "task.yml").read_text()
    if not re.search(r"^ranking_by:\s*last\s*$", text, re.M):
        return task_name
    copy = tmp / "every-shape"
    if not copy.exists():
        shutil.copytree(ROOT / "tasks", copy / "tasks")
        shutil.copytree(ROOT / "submissions", copy / "submissions")
    yml = copy / "tasks" / task_name / "task.yml"
    yml.write_text(re.sub(r"^ranking_by:\s*last\s*$", "ranking_by: mean", text, flags=re.M))
    return str(yml.parent)


def _benchmark_cases(doc: dict | None) -> dict[str, dict]:
    run = next((r for r in (doc or {}).get("runs", []) if r["mode"] == "benchmark" and not r["secret"]), None)
    return {b["spec"]: b for b in (run or {}).get("benchmarks", [])}


def part_roofline(tmp: Path) -> None:
    RESULTS["roofline"] = {}
    for task in TASKS:
        path = ROOT / "submissions" / task / "cuda.py"
        code, doc, secs = popkit_json("bench", str(path), "--task", _every_shape_task(task, tmp),
                                      "--baseline", "reference", "--no-history")
        mine, base = _benchmark_cases(doc), _benchmark_cases(doc.get("baseline"))
        shapes = _case_bytes_and_flops(task)
        for row in shapes:
            a, b = mine.get(row["spec"], {}), base.get(row["spec"], {})
            row.update(example_ns=a.get("mean_ns"), example_median_ns=a.get("median_ns"), example_err_ns=a.get("err_ns"),
                       reference_ns=b.get("mean_ns"), reference_err_ns=b.get("err_ns"))
        RESULTS["roofline"][task] = {"outcome": doc.get("outcome"), "speedup": doc.get("speedup"),
                                     "warnings": doc.get("warnings"), "shapes": shapes}
        log(f"roofline {task}: {doc.get('outcome')}, " + ", ".join(_us(r["example_ns"]) for r in shapes))
        save()


def part_templates(tmp: Path) -> None:
    RESULTS["templates"] = []
    for task, style, path in rendered(tmp):
        RESULTS["templates"].append(test_and_rank(f"popkit new --task {task} --style {style}", path, task))
        save()


_INDEPENDENT = r'''
import json, os, statistics, sys
import torch
sys.path.insert(0, os.getcwd())
import reference
import submission
from triton.testing import do_bench

cases = json.loads(sys.argv[1])
props = torch.cuda.get_device_properties(0)
flush = torch.empty(max(2 * getattr(props, "L2_cache_size", 0), 256 * 1024 * 1024), dtype=torch.uint8, device="cuda")
rows = []
for case in cases:
    data = reference.generate_input(**case)
    for _ in range(10):
        submission.custom_kernel(data)
    torch.cuda.synchronize()
    times = []
    for _ in range(100):
        torch.cuda.synchronize()
        flush.fill_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        submission.custom_kernel(data)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e6)
    bench = do_bench(lambda: submission.custom_kernel(data), warmup=25, rep=200, return_mode="mean") * 1e6
    rows.append({"events_mean_ns": statistics.mean(times), "events_median_ns": statistics.median(times),
                 "do_bench_mean_ns": bench})
print(json.dumps(rows))
'''


def part_fidelity() -> None:
    """popkit bench and the independent measurement alternate, so that both see the same GPU state (clocks, heat)."""
    RESULTS["fidelity"] = {}
    for task_name in FIDELITY_TASKS:
        task = api.task_show(task_name).task
        path = ROOT / "submissions" / task_name / "cuda.py"
        info = RESULTS["fidelity"][task_name] = {
            "repeats": [], "independent": [],
            "specs": [bare_eval.cases_text([c]).strip() for c in task.cases_for("benchmark")]}
        for _ in range(REPEATS):
            code, doc, _ = popkit_json("bench", str(path), "--task", task_name, "--no-history")
            bench = list(_benchmark_cases(doc).values())
            info["repeats"].append({"score_s": doc.get("score_public_s"), "warnings": doc.get("warnings"),
                                    "means_ns": [b.get("mean_ns") for b in bench],
                                    "medians_ns": [b.get("median_ns") for b in bench],
                                    "errs_ns": [b.get("err_ns") for b in bench]})
            if not INDEPENDENT:
                save()
                continue
            with tempfile.TemporaryDirectory() as tmp:
                bare_eval.lay_out(task.path, path.read_text(), Path(tmp))
                code, out, err, _ = sh([sys.executable, "-c", _INDEPENDENT, json.dumps(task.cases_for("benchmark"))],
                                       cwd=Path(tmp), timeout=900)
            try:
                info["independent"].append(json.loads(out.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                info.setdefault("independent_errors", []).append(err[-2000:])
            save()
        scores = [r["score_s"] for r in info["repeats"] if r["score_s"]]
        if scores:
            log(f"fidelity {task_name}: scores {['%.3g' % s for s in scores]} spread "
                f"{(max(scores) - min(scores)) / min(scores) * 100:.2f}%")


def part_overhead() -> None:
    """`popkit test` against the bare protocol run (scripts/bare_eval.py: the eval alone, no popkit)."""
    rows = []
    for task_name in ("vectoradd",):
        task = api.task_show(task_name).task
        path = ROOT / "submissions" / task_name / "cuda.py"
        cli = [sys.executable, "-m", "popkit", "test", str(path), "--task", task_name, "--no-history"]
        popkit_s, no_pre_s, bare_s = [], [], []
        for _ in range(3):
            popkit_s.append(sh(cli)[3])
            no_pre_s.append(sh(cli + ["--no-precompile"])[3])
            start = time.monotonic()
            bare = bare_eval.bare_run(task.path, path.read_text(), "test", timeout_s=180)
            bare_s.append(time.monotonic() - start)
            assert bare["_passed"], bare["_stderr_tail"]
        rows.append({"task": task_name, "popkit_test_s": popkit_s, "no_precompile_s": no_pre_s, "bare_protocol_s": bare_s,
                     "ratio": statistics.median(popkit_s) / statistics.median(bare_s),
                     "ratio_no_precompile": statistics.median(no_pre_s) / statistics.median(bare_s)})
        log(f"overhead {task_name}: popkit {statistics.median(popkit_s):.2f} s, --no-precompile "
            f"{statistics.median(no_pre_s):.2f} s, bare {statistics.median(bare_s):.2f} s")
    startup = [sh([sys.executable, "-m", "popkit", "tasks", "--json"])[3] for _ in range(3)]
    RESULTS["overhead"] = rows
    RESULTS["cli_startup_s"] = startup


# ----------------------------------------------------------------------------------------- summary


def _us(ns) -> str:
    return f"{ns / 1e3:.1f}" if ns else "-"


def summary() -> str:
    lines = [f"# GPU verification, {time.strftime('%Y-%m-%d')}", ""]
    dev = RESULTS.get("device", {})
    lines.append(f"device: {dev.get('name')} ({dev.get('capability')}, {dev.get('sm_count')} SMs), torch {dev.get('torch')}, CUDA {dev.get('cuda')}")
    ceil = RESULTS.get("ceilings", {})
    if ceil:
        lines.append(f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s (read+write), fp16 matmul {ceil['fp16_flops_per_s'] / 1e12:.0f} TFLOP/s")
    if "pytest_gpu" in RESULTS:
        lines.append(f"pytest -m gpu: {RESULTS['pytest_gpu']['summary']}")
        lines += [f"  {f}" for f in RESULTS["pytest_gpu"]["failures"]]
    lines += ["", "| submission | test | leaderboard | score (public) | secret |", "|---|---|---|---|---|"]
    for e in RESULTS.get("examples", []) + RESULTS.get("templates", []):
        lb = e["leaderboard"]
        secret = ", ".join("pass" if s else "FAIL" for s in (lb.get("scores_secret_s") or []))
        lines.append(f"| {e['label']} | {e['test']['outcome']} | {lb['outcome']} | "
                     f"{_us((lb.get('score_public_s') or 0) * 1e9)} µs | {secret} |")
        for part in ("test", "leaderboard"):
            if e[part].get("failure") or e[part].get("message"):
                lines.append(f"|   ↳ {part}: {e[part].get('failure') or e[part].get('message')} | | | | |")
    if RESULTS.get("roofline"):
        bw, rate = ceil.get("copy_bytes_per_s"), ceil.get("fp16_flops_per_s")
        lines += ["", "| task | shape | floor µs | example µs | % of copy BW | reference µs | speedup |",
                  "|---|---|---|---|---|---|---|"]
        for task, info in RESULTS["roofline"].items():
            for s in info["shapes"]:
                floor_s = max(s["bytes"] / bw, s["flops"] / rate if s["flops"] else 0) if bw else None
                ex, ref = s.get("example_ns"), s.get("reference_ns")
                pct = f"{s['bytes'] / (ex / 1e9) / bw * 100:.0f}%" if ex and bw and not s["flops"] else (
                    f"{s['flops'] / (ex / 1e9) / rate * 100:.0f}% of fp16 rate" if ex and s["flops"] else "-")
                lines.append(f"| {task} | {s['spec']} | {_us(floor_s * 1e9) if floor_s else '-'} | {_us(ex)} | {pct} | "
                             f"{_us(ref)} | {ref / ex if ex and ref else 0:.2f}× |")
    if RESULTS.get("fidelity"):
        lines += ["", "| task | shape | popkit mean µs, each run | CUDA events mean µs, each run | do_bench µs, each run |",
                  "|---|---|---|---|---|"]
        for task, info in RESULTS["fidelity"].items():
            ind = info["independent"] if isinstance(info["independent"], list) else []
            ind = [ind] if ind and isinstance(ind[0], dict) else ind  # an older results.json: one measurement
            for i, spec in enumerate(info["specs"]):
                ours = " / ".join(_us(r["means_ns"][i]) for r in info["repeats"] if i < len(r["means_ns"]))
                events = " / ".join(_us(m[i].get("events_mean_ns")) for m in ind if i < len(m))
                bench = " / ".join(_us(m[i].get("do_bench_mean_ns")) for m in ind if i < len(m))
                lines.append(f"| {task} | {spec} | {ours} | {events} | {bench} |")
            scores = [r["score_s"] for r in info["repeats"] if r["score_s"]]
            if len(scores) > 1:
                noisy = sum(1 for r in info["repeats"] if any("above the median" in w for w in r.get("warnings") or []))
                lines.append(f"| {task} | score spread over {len(scores)} runs (max-min)/min | "
                             f"{(max(scores) - min(scores)) / min(scores) * 100:.2f}% | runs flagged noisy: {noisy} | |")
    for row in RESULTS.get("overhead", []):
        lines.append(f"overhead {row['task']}: popkit test {statistics.median(row['popkit_test_s']):.2f} s, "
                     f"--no-precompile {statistics.median(row.get('no_precompile_s') or [0]):.2f} s, bare "
                     f"{statistics.median(row['bare_protocol_s']):.2f} s (×{row['ratio']:.2f})")
    if RESULTS.get("cli_startup_s"):
        lines.append(f"`popkit tasks --json` (CLI start-up): {statistics.median(RESULTS['cli_startup_s']):.2f} s")
    for c in RESULTS.get("compile", []):
        lines.append(f"compile {c['file']}: {c['status']}, cold {c['cold_s']} s, warm {c['warm_s']} s")
    return "\n".join(lines)


def main() -> None:
    global OUT, TASKS, FIDELITY_TASKS, REPEATS, INDEPENDENT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-verify"))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--tasks", default=",".join(TASKS), help="the bundled tasks to cover (default: all)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="popkit bench runs per fidelity task")
    parser.add_argument("--no-independent", action="store_true", help="fidelity: popkit's repeats only")
    args = parser.parse_args()
    TASKS = tuple(t for t in TASKS if t in args.tasks.split(","))
    FIDELITY_TASKS = tuple(t for t in FIDELITY_TASKS if t in TASKS)
    REPEATS, INDEPENDENT = args.repeats, not args.no_independent
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    existing = OUT / "results.json"
    if existing.exists():
        RESULTS.update(json.loads(existing.read_text()))
    parts = args.parts.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="popkit-verify-"))
    for part in PARTS:
        if part not in parts:
            continue
        log(f"== {part}")
        fn = globals()[f"part_{part}"]
        try:
            fn(tmp) if part in ("build", "roofline", "templates") else fn()
        except Exception as exc:  # keep going: a later part may still work, and the summary says what broke
            RESULTS.setdefault("errors", []).append(f"{part}: {type(exc).__name__}: {exc}")
            log(f"{part} failed: {type(exc).__name__}: {exc}")
        save()
    text = summary()
    (OUT / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
