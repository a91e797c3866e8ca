#!/usr/bin/env python3
"""Many submissions on Ray (`--cluster`) on a 2-GPU NVIDIA machine: both GPUs used, the verdicts of local runs,
and the wall time against the same runs one after another on one GPU (goal: at most 0.6x).

The GPU machine has no package index: build a Ray for its Python once, on the CPU machine, into the
repository's git-ignored `.ray/` folder, and carry that folder to the GPU machine:

    mkdir -p .ray && bash /work/shared/tools/ray-for-device.sh .ray/ray.tar.xz
    python3 scripts/gpu_cluster.py --ray-tar .ray/ray.tar.xz --out OUTDIR      # kind nvidia-h100-x2, ~5 min

`--ray-tar` takes the archive (extracted here into a temporary folder) or a folder it was extracted into.
Ray's modules and popkit's are compiled to bytecode first, as `pip install` does: the archive has none, and a
Python that must compile Ray's modules in each of its processes doubles the local instance's start.

1. The CUDA extensions of the 8 bundled submissions (4 tasks x cuda.py, pytorch.py) are built once, in
   parallel, so that no timed phase pays a cold build.
2. `popkit bench FILES --gpus 0`: every run one after another on GPU 0: the local verdicts, the baseline time.
3. `popkit bench FILES --cluster ray`: a local Ray instance over both GPUs (its start-up is in the time).
4. `ray start --head --block` started here (stopped after this phase, also on failure), then
   `popkit bench FILES --cluster ray:ADDRESS` joins it.
5. `popkit bench FILES --gpus 0` again: the baseline after the cluster phases as well as before them (the runs
   of one phase can take 15% longer than those of another); each phase's ratio is to the mean of the two.
`--pairs N` replaces phases 3-5 with N pairs of `--gpus 0` and `--cluster ray` in alternating order (the first
pair's `--gpus 0` is phase 2), for a ratio that one pair's scatter cannot decide. `--spread` adds to each pair
`popkit bench FILES --gpus 0,1`: popkit's own runs over both GPUs, without Ray, the control that tells Ray's cost
from that of two runs at once on this host (each of the three goes first in turn).
Every phase runs the same benchmark-mode runs with `--precompile`, so no phase skips a pre-step because an
earlier phase recorded it. Checks: each cluster report names its worker and GPU, both GPUs ran runs, every
verdict equals the local one. Writes OUTDIR/cluster.json (after each phase) and OUTDIR/cluster.md, and prints
the markdown table last. Exit 0 when the checks pass (the time ratio is reported, not enforced).
Every phase gets what is left of 540 s (a phase past it is stopped with SIGINT, which stops its Ray too).
`--dry-run` writes the plan and checks the files and the Ray archive, without a GPU. `--cpu --task DIR
--files ...` runs the whole flow on CPU slots (how this script is tested without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("vectoradd", "softmax", "grayscale", "vectorsum")
FILES = tuple(f"submissions/{task}/{kind}.py" for task in TASKS for kind in ("cuda", "pytorch"))
TOTAL_S = 540.0  # every phase's timeout is what is left of this (9 minutes, whatever hangs)
HEAD_READY_S = 90
SEQUENTIAL = ("sequential", "sequential_after")
PHASES = (("sequential", "`--gpus 0` (one GPU, one after another)"),
          ("embedded", "`--cluster ray` (local instance, start-up included)"),
          ("joined", "`--cluster ray:ADDRESS` (head started before)"),
          ("sequential_after", "`--gpus 0` again, after the cluster phases"))
_END = [time.monotonic() + TOTAL_S]


def left_s(floor: float = 30.0) -> float:
    """Seconds left of TOTAL_S (at least `floor`, so a late phase still gets a chance to say why)."""
    return max(floor, _END[0] - time.monotonic())


def ray_path(archive: Path, work: Path) -> Path:
    """The folder holding the `ray` package: `archive` itself, or where the .tar.xz is extracted."""
    if archive.is_dir():
        return archive
    dest = work / "ray"
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(dest), "-xJf", str(archive)], check=True, timeout=300)
    return dest


def compile_bytecode(folders: list[Path]) -> dict:
    """What `pip install` does after unpacking: each folder's modules compiled to __pycache__ (timed apart)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *map(str, folders)],
                          capture_output=True, text=True, timeout=300)
    return {"seconds": time.monotonic() - started, "exit": done.returncode, "tail": done.stdout[-400:]}


