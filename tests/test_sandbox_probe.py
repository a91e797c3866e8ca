"""The system probe (torch's and the GPU's facts, learned by running the evals' interpreter) runs in the evals'
sandbox: an interpreter whose start-up writes into HOME (a wrapper named as Python, as `--python` or an MCP call's
allowed `python` may name) reaches nothing of the user there, as root and as uid 65534."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from popkit.machine import system
from popkit.model.tasks import load_task
from popkit.operations import doctor
from popkit.run import runner
from popkit.run import sandbox

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = Path(__file__).parent / "fixtures" / "tasks" / "double"

needs_sandbox = pytest.mark.skipif(bool(sandbox.unavailable()), reason=f"no sandbox here: {sandbox.unavailable()}")


def wrapper(folder: Path, real: str) -> Path:
    """A `python` that leaves a file in HOME at every start, then runs the real interpreter."""
    path = folder / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(f'#!/bin/sh\necho "$$" > "$HOME/the-interpreter-was-here" 2>/dev/null\nexec {real} "$@"\n')
    path.chmod(0o755)
    return path


def test_a_script_the_probe_runs_goes_through_the_sandbox_only_where_one_is_in_force():
    plain = runner.Executor()
    plain.isolation = runner.sandbox.Isolation("none", "turned off for this run")
    assert sandbox.scripts(plain) is system.plain
    assert sandbox.scripts(sandbox.SandboxExecutor()) is not system.plain


@pytest.mark.slow
@needs_sandbox
def test_the_system_probe_runs_the_evals_interpreter_in_the_sandbox(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    python = wrapper(tmp_path, sys.executable)
    env = {"HOME": str(home)}
    # the wrapper does what it says when popkit runs it as a plain child (what the probe did)
    subprocess.run([str(python), "-c", "pass"], env={**os.environ, **env}, timeout=60, check=True)
    assert (home / "the-interpreter-was-here").exists()
    (home / "the-interpreter-was-here").unlink()
    options = runner.RunOptions(python=str(python), env=env, precompile=False)
    probe = runner.probe_and_preflight(load_task(DOUBLE), options, None, sandbox.SandboxExecutor())
    facts = probe.result()
    assert facts.get("torch") and facts.get("python") == "%d.%d.%d" % sys.version_info[:3], facts
    assert not facts.get("error"), facts
    assert list(home.iterdir()) == []


@pytest.mark.slow
@needs_sandbox
def test_doctor_runs_the_interpreter_it_checks_in_the_sandbox(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    python = wrapper(tmp_path, sys.executable)
    report = doctor.doctor(str(python))
    assert report.system.get("python") == "%d.%d.%d" % sys.version_info[:3], report.system
    assert list(home.iterdir()) == []


NOBODY_PROBE = '''
import os, sys
from pathlib import Path
from popkit.model.tasks import load_task
from popkit.operations import doctor
from popkit.run import runner, sandbox
assert not sandbox.unavailable(), sandbox.unavailable()
options = runner.RunOptions(python=sys.argv[1], env={"HOME": sys.argv[2]}, precompile=False)
facts = runner.probe_and_preflight(load_task(Path(sys.argv[3])), options, None, sandbox.SandboxExecutor()).result()
print("uid", os.getuid(), "python", facts.get("python"), "home", os.listdir(sys.argv[2]))
'''


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="starts popkit as uid 65534")
def test_as_uid_65534_the_system_probe_runs_in_the_sandbox_too():
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    python = next((p for p in ("/usr/bin/python3", sys.executable)
                   if subprocess.run([*nobody, p, "-c", "import popkit.run.runner"], env={"PYTHONPATH": str(ROOT)},
                                     capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no interpreter uid 65534 can run popkit with")
    # pytest's own folder is root's alone; /var/tmp, not /tmp (which every sandbox replaces with a fresh one)
    place = Path(tempfile.mkdtemp(prefix="popkit-nobody-", dir="/var/tmp"))
    try:
        os.chmod(place, 0o777)
        home = place / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        fake = wrapper(place, python)
        driver = place / "driver.py"
        driver.write_text(NOBODY_PROBE)
        os.chmod(driver, 0o644)
        env = {"PYTHONPATH": str(ROOT), "HOME": str(home), "PATH": "/usr/bin:/bin",
               "POPKIT_CACHE_DIR": str(place / "cache"), "TMPDIR": str(place)}
        subprocess.run([*nobody, str(fake), "-c", "pass"], env=env, timeout=60, check=True)
        assert (home / "the-interpreter-was-here").exists()  # as a plain child, the wrapper writes there
        (home / "the-interpreter-was-here").unlink()
        done = subprocess.run([*nobody, python, str(driver), str(fake), str(home), str(DOUBLE)], capture_output=True,
                              text=True, timeout=180, cwd=place, env=env)
    finally:
        shutil.rmtree(place, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.strip().splitlines()[-1]
    assert said.startswith("uid 65534 python 3.") and said.endswith(" home []"), said  # it ran, HOME untouched


@pytest.mark.slow
@needs_sandbox
def test_compile_reads_the_interpreters_toolchain_in_the_sandbox(tmp_path, monkeypatch):
    """`popkit compile --python P` learns P's torch by running P: in the sandbox, as every step that runs it."""
    from popkit.errors import PopkitError
    from popkit.run import compile as compiler

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "popkit-home"))
    python = wrapper(tmp_path, sys.executable)
    submission = tmp_path / "submission.py"
    submission.write_text("def custom_kernel(data):\n    return data * 2\n")
    try:
        compiler.compile_submission(submission, task=str(DOUBLE), python=str(python), timeout_s=120)
    except PopkitError:
        pass  # a file with no extension to build may be refused; what matters is where the interpreter ran
    assert list(home.iterdir()) == []
