"""Shared pytest setup: slow tests run with --run-slow (CI); GPU and nvcc markers skip where the machine cannot run them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _has_nvcc_build() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (each starts evals that import torch); CI runs them all")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc and a CUDA build of torch")
    # torch (4 of the 5 s a small test file took) is imported only when a collected test needs the answer
    wants = {name for item in items for name in ("gpu", "nvcc") if name in item.keywords}
    has_cuda = "gpu" in wants and _has_cuda()
    has_nvcc = "nvcc" in wants and _has_nvcc_build()
    run_slow = config.getoption("--run-slow") or os.environ.get("POPKIT_TEST_ALL") == "1"
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow (CI does)")
    from popkit.toolchain import hipbuild

    missing = hipbuild.find_tools().missing
    # CI installs the packages and sets POPKIT_REQUIRE_HIP=1, so there a missing one fails instead of skipping.
    skip_hip = pytest.mark.skip(reason="needs " + ", ".join(missing.values())) if missing else None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)
        if "hip" in item.keywords and skip_hip and not os.environ.get("POPKIT_REQUIRE_HIP"):
            item.add_marker(skip_hip)


@pytest.fixture(autouse=True)
def _private_popkit_cache(tmp_path_factory, monkeypatch):
    """popkit's build-cache index (prestep.py) per test: a pre-step recorded by one test never skips another's."""
    monkeypatch.setenv("POPKIT_CACHE_DIR", str(tmp_path_factory.mktemp("popkit-cache")))


@pytest.fixture(autouse=True)
def _private_user_data(tmp_path_factory, monkeypatch):
    """The per-user ledger ($XDG_DATA_HOME/popkit) of a test is its own, never the real user's."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


@pytest.fixture(autouse=True)
def _cold_ab_evals(monkeypatch):
    """An A/B in a test runs its evals cold unless the test starts warm pairs itself (warm.ahead_depth): what a
    test counts must not depend on how many CPUs the machine running it has (8 or more start warm pairs)."""
    from popkit.run import warm

    monkeypatch.setattr(warm, "ahead_depth", lambda cpus=None: 0)


CLI_WIDTH = "160"


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI test: a ledger of its own, a fixed width, no colour (CliRunner(env=...))."""
    return {"POPKIT_HOME": str(tmp_path / "ledger"), "POPKIT_WIDTH": CLI_WIDTH, "NO_COLOR": "1"}


@pytest.fixture
def cli(monkeypatch, tmp_path, cli_env):
    """popkit's app in-process as a user would call it, `cli("test", FILE, ...)`: `cli_env` set, the temporary
    folder as the working folder, and a system probe that answers at once (fixture tasks need no torch).
    A module that needs more (another width, no GPU) overrides this fixture and asks for it."""
    from typer.testing import CliRunner

    from popkit.cli import app

    for name, value in cli_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: {"device": "cpu", "torch": "x"})

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args))

    return invoke