def child_env(ray_dir: Path | None, **extra: str) -> dict[str, str]:
    paths = [str(ROOT)] + ([str(ray_dir)] if ray_dir else []) + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def ray_version(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", "import ray; print(ray.__version__)"], env=env,
                          capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else f"not importable: {done.stderr.strip()[-200:]}"


def warm_builds(files: list[str], env: dict[str, str], work: Path) -> dict:
    """Import every file that builds a CUDA extension once, all at once (load_inline fills torch's build cache)."""
    started, procs = time.monotonic(), {}
    for rel in files:
        if b"load_inline" in (ROOT / rel).read_bytes() and "cuda" in rel:
            folder = work / "warm" / rel.replace("/", "_")
            folder.mkdir(parents=True)
            procs[rel] = subprocess.Popen([sys.executable, str(ROOT / rel)], cwd=folder, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    built = {}
    for rel, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=left_s())
            built[rel] = {"exit": proc.returncode, "tail": out[-400:]}
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            built[rel] = {"exit": None, "tail": "timed out"}
    return {"seconds": time.monotonic() - started, "builds": built}


def popkit_bench(files: list[str], extra: list[str], env: dict[str, str], task: str | None) -> dict:
    """One `popkit bench FILES ... --json` and its wall time (seconds)."""
    argv = [sys.executable, "-m", "popkit", "bench", *files, "--precompile", "--no-history", "--json", *extra]
    if task:
        argv += ["--task", task]
    started, limit = time.monotonic(), left_s()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # popkit cancels its runs and stops the Ray instance it started
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err = f"timed out after {limit:.0f} s (stopped with SIGINT)\n{err}"
    code = proc.returncode
    seconds = time.monotonic() - started
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    return {"argv": argv[2:], "exit": code, "seconds": seconds, "doc": doc, "stderr_tail": str(err)[-1500:]}


def run_times(phase: dict) -> dict:
    """The phase's runs as their reports time them: their sum, and the span from the first start to the last end."""
    doc = phase.get("doc") or {}
    reports = [r["report"] for r in doc.get("runs") or doc.get("results") or [] if r.get("report")]
    if not reports:
        return {}
    starts = [datetime.fromisoformat(r["started_at"]).timestamp() for r in reports]
    ends = [start + r["duration_s"] for start, r in zip(starts, reports)]
    return {"sum": sum(r["duration_s"] for r in reports), "span": max(ends) - min(starts)}


def baseline(result: dict) -> float | None:
    """One after another on one GPU: the mean of the phases that ran so (before and after the cluster)."""
    seconds = [result["phases"][name]["seconds"] for name in SEQUENTIAL if name in result["phases"]]
    return sum(seconds) / len(seconds) if seconds else None


def local_verdicts(phase: dict) -> list[str]:
    """Each file's outcome in the order given (`--gpus` keeps it)."""
    runs = (phase["doc"] or {}).get("runs", [])
    return [r["report"]["outcome"] if r.get("report") else f"error {r['error']['exit_code']}" for r in runs]


def cluster_rows(phase: dict) -> list[dict]:
    """Per file in the order given: outcome, the worker's GPUs and device, as the cluster's JSON reports them."""
    rows = []
    for r in sorted((phase["doc"] or {}).get("results", []), key=lambda r: r["index"]):
        worker = r.get("worker") or {}
        report = r.get("report") or {}
        system = report.get("system") or {}
        rows.append({"file": r["files"][0], "outcome": r["outcome"], "gpus": worker.get("gpus", []),
                     "device": system.get("device"), "failure": r.get("failure", ""),
                     "named": report.get("label", "").startswith("ray ") and bool(system.get("worker"))})
    return rows


def check(rows: list[dict], local: list[str], files: list[str], gpus: int) -> dict:
    used = sorted({g for row in rows for g in row["gpus"]})
    return {"all_results": [row["file"] for row in rows] == files and len(local) == len(files),
            "verdicts_equal": [row["outcome"] for row in rows] == local,
            "gpus_used": used, "every_gpu_used": len(used) >= gpus,
            "reports_name_worker": all(row["named"] for row in rows)}


def sequential_phase(files: list[str], env: dict[str, str], task: str | None, local: list[str] | None) -> dict:
    """`popkit bench FILES --gpus 0`; checked against `local` (the first such phase's verdicts) where given."""
    phase = popkit_bench(files, ["--gpus", "0"], env, task)
    if local is not None:
        phase["checks"] = {"verdicts_equal": local_verdicts(phase) == local, "gpus_used": ["0"]}
    return phase


def cluster_phase(files: list[str], spec: str, env: dict[str, str], task: str | None, local: list[str],
                  gpus: int) -> dict:
    """`popkit bench FILES --cluster SPEC`, its rows and their checks."""
    phase = popkit_bench(files, ["--cluster", spec], env, task)
    phase["rows"] = cluster_rows(phase)
    phase["checks"] = check(phase["rows"], local, files, gpus)
    return phase


def spread_phase(files: list[str], env: dict[str, str], task: str | None, local: list[str], gpus: int) -> dict:
    """`popkit bench FILES --gpus 0,1,...`: popkit's own runs over every GPU at once, without Ray."""
    indices = [str(i) for i in range(gpus or 2)]  # on CPU slots (no GPU): two, as `--cpu` assumes a GPU
    phase = popkit_bench(files, ["--gpus", ",".join(indices)], env, task)
    used = sorted({str(r["gpu"]) for r in (phase["doc"] or {}).get("runs", []) if r.get("gpu") is not None})
    phase["checks"] = {"verdicts_equal": local_verdicts(phase) == local, "gpus_used": used,
                       "every_gpu_used": used == indices}
    return phase


def pair_summary(pairs: list[dict]) -> dict:
    """Alternating pairs of the local instance against one GPU: each pair's ratio, their median, the sum ratio;
    under "spread" the same for `--gpus 0,1` where the pairs ran it."""
    def ratios(name: str) -> dict:
        each = [pair[name]["seconds"] / pair["sequential"]["seconds"] for pair in pairs]
        return {"ratios": each, "median": statistics.median(each),
                "sum_ratio": sum(p[name]["seconds"] for p in pairs) / sum(p["sequential"]["seconds"] for p in pairs)}

    summary = ratios("embedded")
    if all("spread" in pair for pair in pairs):
        summary["spread"] = ratios("spread")
    return summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(env: dict[str, str], gpus: int, cpus: int | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` as a child of this script; returns it and the address it prints."""
    port = free_port()
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(port), "--block",
            "--include-dashboard=false", "--disable-usage-stats", "--num-gpus", str(gpus)]
    if cpus is not None:
        argv += ["--num-cpus", str(cpus)]
    head = subprocess.Popen(argv, env={**env, "RAY_process_group_cleanup_enabled": "0"}, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HEAD_READY_S
    while time.monotonic() < deadline and head.poll() is None:
        found = re.search(r"--address='([^']+)'", log.read_text(errors="replace"))
        if found:
            return head, found.group(1)
        time.sleep(0.5)
    stop_head(head)
    raise RuntimeError(f"the Ray head did not start: {log.read_text(errors='replace')[-800:]}")


def wait_ready(address: str, env: dict[str, str], gpus: int) -> None:
    """Until the head's raylet offers its GPUs (the address is printed before)."""
    code = ("import logging, ray, time\n"
            f"ray.init(address={address!r}, logging_level=logging.ERROR, log_to_driver=False)\n"
            f"end = time.time() + {HEAD_READY_S}\n"
            f"while ray.cluster_resources().get('GPU', 0) < {gpus} and time.time() < end: time.sleep(0.5)\n"
            "print(ray.cluster_resources())\n")
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                   timeout=min(HEAD_READY_S + 60, left_s()))


def stop_head(head: subprocess.Popen) -> None:
    """SIGTERM to the blocking `ray start`: it drains and stops every process it started."""
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)


def pairs_markdown(result: dict) -> str:
    spread = any("spread" in pair for pair in result["pairs"])
    control = (" and `--gpus 0,1` (popkit's own runs over both GPUs, without Ray)" if spread else "")
    lines = [f"`--cluster ray`{control} against `--gpus 0` on {result['gpus']}x {result['card']} (Ray "
             f"{result['ray']}), in {len(result['pairs'])} groups of alternating order: {len(result['files'])} "
             f"benchmark-mode runs, `--precompile`; the CUDA builds were warm ({result['warm']['seconds']:.0f} s to "
             "build them first).", "",
             "| group | first | `--gpus 0` s | `--cluster ray` s | ratio | "
             + ("`--gpus 0,1` s | ratio | " if spread else "")
             + "runs' span s: cluster" + (" / `--gpus 0,1`" if spread else "") + " | verdicts = local |",
             "|---|---|---|---|---|" + ("---|---|" if spread else "") + "---|---|"]

    def span(phase: dict) -> str:
        seconds = run_times(phase).get("span")
        return "-" if seconds is None else f"{seconds:.1f}"

    for i, pair in enumerate(result["pairs"], 1):
        seq, emb, par = pair.get("sequential", {}), pair.get("embedded", {}), pair.get("spread", {})
        if not (seq and emb and (par or not spread)):
            continue
        cells = [str(i), pair["order"][0], f"{seq['seconds']:.1f}", f"{emb['seconds']:.1f}",
                 f"{emb['seconds'] / seq['seconds']:.2f}"]
        if spread:
            cells += [f"{par['seconds']:.1f}", f"{par['seconds'] / seq['seconds']:.2f}"]
        cells.append(span(emb) + (f" / {span(par)}" if spread else ""))
        equal = all(phase["checks"]["verdicts_equal"] for phase in (emb, par) if phase)
        cells.append("yes" if equal else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    summary = result.get("summary")
    for name, label in (("embedded", "`--cluster ray`"), ("spread", "`--gpus 0,1`")):
        part = summary if name == "embedded" else (summary or {}).get("spread")
        if part:
            lines += ["", f"{label}: sum ratio {part['sum_ratio']:.3f}; median of the ratios {part['median']:.3f} "
                          f"({min(part['ratios']):.2f}-{max(part['ratios']):.2f})."]
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    if result.get("pairs"):
        return pairs_markdown(result)
    base = baseline(result)
    lines = [f"`--cluster` on {result['gpus']}x {result['card']} (Ray {result['ray']}): {len(result['files'])} "
             f"benchmark-mode runs, `--precompile`; the CUDA builds were warm ({result['warm']['seconds']:.0f} s "
             "to build them first). One after another on one GPU: "
             + (f"{base:.1f} s, the mean of the `--gpus 0` phases." if base else "not measured."), "",
             "| phase | wall s | x one-after-another | runs' sum s | runs' span s | GPUs used | verdicts = local "
             "| reports name worker+GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label in PHASES:
        phase = result["phases"].get(name)
        if not phase:
            continue
        checks, times = phase.get("checks", {}), run_times(phase)
        ratio = f"{phase['seconds'] / base:.2f}" if base else "-"
        spans = " | ".join(f"{times[k]:.1f}" if k in times else "-" for k in ("sum", "span"))
        lines.append(f"| {label} | {phase['seconds']:.1f} | {ratio} | {spans} | "
                     f"{','.join(checks.get('gpus_used', ['0']))} | "
                     f"{'yes' if checks.get('verdicts_equal', True) else '**no**'} | "
                     f"{'yes' if checks.get('reports_name_worker', name in SEQUENTIAL) else '**no**'} |")
    lines += ["", "| submission | local | embedded (GPU) | joined (GPU) |", "|---|---|---|---|"]
    local = result.get("local", [])
    for i, f in enumerate(result["files"]):
        cells = []
        for name in ("embedded", "joined"):
            rows = result["phases"].get(name, {}).get("rows", [])
            row = rows[i] if i < len(rows) else None
            cells.append(f"{row['outcome']} ({','.join(row['gpus']) or 'CPU'})" if row else "-")
        lines.append(f"| {f} | {local[i] if i < len(local) else '-'} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def joined_and_after(result: dict, args: argparse.Namespace, env: dict[str, str], sequential_env: dict[str, str],
                     gpus: int, save: Callable[[], None]) -> None:
    """Phases 3-5, after the first one-GPU phase: the local instance, joined to a head, one GPU again."""
    result["phases"]["embedded"] = cluster_phase(args.files, "ray", env, args.task, result["local"], gpus)
    save()
    try:
        head, address = start_head(env, gpus, 2 if args.cpu else None, args.out / "ray-head.log")
    except RuntimeError as exc:
        result["head_error"] = str(exc)
        print(exc, file=sys.stderr)
    else:
        try:
            result["address"] = address
            joined_env = {**env, "RAY_AUTH_MODE": "token"}  # an explicit address gets Ray's token only when told
            wait_ready(address, joined_env, gpus)
            result["phases"]["joined"] = cluster_phase(args.files, f"ray:{address}", joined_env, args.task,
                                                       result["local"], gpus)
        finally:
            stop_head(head)
    save()
    result["phases"]["sequential_after"] = sequential_phase(args.files, sequential_env, args.task, result["local"])
    save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ray-tar", type=Path,
                        help="Ray built by ray-for-device.sh (.tar.xz, or its extracted folder)")
    parser.add_argument("--files", nargs="+", default=list(FILES), help="submissions, relative to the repository")
    parser.add_argument("--task", help="--task for every file (default: each file's directive)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU slots (tests this script without a GPU)")
    parser.add_argument("--pairs", type=int, default=0, metavar="N",
                        help="instead of phases 3-5: N pairs of `--gpus 0` and `--cluster ray`, in alternating order")
    parser.add_argument("--spread", action="store_true",
                        help="with --pairs: `--gpus 0,1` in each pair too (popkit's runs over both GPUs, no Ray)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.spread and not args.pairs:
        parser.error("--spread goes with --pairs N")
    args.out.mkdir(parents=True, exist_ok=True)
    missing = [f for f in args.files if not (ROOT / f).is_file()]
    if missing:
        print(f"no such submission: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.ray_tar is not None and not args.ray_tar.exists():
        print(f"--ray-tar {args.ray_tar}: not found (build it: mkdir -p .ray && bash "
              "/work/shared/tools/ray-for-device.sh .ray/ray.tar.xz)", file=sys.stderr)
        return 2
    _END[0] = time.monotonic() + TOTAL_S
    work = Path(tempfile.mkdtemp(prefix="popkit-gpu-cluster-"))
    try:
        ray_dir = ray_path(args.ray_tar.resolve(), work) if args.ray_tar else None
        env = child_env(ray_dir)
        result: dict = {"files": args.files, "ray": ray_version(env), "phases": {}}
        save = lambda: (args.out / "cluster.json").write_text(json.dumps(result, indent=1, default=str))  # noqa: E731
        if args.dry_run:
            result["plan"] = ["warm CUDA builds", "popkit bench FILES --gpus 0 --precompile",
                              "popkit bench FILES --cluster ray --precompile", "ray start --head --block",
                              "popkit bench FILES --cluster ray:ADDRESS --precompile", "stop the head",
                              "popkit bench FILES --gpus 0 --precompile"]
            save()
            print(f"Ray: {result['ray']}\nfiles: {' '.join(args.files)}\nwrote {args.out / 'cluster.json'}")
            return 0
        if args.cpu:
            gpus, card = 0, "CPU"
        else:
            import torch

            gpus = torch.cuda.device_count()
            card = torch.cuda.get_device_name() if gpus else "no GPU"
            if gpus < 2:
                print(f"needs a machine with 2 GPUs (this one has {gpus})", file=sys.stderr)
                return 11
        result.update(gpus=gpus, card=card)
        result["bytecode"] = compile_bytecode([ROOT / "popkit"] + ([ray_dir] if ray_dir else []))
        result["warm"] = warm_builds(args.files, env, work) if not args.cpu else {"seconds": 0.0, "builds": {}}
        save()
        # On CPU slots there is no GPU 0 to check for (popkit refuses `--gpus` it cannot find): say there is one.
        sequential_env = {**env, "POPKIT_ASSUME_GPU": "1"} if args.cpu else env
        sequential = sequential_phase(args.files, sequential_env, args.task, None)
        result["local"] = local_verdicts(sequential)
        result["phases"]["sequential"] = sequential
        save()
        if args.pairs:
            run = {"sequential": lambda: sequential_phase(args.files, sequential_env, args.task, result["local"]),
                   "embedded": lambda: cluster_phase(args.files, "ray", env, args.task, result["local"], gpus)}
            if args.spread:
                run["spread"] = lambda: spread_phase(args.files, sequential_env, args.task, result["local"], gpus)
            names = list(run)
            result["pairs"] = []
            for i in range(args.pairs):  # each goes first in turn, so that a drift of the machine falls on all
                order = names[i % len(names):] + names[:i % len(names)]
                pair = {"order": list(order)}
                result["pairs"].append(pair)
                for name in order:
                    pair[name] = sequential if (i, name) == (0, "sequential") else run[name]()
                    save()
            result["summary"] = pair_summary(result["pairs"])
            save()
        else:
            joined_and_after(result, args, env, sequential_env, gpus, save)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = markdown(result)
    (args.out / "cluster.md").write_text(text)
    print(text)
    return 0 if passed(result) else 1


def passed(result: dict) -> bool:
    """Every cluster phase: all results, the local verdicts, every GPU used, each report naming its worker; every
    later one-GPU phase: the first one's verdicts; every `--gpus 0,1` phase: those verdicts on every GPU."""
    phases = list(result["phases"].items()) + [(name, pair[name]) for pair in result.get("pairs", [])
                                                 for name in pair["order"]]
    clusters = [phase.get("checks", {}) for name, phase in phases if name not in SEQUENTIAL + ("spread",)]
    later = [phase["checks"] for name, phase in phases if name in SEQUENTIAL and "checks" in phase]
    spreads = [phase["checks"] for name, phase in phases if name == "spread"]
    pairs = len(result.get("pairs", []))
    enough = len(clusters) >= (pairs or 2) and len(later) >= (pairs - 1 if pairs else 1)
    return (enough and all(c.get("all_results") and c.get("verdicts_equal") and c.get("reports_name_worker")
                           and c.get("every_gpu_used") for c in clusters) and all(c["verdicts_equal"] for c in later)
            and all(c["verdicts_equal"] and c["every_gpu_used"] for c in spreads))


if __name__ == "__main__":
    sys.exit(main())
