#!/usr/bin/env python3
"""GPU proof for HIP and the torch.library templates, on one NVIDIA GPU.

Run from the repository root with popkit installed (no network needed):

    python3 scripts/gpu_hip.py --out results/

It renders every bundled task's HIP template in both styles (`popkit new --target hip`) and its CUDA
library template, takes the HIP examples (submissions/*/hip.py), and then, for --jobs files at a time:
  1. builds the file (run once, as the compile pre-step does; HIP files through popkit's HIP-to-CUDA
     mapping), MAX_JOBS=2 per build;
  2. runs `popkit test --hip-on-cuda` on every HIP file and `popkit test` on every CUDA one: the
     bundled tasks' own checks, a logic check of the HIP kernels, not AMD timing;
  3. runs torch.library.opcheck on the operator of every library-style file and compares
     torch.compile(custom_kernel, fullgraph=True) with eager on the same input (torch.equal).
Results go to OUT/hip.json (rewritten after every step, so a cut-off run keeps what it got) and the
tables for docs/benchmarks.md to OUT/hip.md, printed at the end. About 4 minutes on an H100 (16 cores):
the builds are the cost. `--dry-run` renders the files and writes the plan without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402  (after the checkout is on the path)

TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
MAX_JOBS_PER_BUILD = "2"  # a load_inline extension has two sources (main.cpp, cuda.cu)

# Child: import the file, catch the operator call custom_kernel makes, opcheck it, then compare
# torch.compile(fullgraph=True) with eager. Writes one JSON object to argv[4].
LIBRARY_CHECK = r"""
import importlib.util, json, re, sys, traceback
path, task_dir, case, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
sys.path[:0] = [task_dir, str(__import__("pathlib").Path(task_dir).parent)]
result = {"opcheck": None, "compile_equal": None, "error": None}
try:
    import torch
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ns, fn = re.search(r'register_fake\("(\w+)::(\w+)"\)', open(path).read()).groups()
    from reference import generate_input
    data = generate_input(**case)

    def clone(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, (tuple, list)):
            return type(x)(clone(v) for v in x)
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        return x

    namespace = getattr(torch.ops, ns)
    packet = getattr(namespace, fn)
    seen = {}

    def record(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return packet(*args, **kwargs)

    setattr(namespace, fn, record)
    try:
        module.custom_kernel(clone(data))
    finally:
        setattr(namespace, fn, packet)
    checks = torch.library.opcheck(packet.default, seen["args"], seen["kwargs"], raise_exception=False)
    result["opcheck"] = {k: str(v) for k, v in checks.items()}
    eager = module.custom_kernel(clone(data))
    compiled = torch.compile(module.custom_kernel, fullgraph=True)(clone(data))
    torch.cuda.synchronize()
    result["compile_equal"] = bool(torch.equal(eager, compiled))
    if not result["compile_equal"]:
        # A kernel whose float reduction order varies (atomics: vectorsum) differs from itself between two
        # eager calls; then compiled must match eager within the task's own check, and the table says so.
        again = module.custom_kernel(clone(data))
        torch.cuda.synchronize()
        if not torch.equal(eager, again):
            from reference import check_implementation
            verdict = check_implementation(data, compiled)
            ok, message = verdict if isinstance(verdict, tuple) else (not verdict, verdict)
            result["compile_equal"] = bool(ok)
            result["compile_note"] = ("eager differs from itself between calls (reduction order); compiled "
                                      "passes the task's check" if ok else f"compiled fails the task's check: {message}")
except BaseException as exc:
    result["error"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]
with open(out, "w") as fh:
    json.dump(result, fh)
"""


class Proof:
    """The results document; workers add to it and write it under one lock."""

    def __init__(self, out: Path):
        self.out = out
        self.doc: dict = {"card": None, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "files": []}
        self.lock = threading.Lock()

    def save(self) -> None:
        (self.out / "hip.json").write_text(json.dumps(self.doc, indent=1, default=str))

    def add(self, entry: dict, key: str, value: dict) -> None:
        with self.lock:
            entry[key] = value
            self.save()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 600) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds); 124 on timeout."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        return 124, str(exc.stdout or ""), str(exc.stderr or ""), time.monotonic() - start


def plan(work: Path, task_names: tuple[str, ...]) -> list[dict]:
    """Every file to prove: HIP templates (both styles), CUDA library templates, HIP examples."""
    work.mkdir(parents=True, exist_ok=True)
    files = []
    for name in task_names:
        for target, style in (("hip", "inline"), ("hip", "library"), ("cuda", "library")):
            path = work / f"{name}_{target}_{style}.py"
            api.new(name, path, target=target, style=style, force=True)  # as `popkit new` writes it
            files.append({"task": name, "target": target, "style": style, "kind": "template", "path": str(path)})
        example = ROOT / "submissions" / name / "hip.py"
        if example.is_file():
            files.append({"task": name, "target": "hip", "style": "inline", "kind": "example", "path": str(example)})
    return files


def env_for(entry: dict) -> dict[str, str]:
    env = {"MAX_JOBS": MAX_JOBS_PER_BUILD}
    if entry["target"] == "hip":
        env.update(api.hip_on_cuda_env())
    return env


def build(entry: dict) -> dict:
    path = Path(entry["path"])
    code, out, err, secs = run([sys.executable, str(path)], env_for(entry), cwd=path.parent)
    return {"exit_code": code, "seconds": round(secs, 1), "tail": "" if code == 0 else (out + err)[-2000:]}


def test(entry: dict) -> dict:
    argv = [sys.executable, "-m", "popkit", "test", entry["path"], "--task", entry["task"], "--json", "--no-history"]
    if entry["target"] == "hip":
        argv.append("--hip-on-cuda")
    code, out, err, secs = run(argv)
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {}
    return {"exit_code": code, "outcome": doc.get("outcome"), "label": doc.get("label"),
            "notes": doc.get("notes", []), "seconds": round(secs, 1), "tail": "" if code == 0 else (out + err)[-3000:]}


def library_check(entry: dict, scratch: Path) -> dict:
    task = api.task_show(entry["task"]).task
    out = scratch / (Path(entry["path"]).stem + ".check.json")
    case = json.dumps(dict(task.tests[-1]))
    env = env_for(entry)
    code, stdout, stderr, secs = run([sys.executable, "-c", LIBRARY_CHECK, entry["path"], str(task.path), case,
                                      str(out)], env, cwd=Path(entry["path"]).parent)
    output = stdout + stderr
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {"opcheck": None, "compile_equal": None, "error": f"exit {code}: {output[-2000:]}"}
    return {**result, "seconds": round(secs, 1)}


def opcheck_passed(result: dict | None) -> bool | None:
    if not result or result.get("opcheck") is None:
        return None
    return all(v == "SUCCESS" for v in result["opcheck"].values())


def _mark(value: bool | None) -> str:
    return "not run" if value is None else ("pass" if value else "**FAIL**")


def markdown(doc: dict) -> str:
    card = doc.get("card") or "no GPU (dry run)"
    lines = [f"#### HIP on NVIDIA: a logic check, not AMD timing ({card}, {doc['started']})", "",
             "Each HIP file built with nvcc through popkit's HIP-to-CUDA mapping (32-lane warps), then the "
             "bundled task's tests (`popkit test --hip-on-cuda`).", "",
             "| file | build (s) | tests |", "|---|---:|---|"]
    for f in doc["files"]:
        if f["target"] != "hip":
            continue
        name = f"{f['task']} {f['kind']}" + (f" ({f['style']})" if f["kind"] == "template" else "")
        b, t = f.get("build") or {}, f.get("test") or {}
        built = b.get("seconds", "") if b.get("exit_code") == 0 else ("**failed**" if b else "not run")
        lines.append(f"| {name} | {built} | {t.get('outcome') or 'not run'} |")
    lines += ["", f"#### torch.library templates: opcheck and torch.compile ({card})", "",
              "`torch.library.opcheck` on the operator each `--style library` template registers, and "
              "`torch.compile(custom_kernel, fullgraph=True)` against eager on the task's last test case "
              "(`torch.equal`; a kernel that differs from itself between two eager calls, float atomics, is "
              "held to the task's check instead, marked *). HIP templates run through the HIP-to-CUDA mapping.", "",
              "| target | task | tests | opcheck | compile == eager |", "|---|---|---|---|---|"]
    for f in doc["files"]:
        if f["style"] != "library" or f["kind"] != "template":
            continue
        lib = f.get("library")
        equal = None if not lib else lib.get("compile_equal")
        lines.append(f"| {f['target']} | {f['task']} | {(f.get('test') or {}).get('outcome') or 'not run'} | "
                     f"{_mark(opcheck_passed(lib))} | {_mark(equal)}{'*' if lib and lib.get('compile_note') else ''} |")
    return "\n".join(lines) + "\n"


def device_name() -> str | None:
    code, out, _, _ = run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name())"], timeout=120)
    return out.strip().splitlines()[-1] if code == 0 and out.strip() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for hip.json and hip.md")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated bundled tasks")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="builds at once (default: half the cores)")
    parser.add_argument("--dry-run", action="store_true", help="render and plan only; no GPU needed")
    args = parser.parse_args(argv)
    names = tuple(t for t in args.tasks.split(",") if t)
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}: choose from {', '.join(TASKS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    proof = Proof(args.out)
    proof.doc["files"] = plan(args.out / "work", names)
    proof.save()
    if not args.dry_run:
        proof.doc["card"] = device_name()
        log(f"{proof.doc['card']}: {len(proof.doc['files'])} files, {args.jobs} at a time (build, test, opcheck)")

        def prove(entry: dict) -> None:
            proof.add(entry, "build", build(entry))
            if entry["build"]["exit_code"] == 0:
                proof.add(entry, "test", test(entry))
                if entry["style"] == "library" and entry["kind"] == "template":
                    proof.add(entry, "library", library_check(entry, args.out))
            log(f"{Path(entry['path']).name}: build {entry['build']['exit_code']}, "
                f"test {(entry.get('test') or {}).get('outcome')}, library {entry.get('library', {}).get('compile_equal')}")

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(prove, proof.doc["files"]))
    text = markdown(proof.doc)
    (args.out / "hip.md").write_text(text)
    proof.save()
    print(text)
    failed = [f for f in proof.doc["files"] if not args.dry_run and (
        (f.get("build") or {}).get("exit_code") != 0 or (f.get("test") or {}).get("outcome") != "passed"
        or (f["style"] == "library" and f["kind"] == "template"
            and not (opcheck_passed(f.get("library")) and (f.get("library") or {}).get("compile_equal"))))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
