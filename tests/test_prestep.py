"""The compile pre-step runs only where it can warm the build cache; a skip is said in one line."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.toolchain import prestep

FIX = Path(__file__).parent / "fixtures"
DOUBLE = load_task(FIX / "tasks" / "double")
NO_PROBE = {"device": "test"}

# Stands in for a load_inline submission: its pre-step "builds" a library into the extensions root,
# as torch.utils.cpp_extension would (the name `load_inline` in the text is what marks it).
FAKE_BUILD = textwrap.dedent('''\
    #!POPCORN leaderboard double
    # uses torch.utils.cpp_extension.load_inline (faked: the pre-step writes the library)
    import os
    from pathlib import Path

    if __name__ == "__main__":
        lib = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "py_cpu" / "double_ext" / "double_ext.so"
        lib.parent.mkdir(parents=True, exist_ok=True)
        if not lib.exists():
            lib.write_bytes(b"built")
        with open(os.environ["PRESTEP_LOG"], "a") as f:
            f.write("ran\\n")


    def custom_kernel(data):
        return 2 * data
    ''')

PURE = "#!POPCORN leaderboard double\n\ndef custom_kernel(data):\n    return 2 * data\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("PRESTEP_LOG", str(tmp_path / "prestep.log"))
    return tmp_path


def _run(path: Path, **opts):
    lines: list[str] = []
    # isolation none: the fake build's log lies outside the workspace, where a sandboxed process cannot write
    report = runner.run_submission(DOUBLE, path, "test", runner.RunOptions(isolation="none", **opts),
                                   progress=lines.append, system=NO_PROBE)
    return report, lines


def _pre_steps(tmp_path: Path) -> int:
    log = tmp_path / "prestep.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_nothing_to_build_skips_the_pre_step_and_says_so(env):
    path = env / "pure.py"
    path.write_text(PURE)
    report, lines = _run(path)
    assert report.outcome == "passed" and report.precompile is None
    assert report.precompile_skipped == "nothing to build"
    assert "compile pre-step: skipped (nothing to build)" in lines


@pytest.mark.slow
def test_warm_build_cache_skips_the_pre_step_until_the_cache_changes(env):
    path = env / "mine.py"
    path.write_text(FAKE_BUILD)
    first, _ = _run(path)
    assert first.precompile is not None and first.precompile.ok and _pre_steps(env) == 1

    second, lines = _run(path)
    assert second.precompile is None and second.outcome == first.outcome == "passed"
    assert "compile pre-step: skipped (build cache holds this source)" in lines
    assert _pre_steps(env) == 1

    forced, _ = _run(path, precompile=True)  # --precompile
    assert forced.precompile is not None and _pre_steps(env) == 2

    lib = env / "ext" / "py_cpu" / "double_ext" / "double_ext.so"
    os.utime(lib, ns=(1, 1))  # another build replaced the library: the cache no longer holds this source
    again, _ = _run(path)
    assert again.precompile is not None and _pre_steps(env) == 3

    lib.unlink()  # a cleared cache: the pre-step runs and rebuilds
    _run(path)
    assert _pre_steps(env) == 4 and lib.exists()

    path.write_text(FAKE_BUILD + "# changed\n")  # other bytes: another key
    _run(path)
    assert _pre_steps(env) == 5


def test_no_precompile_never_runs_it(env):
    path = env / "mine.py"
    path.write_text(FAKE_BUILD)
    report, lines = _run(path, precompile=False)
    assert report.precompile is None and _pre_steps(env) == 0
    assert not any("compile pre-step" in line for line in lines)


def test_a_failed_pre_step_is_not_recorded(env):
    path = env / "mine.py"
    path.write_text(FAKE_BUILD.replace('f.write("ran\\n")', 'f.write("ran\\n")\n        raise SystemExit(3)'))
    _run(path)
    _run(path)
    assert _pre_steps(env) == 2


def test_another_interpreter_always_runs_the_pre_step(env):
    assert prestep.cache_key(b"x", "/usr/bin/env", {}) == ""


def test_cli_prints_the_skip_line(env, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_WIDTH", "120")
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: {"device": "cpu"})
    path = env / "mine.py"
    path.write_text(FAKE_BUILD)
    args = ["test", str(path), "--task", str(FIX / "tasks" / "double"), "--no-history"]
    CliRunner().invoke(app, args)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "compile pre-step: skipped (build cache holds this source)" in result.stdout
