"""The sandbox's build cache (popkit/toolchain/buildcache.py): private per run, shared only under the submission's own key,
verified when loaded, never following a link."""

from __future__ import annotations

from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run import sandbox
from popkit.toolchain import buildcache

FIX = Path(__file__).parent / "fixtures"
needs_sandbox = pytest.mark.skipif(bool(sandbox.unavailable()), reason="no sandbox here")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _built(folder: Path, library: bytes = b"ELF library") -> Path:
    ext = folder / "torch_extensions" / "py311_cu130" / "ext"
    ext.mkdir(parents=True)
    (ext / "ext.so").write_bytes(library)
    (ext / "build.ninja").write_text("rule cxx\n")
    (ext / "lock").write_text("")
    return ext


def test_a_build_is_shared_under_its_key_without_links_and_seeded_with_its_times(store):
    outside = store / "victim.txt"
    outside.write_text("mine\n")
    private = store / "run1"
    ext = _built(private)
    (ext / "planted.cpp").symlink_to(outside)
    assert buildcache.publish("k1", private)
    entry = buildcache.verified("k1")
    assert entry is not None and not (entry / "torch_extensions/py311_cu130/ext/planted.cpp").exists()
    assert not (entry / "torch_extensions/py311_cu130/ext/lock").exists()
    assert not buildcache.publish("k1", private)  # an entry is never replaced
    again = store / "run2"
    target = again / "torch_extensions" / "py311_cu130" / "ext"
    target.mkdir(parents=True)
    (target / "ext.so").symlink_to(outside)  # a link where the seed writes: replaced, never written through
    assert buildcache.seed("k1", again)
    assert (target / "ext.so").read_bytes() == b"ELF library" and not (target / "ext.so").is_symlink()
    assert (target / "ext.so").stat().st_mtime_ns == (ext / "ext.so").stat().st_mtime_ns
    assert outside.read_text() == "mine\n"


def test_an_entry_that_does_not_match_its_manifest_is_removed_never_seeded(store):
    private = store / "run1"
    _built(private)
    assert buildcache.publish("k2", private)
    entry = buildcache.verified("k2")
    (entry / "torch_extensions/py311_cu130/ext/ext.so").write_bytes(b"planted static initialiser")
    assert buildcache.verified("k2") is None and not entry.exists()
    assert not buildcache.seed("k2", store / "run2")


def test_nothing_is_shared_without_a_library_or_a_key(store):
    private = store / "run1"
    (private / "triton").mkdir(parents=True)
    (private / "triton" / "notes.txt").write_text("x")
    assert not buildcache.publish("k3", private) and not buildcache.publish("", private)


BUILDS = '''#!POPCORN leaderboard double
"""load_inline (named so that the pre-step runs): the pre-step "builds" a library into the extension cache and
an eval finds it there (or returns a wrong result)."""
import os
import sys

root = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "py", "fake")
if __name__ == "__main__":
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "fake.so"), "wb") as f:
        f.write(b"built")
    print("built into " + os.environ["TORCH_EXTENSIONS_DIR"])


def custom_kernel(data):
    return 2 * data if os.path.exists(os.path.join(root, "fake.so")) else -1
'''


@pytest.mark.slow
@needs_sandbox
def test_a_sandboxed_run_builds_privately_and_the_next_run_of_the_same_bytes_reuses_it(store, monkeypatch):
    """The build went into the shared ~/.cache/torch_extensions that a later `python file.py` loads: it goes into
    the run's private cache, then the store under the file's key; the user's cache is never written."""
    home = store / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    sub = store / "builds.py"
    sub.write_text(BUILDS)
    task = load_task(FIX / "tasks" / "double")
    first = runner.run_submission(task, sub, "test", runner.RunOptions(), system={"device": "test"},
                                  executor=sandbox.SandboxExecutor())
    assert first.outcome == "passed", [r.summary for r in first.runs]
    assert first.precompile is not None and "built into /var/cache/popkit/torch_extensions" in first.precompile.stdout
    assert not (home / ".cache" / "torch_extensions").exists()
    assert len([p for p in buildcache.store().iterdir() if p.is_dir()]) == 1
    second = runner.run_submission(task, sub, "test", runner.RunOptions(), system={"device": "test"},
                                   executor=sandbox.SandboxExecutor())
    assert second.outcome == "passed" and second.precompile is None, [r.summary for r in second.runs]


def test_only_popkits_own_build_folders_are_built_in_place(tmp_path, monkeypatch):
    """tune gives each extension `<popkit home>/build/tune-<digest>` (its variants share the build): that folder is
    bound as it is; any other TORCH_EXTENSIONS_DIR (the user's own, which an unsandboxed python loads) is not."""
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    keyed = tmp_path / "home" / "build" / "tune-0123456789abcdef"
    assert sandbox.keyed_build({"TORCH_EXTENSIONS_DIR": str(keyed)})
    assert not sandbox.keyed_build({"TORCH_EXTENSIONS_DIR": str(tmp_path / "mine")})
    assert not sandbox.keyed_build({"TORCH_EXTENSIONS_DIR": str(tmp_path / "home" / "build")})
    assert not sandbox.keyed_build({})
