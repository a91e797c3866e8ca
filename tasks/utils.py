"""Helpers for popkit's bundled task references (reference.py files import this as `utils`).

Copied flat into the eval's working directory beside reference.py, so it imports nothing of popkit.
"""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """CUDA when available, else the CPU (so every bundled task also runs on a machine without a GPU)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_generator(seed: int, device: torch.device | None = None) -> torch.Generator:
    """A generator on `device` seeded with `seed`; the same seed gives the same inputs on one device kind."""
    gen = torch.Generator(device=device or default_device())
    gen.manual_seed(int(seed))
    return gen


def clone_data(data):
    """Clone every tensor in nested tuples, lists and dicts; other values are returned as they are."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    return data


def compare(output, expected: torch.Tensor, *, rtol: float, atol: float, max_report: int = 5) -> tuple[bool, str]:
    """Element-wise `|out - ref| <= atol + rtol*|ref|`; NaN and ±inf positions must match.

    Returns (ok, message); the message gives the number of mismatches and the first few indices
    with both values.
    """
    if not isinstance(output, torch.Tensor):
        return False, f"expected a torch.Tensor, got {type(output).__name__}"
    if output.shape != expected.shape:
        return False, f"shape mismatch: expected {tuple(expected.shape)}, got {tuple(output.shape)}"
    if output.dtype != expected.dtype:
        return False, f"dtype mismatch: expected {expected.dtype}, got {output.dtype}"
    # Compare where the data lives: leaderboard mode rechecks every timed call, and copying a large
    # output to the host each time would dominate the run. Only the reported mismatches move.
    out = output.detach().to(device=expected.device, dtype=torch.float64)
    ref = expected.detach().to(dtype=torch.float64)
    out_nan, ref_nan = torch.isnan(out), torch.isnan(ref)
    out_inf, ref_inf = torch.isinf(out), torch.isinf(ref)
    finite = ~(ref_nan | ref_inf | out_nan | out_inf)
    close = torch.zeros_like(out, dtype=torch.bool)
    close[finite] = (out[finite] - ref[finite]).abs() <= atol + rtol * ref[finite].abs()
    same_nan = out_nan & ref_nan
    same_inf = out_inf & ref_inf & (torch.sign(out) == torch.sign(ref))
    bad = ~(close | same_nan | same_inf)
    count = int(bad.sum())
    if count == 0:
        return True, ""
    out, ref, bad = out.cpu(), ref.cpu(), bad.cpu()
    where = torch.nonzero(bad, as_tuple=False)[:max_report]
    shown = []
    for idx in where.tolist():
        key = tuple(idx)
        shown.append(f"at {key}: expected {ref[key].item():.6g}, got {out[key].item():.6g}")
    return False, f"{count} of {bad.numel()} elements mismatch (rtol={rtol}, atol={atol}); " + "; ".join(shown)
