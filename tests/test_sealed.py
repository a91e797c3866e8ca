"""The sealed run (issue 20): attacks on popkit itself, under the sandbox and, where they can be closed
without it, with no isolation. Each attack file (tests/adversarial/) says its class in its docstring."""

from __future__ import annotations

import os
import py_compile
import signal
import threading
import time
from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run import sandbox
from popkit.run.executor import Executor, forged_byte_code

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = Path(__file__).parent / "adversarial"
TASKS = Path(__file__).parent / "fixtures" / "tasks"
NO_PROBE = {"device": "test"}

needs_sandbox = pytest.mark.skipif(bool(sandbox.unavailable()), reason=f"no sandbox here: {sandbox.unavailable()}")


def executors() -> list:
    """Every executor this machine has: the sandbox where namespaces work, and none."""
    found = [pytest.param(Executor(), id="none")]
    if not sandbox.unavailable():
        found.insert(0, pytest.param(sandbox.SandboxExecutor(), id="sandbox"))
    return found


def bundled(name: str):
    return load_task(ROOT / "tasks" / name)


@pytest.mark.slow
@pytest.mark.parametrize("executor", executors())
def test_a_planted_module_never_passes_a_wrong_kernel(executor):
    """Item 1: hmac.py, __future__.py and a forged reference byte code planted by the pre-step."""
    report = runner.run_submission(bundled("vectoradd"), ATTACKS / "plant_module.py", "test",
                                   runner.RunOptions(precompile=True), system=NO_PROBE, executor=executor)
    assert report.outcome == "failed", report.runs
    summary = report.runs[0].summary
    assert summary.startswith("harness tampering: the submission wrote ") and "hmac.py" in summary, summary
    assert "the leaderboard's next eval would import it in place of the real module" in summary


@pytest.mark.slow
@needs_sandbox
def test_nothing_of_popkit_is_within_reach_of_the_sandbox():
    """Items 2 and 3: keys in environments, pipes through /proc, the watchdog stopped and its status forged."""
    report = runner.run_submission(bundled("vectoradd"), ATTACKS / "reach_out.py", "test",
                                   runner.RunOptions(precompile=True), system=NO_PROBE,
                                   executor=sandbox.SandboxExecutor())
    assert report.outcome == "failed"
    assert report.precompile is not None and "reached: nothing" in report.precompile.stderr, report.precompile.stderr
    run = report.runs[0]
    # Inside the eval it may reach the processes of its own namespace (multiprocessing's resource tracker), never
    # the harness's result pipe or a key: the verdict is the wrong kernel's own.
    assert run.summary.startswith("check failed: test, test size: 1; seed: 4242: 1 of 1 elements mismatch"), run.summary
    assert "environ of" not in run.stderr, run.stderr[-2000:]


def test_byte_code_python_wrote_for_a_file_is_not_forged_and_other_code_is(tmp_path):
    """The workspace check removes every __pycache__; only byte code of other code than its source fails a run."""
    source = tmp_path / "submission.py"
    source.write_text("def custom_kernel(data):\n    return data[0] + data[1]\n")
    pyc = Path(py_compile.compile(str(source), doraise=True))
    assert pyc.parent.name == "__pycache__"
    assert not forged_byte_code(pyc, tmp_path)
    source.write_text("def custom_kernel(data):\n    return data[0] - data[1]\n")
    assert forged_byte_code(pyc, tmp_path)


@pytest.mark.slow
def test_an_honest_run_that_writes_byte_code_passes_without_the_sandbox():
    """Without the sandbox the eval imports the submission from its own folder; where Python writes byte code
    (PYTHONDONTWRITEBYTECODE unset, Python's default) that byte code is the submission's own, not tampering."""
    options = runner.RunOptions(env={"PYTHONDONTWRITEBYTECODE": ""})
    report = runner.run_submission(bundled("vectoradd"), ROOT / "submissions" / "vectoradd" / "pytorch.py", "test",
                                   options, system=NO_PROBE, executor=Executor())
    assert report.outcome == "passed", [r.summary for r in report.runs]


