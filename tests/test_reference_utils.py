"""tasks/utils.py: the element-wise check every bundled reference uses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("popkit_task_utils", Path(__file__).parents[1] / "tasks" / "utils.py")
utils = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(utils)


def test_equal_tensors_pass():
    a = torch.randn(5, 7)
    assert utils.compare(a, a.clone(), rtol=1e-5, atol=1e-5) == (True, "")


def test_mismatches_are_counted_and_the_first_listed_with_both_values():
    ref = torch.zeros(4, 4)
    out = ref.clone()
    out[1, 2], out[3, 3] = 1.0, float("nan")
    ok, msg = utils.compare(out, ref, rtol=1e-3, atol=1e-3)
    assert not ok
    assert msg.startswith("2 of 16 elements mismatch (rtol=0.001, atol=0.001); ")
    assert "at (1, 2): expected 0, got 1" in msg and "at (3, 3): expected 0, got nan" in msg


def test_tolerance_is_atol_plus_rtol_times_reference():
    ref = torch.tensor([100.0])
    assert utils.compare(torch.tensor([100.9]), ref, rtol=0.01, atol=0.0)[0]
    assert not utils.compare(torch.tensor([101.1]), ref, rtol=0.01, atol=0.0)[0]


@pytest.mark.parametrize("out,ref,ok", [
    (float("nan"), float("nan"), True),
    (float("inf"), float("inf"), True),
    (float("-inf"), float("inf"), False),
    (1.0, float("inf"), False),
    (float("nan"), 1.0, False),
])
def test_nan_and_inf_positions_must_match(out, ref, ok):
    assert utils.compare(torch.tensor([out]), torch.tensor([ref]), rtol=1e-2, atol=1e-2)[0] is ok


@pytest.mark.parametrize("out,msg", [
    ([1.0, 2.0], "expected a torch.Tensor, got list"),
    (torch.zeros(3), "shape mismatch: expected (2,), got (3,)"),
    (torch.zeros(2, dtype=torch.float64), "dtype mismatch: expected torch.float32, got torch.float64"),
])
def test_type_shape_and_dtype_are_checked_first(out, msg):
    assert utils.compare(out, torch.zeros(2), rtol=0, atol=0) == (False, msg)


def test_zero_dim_outputs():
    assert utils.compare(torch.tensor(3.0), torch.tensor(3.0), rtol=0, atol=0)[0]
    assert utils.compare(torch.tensor(3.0), torch.tensor(4.0), rtol=0, atol=0)[1].endswith("at (): expected 4, got 3")


def test_clone_data_clones_nested_tensors_only():
    a = torch.ones(2)
    data = {"x": (a, [a, 3]), "n": "s"}
    copy = utils.clone_data(data)
    assert copy["x"][0] is not a and torch.equal(copy["x"][0], a) and copy["x"][1][1] == 3 and copy["n"] == "s"
    assert isinstance(copy["x"], tuple) and isinstance(copy["x"][1], list)
