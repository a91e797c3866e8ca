"""The sealed run: attacks on popkit itself, under the sandbox and, where they can be closed
without it, with no isolation. Each attack file (tests/adversarial/) says its class in its docstring."""

from __future__ import annotations

import os
import py_compile
import signal
import socket
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
    args = _sandbox.spec_args("/w/files", "/w/work", odd[:3], odd[3:], ["/i"], ["/h"], "--c")
    spec, argv = _sandbox.parse_spec(args + ["--", "python", "--", "x"])
    assert spec == {"files": "/w/files", "cwd": "/w/work", "writable": odd[:3], "visible": odd[3:], "imports": ["/i"],
                    "empty": ["/h"], "cache": "--c"}
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
    assert str(wrapper) in sandbox.sandbox_paths(str(wrapper), {})["visible"]


@needs_sandbox
def test_a_fresh_folder_on_popkits_import_path_does_not_cover_the_run_read_only(monkeypatch):
    """`python -m popkit` run from /tmp puts /tmp on popkit's import path, which the sandbox keeps visible; made
    visible whole, it covered the run's folders under /tmp read-only and every sandboxed run failed to start."""
    import sys
    import tempfile

    monkeypatch.setattr(sys, "path", [tempfile.gettempdir(), *sys.path])
    assert tempfile.gettempdir() in sandbox.sandbox_paths(sys.executable, {})["imports"]
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
    tmp = tmp_path / "tmp"  # popkit's working folders: the attack logs in the eval's own working folder
    tmp.mkdir()
    env = {**os.environ, "POPKIT_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp),
           "POPKIT_ATTACK_LOG": "attack.log", "TOKEN": token,
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ATTACKS)))}
    popkit = subprocess.Popen([sys.executable, "-m", "popkit", "test", str(ATTACKS / "escape.py"), "--task",
                               str(TASKS / "double"), "--no-precompile", "--no-history"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(tmp.glob("popkit-run-*/work/attack.log")):
        time.sleep(0.1)
    assert list(tmp.glob("popkit-run-*/work/attack.log")), "the attack did not start"
    time.sleep(0.5)  # the grandchild detaches
    assert len(_with_token(token)) >= 4  # popkit, its watchdog, the sandbox's process 1, the eval and more
    popkit.send_signal(sig)
    popkit.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _with_token(token):
        time.sleep(0.1)
    assert not _with_token(token), [open(f"/proc/{p}/cmdline", "rb").read() for p in _with_token(token)]


@pytest.mark.slow
@pytest.mark.parametrize("executor", executors())
def test_start_up_files_the_submission_writes_are_never_imported(executor):
    """sitecustomize, usercustomize, _distutils_hack, a .pth and a user site planted in the working folder, with an
    empty PYTHONPATH entry and PYTHONUSERBASE pointing there: no eval imports them, and the run is tampering."""
    options = runner.RunOptions(precompile=True, env={"PYTHONPATH": ":/nonexistent", "PYTHONUSERBASE": "."})
    report = runner.run_submission(bundled("vectoradd"), ATTACKS / "plant_startup.py", "test", options,
                                   system=NO_PROBE, executor=executor)
    assert report.outcome == "failed", [r.summary for r in report.runs]
    summary = report.runs[0].summary
    assert summary.startswith("harness tampering: the submission wrote "), summary
    for name in ("sitecustomize.py", "usercustomize.py", "_distutils_hack.py", "zz-forge.pth", "lib"):
        assert name in summary, summary
    assert "start-up file ran" not in report.runs[0].stderr


def test_pythonpath_entries_become_absolute_and_empty_ones_go(tmp_path):
    from popkit.run.executor import closed_env
    env = closed_env({"PYTHONPATH": ":rel::/abs/x"}, base=str(tmp_path))
    assert env["PYTHONPATH"] == f"{tmp_path / 'rel'}:/abs/x"
    assert env["PYTHONNOUSERSITE"] == "1"
    assert "PYTHONPATH" not in closed_env({"PYTHONPATH": "::"}, base=str(tmp_path))


def _secrets(tmp_path: Path) -> tuple[dict[str, str], list[socket.socket]]:
    """A HOME with dotfiles and an agent socket, a PYTHONPATH folder with a module, a secret and a socket, another
    project: the environment of look_around.py, and the listening sockets (closed by the caller)."""
    home, lib, other = tmp_path / "home", tmp_path / "lib", tmp_path / "project"
    for folder in (home / ".config", lib, other / ".git"):
        folder.mkdir(parents=True)
    reads = {home / ".npmrc": "npm-token", home / ".config" / "gh.yml": "gh-token", lib / "secret.txt": "lib-key",
             other / ".git" / "config": "git-cred", home / ".popcorn.yaml": "popcorn-key"}
    for path, text in reads.items():
        path.write_text(f"SECRET-{text}\n")
    (lib / "helper.py").write_text("VALUE = 1\n")
    servers = []
    for path in (home / "agent.sock", lib / "agent.sock"):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(4)
        threading.Thread(target=lambda s=server: _answer(s), daemon=True).start()
        servers.append(server)
    os.chmod(tmp_path, 0o755)
    for path in tmp_path.rglob("*"):
        os.chmod(path, 0o777 if path.is_dir() or path.is_socket() else 0o644)
    read = [str(p) for p in reads] + ["/etc/shadow", str(Path.home() / ".bashrc")]
    env = {"HOME": str(home), "PYTHONPATH": str(lib), "POPKIT_ATTACK_READ": ":".join(read),
           "POPKIT_ATTACK_CONNECT": ":".join(str(s.getsockname()) for s in servers)}
    return env, servers


def _answer(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.sendall(b"SECRET-socket")
        conn.close()


@pytest.mark.slow
@needs_sandbox
def test_the_sandbox_shows_nothing_of_the_user_and_no_socket_answers(tmp_path):
    """Item 1 and 2: dotfiles in HOME, another project, /etc/shadow, a secret beside a PYTHONPATH module and
    unix sockets a host process listens on: none is readable or reachable from inside, the module is."""
    env, servers = _secrets(tmp_path)
    try:
        report = runner.run_submission(load_task(TASKS / "double"), ATTACKS / "look_around.py", "test",
                                       runner.RunOptions(precompile=False, env=env), system=NO_PROBE,
                                       executor=sandbox.SandboxExecutor())
    finally:
        for server in servers:
            server.close()
    assert report.outcome == "passed", [r.summary for r in report.runs]
    stderr = report.runs[0].stderr
    assert "reached: nothing" in stderr, stderr[-3000:]
    # HOME is an empty folder (the build cache is the run's own, elsewhere); /run is fresh
    assert "listed HOME: []; listed /run: []" in stderr, stderr[-3000:]
    assert "SECRET" not in repr(report.to_json())


def test_a_negative_trial_is_never_kept_nor_believed(tmp_path, monkeypatch):
    """Item 4: a trial record claiming `no` (a compile once wrote one with a reason of its choosing and switched the
    sandbox off until reboot) is not believed, and a negative answer is not written."""
    import json

    monkeypatch.setenv("POPKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sandbox, "_TRIED", {})
    stamp = sandbox._trial_stamp(None)
    sandbox._trial_file().write_text(json.dumps({"stamp": stamp, "reason": "namespaces (user, pid, forged)"}))
    calls = []
    monkeypatch.setattr(sandbox, "_try", lambda unshare: calls.append(1) or "no unshare here")
    assert sandbox.unavailable() == "no unshare here" and calls == [1]
    assert json.loads(sandbox._trial_file().read_text())["reason"] == "namespaces (user, pid, forged)"  # untouched
    sandbox._trial_file().unlink()
    sandbox._TRIED.clear()
    assert sandbox.unavailable() == "no unshare here" and not sandbox._trial_file().exists()


def test_isolation_none_never_reads_like_a_level():
    from popkit.run.executor import Isolation
    from popkit.views.running import isolation_line

    forged = Isolation("none", "namespaces (user, pid, mount)")
    assert str(forged) == "none, no sandbox: namespaces (user, pid, mount)"
    assert isolation_line(forged.to_json()) == str(forged)
    assert isolation_line(Isolation("namespaces", "user, pid").to_json()) == "namespaces (user, pid)"


NOBODY_RUN = '''
import os, sys
from popkit.run import sandbox
assert not sandbox.unavailable(), sandbox.unavailable()
with sandbox.SandboxExecutor().workspace() as ws:
    for folder in (ws.files, ws.cwd):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "probe.py").write_text(open(sys.argv[1]).read())
    done = ws.run(sys.executable, "probe.py", [], dict(os.environ), 60)
print(done.stdout + done.stderr)
'''


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="starts popkit as uid 65534")
def test_as_uid_65534_the_root_built_from_nothing_shows_nothing_of_the_user():
    """The same sandbox when popkit itself runs as uid 65534: a secret readable by every user and a unix socket
    a host process listens on, beside the caller's files, are neither readable nor reachable."""
    import subprocess
    import sys

    python = next((p for p in ("/usr/bin/python3", sys.executable)
                   if subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", p, "-c",
                                      "import popkit.run.sandbox"], env={"PYTHONPATH": str(ROOT)},
                                     capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no interpreter uid 65534 can run popkit with")
    import shutil
    import tempfile

    # pytest's own folder is root's alone; /var/tmp, not /tmp (which every sandbox replaces with a fresh one)
    place = Path(tempfile.mkdtemp(prefix="popkit-nobody-", dir="/var/tmp"))
    os.chmod(place, 0o777)
    (place / "secret.txt").write_text("SECRET-file\n")
    os.chmod(place / "secret.txt", 0o644)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(place / "agent.sock"))
    os.chmod(place / "agent.sock", 0o777)
    server.listen(1)
    threading.Thread(target=lambda: _answer(server), daemon=True).start()
    probe = place / "probe.py"
    probe.write_text("import os, socket\nreached = []\n"
                     f"try:\n    reached.append(open({str(place / 'secret.txt')!r}).read())\n"
                     "except OSError:\n    pass\n"
                     "try:\n    s = socket.socket(socket.AF_UNIX)\n"
                     f"    s.connect({str(place / 'agent.sock')!r}); reached.append(s.recv(64).decode())\n"
                     "except OSError:\n    pass\n"
                     "print('uid', os.getuid(), 'reached', reached or 'nothing', 'root', sorted(os.listdir('/')))\n")
    os.chmod(probe, 0o644)
    driver = place / "driver.py"
    driver.write_text(NOBODY_RUN)
    os.chmod(driver, 0o644)
    try:
        done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", python,
                               str(driver), str(probe)], capture_output=True, text=True, timeout=120, cwd=place,
                              env={"PYTHONPATH": str(ROOT), "HOME": str(place), "PATH": "/usr/bin:/bin",
                                   "POPKIT_CACHE_DIR": str(place / "cache"), "TMPDIR": str(place)})
    finally:
        server.close()
        shutil.rmtree(place, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "uid 65534 reached nothing" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "SECRET" not in done.stdout
