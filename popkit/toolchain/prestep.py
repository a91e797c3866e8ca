"""When the compile pre-step can be skipped without changing a verdict or a time.

The runner's pre-step (`python submission.py`, docs/protocol-notes.md §2) only warms the build cache of
`torch.utils.cpp_extension`. It is skipped when

- the submission has nothing to build: no `load_inline`, no `cpp_extension`, and no `__main__` block
  (the pre-step runs the file as `__main__`, so such a block could do anything); or
- the build cache already holds this exact source and flags. torch keys a JIT build by the
  extension's name (its folder under TORCH_EXTENSIONS_DIR, default `~/.cache/torch_extensions/
  py<ver>_<cu|rocm|cpu>/`) and rebuilds when the sources or flags change. The source and flags of an
  inline extension are in the submission's bytes, the compiler and arch in the environment. So after a
  pre-step that succeeded, popkit records the sha256 of (submission bytes, torch version, interpreter,
  build environment) with a fingerprint of every file under the extensions root (path, size, mtime).
  The next run skips the pre-step when the key is recorded and the fingerprint is unchanged: the
  built `.so` still exists and nothing rebuilt or rewrote the folder since (another submission with
  the same extension name would have).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from popkit.resources import user_dir, write_cache_json

BUILD_MARKERS = (b"load_inline", b"cpp_extension", b"__main__")
# Everything in the environment that changes what torch builds or where it puts it.
BUILD_ENV = ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "HOME", "TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM_ARCH",
             "CUDA_HOME", "CUDA_PATH", "ROCM_HOME", "ROCM_PATH", "CXX", "CC", "PATH", "CUDA_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES", "POPKIT_HIP_ON_CUDA")
# Files a no-op rebuild may touch; they do not decide what is built.
_VOLATILE = {"lock", ".ninja_log", ".ninja_deps"}
_MAX_ENTRIES = 500
INDEX_NAME = "prestep-index.json"

SKIP_NOTHING = "nothing to build"
SKIP_CACHED = "build cache holds this source"


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: str = ""  # why it is skipped (shown as `compile pre-step: skipped (REASON)`)
    key: str = ""  # the cache key to record after a pre-step that succeeded ("" when not recordable)


def cache_dir() -> Path:
    """popkit's cache folder: POPKIT_CACHE_DIR, else $XDG_CACHE_HOME/popkit, else ~/.cache/popkit."""
    explicit = os.environ.get("POPKIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return user_dir("XDG_CACHE_HOME", ".cache") / "popkit"


def needs_build(content: bytes) -> bool:
    return any(marker in content for marker in BUILD_MARKERS)


def extensions_root(env: Mapping[str, str]) -> Path:
    """Where torch's JIT builds go for this environment (all accelerator/python subfolders)."""
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return user_dir("XDG_CACHE_HOME", ".cache", env) / "torch_extensions"


def fingerprint(root: Path) -> str:
    """A digest of every file under `root` (path, size, mtime); "" when no built library is there."""
    entries, libraries = [], 0
    if not root.is_dir():
        return ""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name in _VOLATILE:
                continue
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:
                continue
            libraries += name.endswith((".so", ".pyd", ".dylib"))
            entries.append(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}")
    if not libraries:
        return ""
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def cache_key(content: bytes, python: str, env: Mapping[str, str]) -> str:
    """The key of one build: submission bytes, torch version, interpreter and build environment.

    "" when popkit cannot know the torch version without importing it (another interpreter via
    --python): then the pre-step always runs.
    """
    if Path(python).resolve() != Path(sys.executable).resolve():
        return ""
    from importlib import metadata  # late: a few ms that only this path needs, not every command's start-up

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""
    h = hashlib.sha256()
    h.update(content)
    h.update(f"\0{torch_version}\0{Path(python).resolve()}\0".encode())
    for name in BUILD_ENV:
        h.update(f"{name}={env.get(name, '')}\0".encode())
    return h.hexdigest()


def _index_path() -> Path:
    return cache_dir() / INDEX_NAME


def _read_index() -> dict[str, str]:
    try:
        data = json.loads(_index_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def decide(content: bytes, precompile: bool | None, python: str, env: Mapping[str, str],
           holds: Callable[[str], bool | None] = lambda _key: None) -> Decision:
    """Whether to run the pre-step: `precompile` True forces it, False skips it, None decides. `holds(key)`: whether
    the cache the run will see holds that build (a sandbox's store), None to judge the environment's own cache."""
    if precompile is False:
        return Decision(run=False)
    if precompile is None and not needs_build(content):
        return Decision(run=False, reason=SKIP_NOTHING)
    key = cache_key(content, python, env)
    if precompile is None and key:
        held = holds(key)
        if held is not None:
            return Decision(run=not held, reason=SKIP_CACHED if held else "", key=key)
        recorded = _read_index().get(key)
        if recorded and recorded == fingerprint(extensions_root(env)):
            return Decision(run=False, reason=SKIP_CACHED, key=key)
    return Decision(run=True, key=key)


def record(key: str, env: Mapping[str, str]) -> None:
    """After a pre-step that succeeded: remember that the build cache now holds this source.

    A cache that cannot be written only costs a pre-step next time; it never fails a run.
    """
    if not key:
        return
    stamp = fingerprint(extensions_root(env))
    if not stamp:
        return
    index = _read_index()
    index.pop(key, None)
    index[key] = stamp
    index = dict(list(index.items())[-_MAX_ENTRIES:])
    write_cache_json(_index_path(), index)
