"""The bare protocol run, independent of popkit's runner: a task's files flat in a folder, the eval run as
`python <main> MODE CASES` with a result pipe in POPCORN_FD, the pipe's `key: value` lines read back.

Used by scripts/gpu_multi.py, scripts/fidelity_sweep.py, scripts/gpu_inner_loop.py and scripts/gpu_verify.py
to compare popkit's verdict and time with the eval's own.
Reads task.yml itself (with yaml), so a popkit bug in loading a task cannot hide here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import yaml

MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def cases_text(cases: list[dict]) -> str:
    return "".join("; ".join(f"{k}: {v}" for k, v in case.items()) + "\n" for case in cases)


def lay_out(task_dir: Path, submission: str, work: Path) -> dict:
    """The task's files flat in `work`, the submission (source text) under its name; returns task.yml."""
    spec = yaml.safe_load((Path(task_dir) / "task.yml").read_text())
    for f in spec["files"]:
        target = Path(work) / f["name"]
        if f["source"] == "@SUBMISSION@":
            target.write_text(submission)
        else:
            shutil.copyfile(Path(task_dir) / f["source"], target)
    return spec


def bare_run(task_dir: Path, submission: str, mode: str, cases: list[dict] | None = None, *,
             gpus: int | None = None, timeout_s: float = 300.0, env: dict | None = None) -> dict:
    """Run the task's own eval on `submission` (source text) in `mode`; returns the pipe's keys plus
    `_exit` (the exit code, 114 on timeout) and `_passed` (exit 0/112 and `check: pass`)."""
    spec = yaml.safe_load((Path(task_dir) / "task.yml").read_text())
    if cases is None:
        cases = spec.get("tests", []) if mode == "test" else spec.get("benchmarks", [])
        if mode != "test" and spec.get("ranking_by", "last") == "last":
            cases = cases[-1:]
    work = Path(tempfile.mkdtemp(prefix="bare-eval-"))
    try:
        lay_out(task_dir, submission, work)
        (work / "cases.txt").write_text(cases_text(cases))
        read_fd, write_fd = os.pipe()
        child_env = {k: v for k, v in os.environ.items() if k not in ("POPCORN_FD", "POPCORN_SEED", "POPCORN_GPUS")}
        child_env.update(env or {}, POPCORN_FD=str(write_fd))
        if gpus is not None:
            child_env.update(MULTI_GPU_ENV, POPCORN_GPUS=str(gpus))
        chunks: list[bytes] = []

        def read() -> None:
            with os.fdopen(read_fd, "rb") as pipe:
                while chunk := pipe.read(65536):
                    chunks.append(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        proc = subprocess.Popen([sys.executable, spec["config"]["main"], mode, "cases.txt"], cwd=work,
                                env=child_env, pass_fds=(write_fd,), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        os.close(write_fd)
        try:
            _, err = proc.communicate(timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            _, err = proc.communicate()
            code = 114
        reader.join(10)
        result: dict = {}
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            if ":" in line:
                key, value = line.split(":", 1)
                result[key.strip()] = value.strip()
        result["_exit"] = code
        result["_passed"] = code in (0, 112) and result.get("check") == "pass"
        result["_stderr_tail"] = err.decode("utf-8", "replace")[-2000:]
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def mean_score_s(result: dict, ranking_by: str) -> float | None:
    """The score from a bare benchmark/leaderboard run's means, as the leaderboard combines them."""
    import math

    means = [float(result[f"benchmark.{i}.mean"]) / 1e9 for i in range(int(result.get("benchmark-count", 0)))
             if f"benchmark.{i}.mean" in result]
    if not means:
        return None
    if ranking_by == "last":
        return means[-1]
    if ranking_by == "mean":
        return sum(means) / len(means)
    return math.exp(sum(math.log(m) for m in means) / len(means))