@pytest.mark.parametrize("executor", executors())
def test_cases_files_are_written_anew_whatever_the_pre_step_left(executor, tmp_path):
    """Item 4: a FIFO (popkit hung), a link out of the folder (popkit wrote through it), a folder (exit 70)."""
    target = tmp_path / "outside.txt"
    target.write_text("untouched")
    task = load_task(TASKS / "double")
    options = runner.RunOptions(precompile=True, env={"POPKIT_ATTACK_TARGET": str(target)})
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(report=runner.run_submission(
        task, ATTACKS / "cases_trap.py", "leaderboard", options, system=NO_PROBE, executor=executor)), daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "popkit hung on the cases file"
    report = done["report"]
    assert [r.mode for r in report.runs] == ["test", "benchmark", "leaderboard"]
    assert report.outcome == "passed", [r.summary for r in report.runs]
    assert target.read_text() == "untouched"


def test_a_huge_pipe_line_ends_within_the_timeout(tmp_path):
    """Item 5: 200 MB without a newline on the result pipe under live progress, 5 s timeout."""
    task = load_task(TASKS / "double")
    task = type(task)(**{**task.__dict__, "test_timeout": 5.0})
    sub = tmp_path / "flood.py"
    sub.write_text("import os\nfd = int(os.environ.get('POPCORN_FD', '-1'))\n"
                   "chunk = b'x' * (1 << 20)\n"
                   "for _ in range(200):\n    os.write(fd, chunk)\n"
                   "def custom_kernel(d):\n    return 2 * d\n")

    class Printer:
        lines: list = []

        def __call__(self, msg):
            pass

        def live(self, text, key=""):
            self.lines.append(text)

    start = time.monotonic()
    report = runner.run_submission(task, sub, "test", runner.RunOptions(precompile=False), progress=Printer(),
                                   system=NO_PROBE, executor=Executor())
    assert time.monotonic() - start < 5.0 + 5.0
    assert report.outcome in ("failed", "crashed", "timed_out")


@pytest.mark.parametrize("executor", executors())
def test_a_task_file_that_cannot_be_put_back_fails_the_run_and_leaves_no_folder(executor, tmp_path, monkeypatch):
    """Item 7: the submission makes its copy of the eval immutable (root) or read-only in a read-only folder."""
    seen: list[Path] = []
    real = Executor.new_workspace

    def spy(self, root):
        seen.append(root)
        return real(self, root)

    monkeypatch.setattr(Executor, "new_workspace", spy)
    sub = tmp_path / "lock.py"
    sub.write_text(LOCK)
    report = runner.run_submission(load_task(TASKS / "double"), sub, "test", runner.RunOptions(precompile=True),
                                   system=NO_PROBE, executor=executor)
    assert report.outcome == "failed"
    line = report.runs[0].summary
    assert line.startswith("harness tampering: the submission modified eval.py during the compile pre-step"), line
    assert seen and not any(p.exists() for p in seen)


LOCK = '''
import fcntl, os, struct
if __name__ == "__main__":
    with open("eval.py", "a") as f:
        f.write("# changed\\n")
    try:  # immutable: FS_IOC_SETFLAGS with FS_IMMUTABLE_FL (needs root on the host)
        fd = os.open("eval.py", os.O_RDONLY)
        fcntl.ioctl(fd, 0x40086602, struct.pack("l", 0x10))
        os.close(fd)
    except OSError:
        os.chmod("eval.py", 0o444)
        os.chmod(".", 0o555)
# load_inline: so the pre-step runs
def custom_kernel(d):
    return 2 * d
'''


