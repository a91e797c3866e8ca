"""The sandbox's build cache: each run builds in a private folder, and shares only under its own digest.

A sandboxed run's processes (the compile pre-step, every eval) get a private cache folder of their workspace,
mounted at one fixed path inside the sandbox (`_sandbox.CACHE_MOUNT`: torch's JIT builds, Triton's cache,
CUDA's JIT cache under it), so that a build's own paths are the same in every run. Before the run's first
process it is seeded from the shared store entry of its key, when there is one and it verifies; after each
process, what the run built goes into the store under that key when the store has none yet.

The key (prestep.cache_key) is the digest of the submission's bytes (the sources and flags of an inline
extension are in them), torch's version, the interpreter and the build environment: a run can only ever
fill the entry of its own bytes, which only runs of those same bytes load, in the sandbox. The user's own
caches (~/.cache/torch_extensions, ~/.triton) are never shown to a sandboxed run, so nothing it wrote is
loaded by a process outside the sandbox. An entry is a folder of plain files and folders with a manifest
of every file's sha256; copying in and out follows no link and takes nothing but regular files and folders,
and an entry whose files do not match its manifest is removed, never seeded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from popkit.toolchain.prestep import cache_dir

STORE_NAME = "sandbox-builds"
MANIFEST = "manifest.json"
LIBRARY_SUFFIXES = (".so", ".pyd", ".dylib", ".cubin", ".hsaco")
FOLDERS = ("torch_extensions", "triton", "nv")  # under the mount: TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR, CUDA's
_VOLATILE = {"lock"}  # torch's build lock: never shared


def store() -> Path:
    return cache_dir() / STORE_NAME


def private_env(mount: str) -> dict[str, str]:
    """The environment that points torch, Triton and CUDA at the private cache mounted at `mount`."""
    return {"TORCH_EXTENSIONS_DIR": f"{mount}/torch_extensions", "TRITON_CACHE_DIR": f"{mount}/triton",
            "CUDA_CACHE_PATH": f"{mount}/nv"}


def make_private(folder: Path) -> None:
    for name in FOLDERS:
        (folder / name).mkdir(parents=True, exist_ok=True)


def _files(root: Path) -> dict[str, Path]:
    """Every regular file below `root` by its relative path; links, FIFOs and devices are left out, and no link
    to a folder is entered."""
    found: dict[str, Path] = {}
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append(Path(entry.path))
            elif stat.S_ISREG(mode) and entry.name not in _VOLATILE:
                found[str(Path(entry.path).relative_to(root))] = Path(entry.path)
    return found


def _digest(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _copy(files: dict[str, Path], to: Path) -> None:
    """Copy each regular file (with its times: ninja compares them) below `to`, writing no file through a link."""
    for relative, source in files.items():
        target = to / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out, open(source, "rb") as data:
            shutil.copyfileobj(data, out)
        st = source.stat(follow_symlinks=False)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755, follow_symlinks=False)


def verified(key: str) -> Path | None:
    """The store's entry of `key` when every file matches its manifest and nothing else is there; an entry that
    does not is removed."""
    entry = store() / key
    if not key or not entry.is_dir():
        return None
    try:
        manifest = json.loads((store() / f"{key}.json").read_text(encoding="utf-8"))
        files = _files(entry)
        if isinstance(manifest, dict) and set(manifest) == set(files) and all(
                _digest(files[name]) == digest for name, digest in manifest.items()):
            return entry
    except (OSError, ValueError):
        pass
    shutil.rmtree(entry, ignore_errors=True)
    (store() / f"{key}.json").unlink(missing_ok=True)
    return None


def seed(key: str, private: Path) -> bool:
    """Copy the verified entry of `key` into the private cache `private`; whether there was one."""
    entry = verified(key)
    if entry is None:
        return False
    _copy(_files(entry), private)
    return True


def publish(key: str, private: Path) -> bool:
    """Put what the run built in `private` into the store under `key`, when the store has no entry of it yet and a
    library was built; whole or not at all (a folder of its own, then a rename). Whether it did."""
    entry = store() / key
    if not key or entry.exists():
        return False
    files = _files(private)
    if not any(name.endswith(LIBRARY_SUFFIXES) for name in files):
        return False
    temp: Path | None = None
    try:
        store().mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=store()))
        _copy(files, temp)
        manifest = {name: _digest(temp / name) for name in _files(temp)}
        (store() / f"{key}.json").write_text(json.dumps(manifest), encoding="utf-8")
        os.rename(temp, entry)
    except OSError:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        return False
    return True
