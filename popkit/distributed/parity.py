"""What a worker machine is, so that results from several workers can be compared (`--cluster`).

Two timings compare only when the same kind of GPU ran them under the same driver, torch, CUDA/ROCm and
popkit. A worker gathers these facts (`facts`) before it runs anything; each result carries them. It
refuses a run (`refusal`: the run fails as `parity mismatch`) when its popkit differs from the one that sent
the run (another harness, report format or verdict rule) or when `--require-gpu` names another GPU kind.
The other facts may differ between workers; `differences` names those that did, so a view can say which
results are not comparable with each other.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit import __version__
from popkit.machine import nvml
from popkit.machine import system
from popkit.model.gpus import GPUS
from popkit.resources import harness_paths

# The facts two results must share to compare, in the order a view names them.
PARITY_KEYS = ("device", "driver", "torch", "cuda", "hip", "popkit")
_PACKAGE = Path(__file__).resolve().parents[1]  # popkit/


@functools.lru_cache(maxsize=1)
def popkit_identity() -> str:
    """popkit's version and a digest of its code and harness (`0.1.0+3f2a9c1b7d4e`): two installs that
    report the same identity run the same runner, harness and verdict rules."""
    h = hashlib.sha256()
    named = {p.relative_to(_PACKAGE).as_posix(): p for p in _PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    named.update({f"<harness>/{name}": path for name, path in harness_paths().items()})
    for name in sorted(named):
        try:
            data = named[name].read_bytes()
        except OSError:
            data = b""
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return f"{__version__}+{h.hexdigest()[:12]}"


def facts(python: str, env: Mapping[str, str], scripts: system.Scripts = system.plain) -> dict[str, Any]:
    """This machine as `python` sees it under `env` (system.probe, its scripts run by `scripts`), with the NVIDIA
    driver's version and popkit's identity. Never raises: what cannot be learned is None (system.probe's `error`
    says why)."""
    found = dict(system.probe(python, env=env, scripts=scripts))
    found["driver"] = nvml.system_driver_version()
    found["popkit"] = popkit_identity()
    return found


def card(device: str | None) -> str | None:
    """The GPU kind of a device as torch names it (`NVIDIA H100 80GB HBM3` -> `H100`), from popkit's GPU
    table; None for the CPU or a card the table does not know."""
    upper = (device or "").upper()
    return next((gpu.name for gpu in GPUS if gpu.match and gpu.match in upper), None)


def matches(device: str | None, wanted: str) -> bool:
    """Whether `device` is of the GPU kind `wanted` (a name of popkit's GPU table, or any part of the
    device's name for a card the table does not know)."""
    kind = card(device)
    if kind is not None and wanted.upper() in {gpu.name.upper() for gpu in GPUS}:
        return kind.upper() == wanted.upper()
    return wanted.upper() in (device or "").upper()


def refusal(found: Mapping[str, Any], popkit: str, require_gpu: str | None) -> str:
    """Why this worker must not run a bundle made by popkit `popkit` asking for `require_gpu` ("" if none)."""
    if found.get("popkit") != popkit:
        return (f"parity mismatch: the worker runs popkit {found.get('popkit')}, the run was sent by popkit "
                f"{popkit} (install the same popkit on every node)")
    if require_gpu and not matches(found.get("device"), require_gpu):
        return (f"parity mismatch: the worker's device is {found.get('device') or 'unknown'}, --require-gpu asked "
                f"for {require_gpu}")
    return ""


def describe(found: Mapping[str, Any]) -> str:
    """One line: `NVIDIA H100 80GB HBM3, driver 580.65.06, torch 2.8.0, CUDA 12.8`."""
    parts = [str(found.get("device") or "unknown device")]
    for key, label in (("driver", "driver"), ("torch", "torch"), ("cuda", "CUDA"), ("hip", "ROCm")):
        if found.get(key):
            parts.append(f"{label} {found[key]}")
    return ", ".join(parts)


def differences(all_facts: Sequence[Mapping[str, Any]]) -> list[str]:
    """`key: a, b` for each parity fact that differs between the given workers' facts."""
    out = []
    for key in PARITY_KEYS:
        values = sorted({str(f.get(key)) for f in all_facts})
        if len(values) > 1:
            out.append(f"{key}: {', '.join(values)}")
    return out