def test_the_sandbox_spec_is_plain_arguments_and_any_path_comes_back_as_it_was():
    """The spec goes to the sandbox's process 1 as flag and value pairs (no JSON to import there): values that
    look like flags or the separator are still values; anything else is a usage error (exit 2)."""
    import subprocess
    import sys

    from popkit.run import _sandbox

    odd = ["/tmp/a b", "--", "--files", "/x=y", "/ü"]
    args = _sandbox.spec_args("/w/files", "/w/work", odd[:3], odd[3:])
    spec, argv = _sandbox.parse_spec(args + ["--", "python", "--", "x"])
    assert spec == {"files": "/w/files", "cwd": "/w/work", "writable": odd[:3], "visible": odd[3:]}
    assert argv == ["python", "--", "x"]
    for bad in (args, args + ["--"], ["--cwd", "/w", "--", "true"], ["--files"], ["--bogus", "x"] + args + ["--", "true"],
                ['{"files": "/w", "cwd": "/w", "writable": []}', "--", "true"]):
        assert _sandbox.parse_spec(bad) is None, bad
    done = subprocess.run([sys.executable, "-I", "-S", str(sandbox.SANDBOX_SCRIPT), "--files", "/w", "--", "true"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith("usage: _sandbox.py --files DIR --cwd DIR"), done.stderr


@needs_sandbox
def test_the_trial_is_remembered_per_boot_and_a_failed_setup_is_an_environment_problem(tmp_path, monkeypatch):
    from popkit.errors import EnvironmentProblem
    from popkit.run import proc

    monkeypatch.setattr(sandbox, "_TRIED", {})
    assert sandbox.unavailable() == "" and sandbox._trial_file().exists()
    monkeypatch.setattr(sandbox, "_try", lambda unshare: "must not run again")
    sandbox._TRIED.clear()
    assert sandbox.unavailable() == ""  # from the file: this boot already answered
    failed = proc.Finished(code=125, stdout="", stderr="popkit-sandbox: setup failed: mount /tmp: Permission denied\n",
                           seconds=0.1, timed_out=False)
    with pytest.raises(EnvironmentProblem) as info:
        sandbox.SandboxExecutor().finish(failed)
    assert info.value.message == "popkit's sandbox could not start: mount /tmp: Permission denied"
    assert not sandbox._trial_file().exists() and sandbox.unavailable() == "must not run again"


@needs_sandbox
def test_an_interpreter_under_tmp_stays_visible_in_the_sandbox(tmp_path):
    """The sandbox gives a fresh /tmp; a virtual environment living there (a CI's, a quick start's) is still
    the interpreter the evals run with, read-only."""
    import sys

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    wrapper = venv / "python3"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    report = runner.run_submission(load_task(TASKS / "double"), Path(__file__).parent / "fixtures" / "submissions" /
                                   "good.py", "test", runner.RunOptions(python=str(wrapper), precompile=False),
                                   system=NO_PROBE, executor=sandbox.SandboxExecutor())
    assert report.outcome == "passed", [r.summary + r.stderr[-500:] for r in report.runs]
    assert str(tmp_path / "venv") in sandbox.needed_paths(str(wrapper), {})


@needs_sandbox
def test_a_fresh_folder_on_popkits_import_path_does_not_cover_the_run_read_only(monkeypatch):
    """`python -m popkit` run from /tmp puts /tmp on popkit's import path, which the sandbox keeps visible; made
    visible whole, it covered the run's folders under /tmp read-only and every sandboxed run failed to start."""
    import sys
    import tempfile

    monkeypatch.setattr(sys, "path", [tempfile.gettempdir(), *sys.path])
    assert tempfile.gettempdir() in sandbox.needed_paths(sys.executable, {})
    report = runner.run_submission(load_task(TASKS / "double"), Path(__file__).parent / "fixtures" / "submissions" /
                                   "good.py", "test", runner.RunOptions(precompile=False), system=NO_PROBE,
                                   executor=sandbox.SandboxExecutor())
    assert report.outcome == "passed", [r.summary + r.stderr[-500:] for r in report.runs]


def _with_token(token: str) -> list[int]:
    """Processes on this machine whose environment holds `token` (popkit's, its watchdogs', the sandbox's)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.slow
@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="reads every process's environment (root)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_popkit_ends_every_sandboxed_process_and_a_detached_grandchild(tmp_path, sig):
    """A detached (setsid, double fork) grandchild inside the sandbox dies with popkit, even on SIGKILL."""
    import subprocess
    import sys
    import uuid

    token = f"popkit-test-{uuid.uuid4().hex}"
    cache = tmp_path / "cache"  # a build cache is writable in the sandbox: the attack logs there
    cache.mkdir()
    env = {**os.environ, "POPKIT_HOME": str(tmp_path / "home"), "TRITON_CACHE_DIR": str(cache),
           "POPKIT_ATTACK_LOG": str(cache / "attack.log"), "TOKEN": token,
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ATTACKS)))}
    popkit = subprocess.Popen([sys.executable, "-m", "popkit", "test", str(ATTACKS / "escape.py"), "--task",
                               str(TASKS / "double"), "--no-precompile", "--no-history"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (cache / "attack.log").exists():
        time.sleep(0.1)
    assert (cache / "attack.log").exists(), "the attack did not start"
    time.sleep(0.5)  # the grandchild detaches
    assert len(_with_token(token)) >= 4  # popkit, its watchdog, the sandbox's process 1, the eval and more
    popkit.send_signal(sig)
    popkit.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _with_token(token):
        time.sleep(0.1)
    assert not _with_token(token), [open(f"/proc/{p}/cmdline", "rb").read() for p in _with_token(token)]
