"""One table of GPUs: what each leaderboard name means, and the peaks of the cards torch names."""

from __future__ import annotations

import pytest

from popkit.model import gpus


@pytest.mark.parametrize("name,vendor,arch,count", [
    ("T4", "nvidia", "sm_75", 1), ("L4", "nvidia", "sm_89", 1), ("A100", "nvidia", "sm_80", 1),
    ("H100", "nvidia", "sm_90a", 1), ("B200", "nvidia", "sm_100", 1), ("MI300", "amd", "gfx942", 1),
    ("MI355X", "amd", "gfx950", 1), ("MI300x8", "amd", "gfx942", 8),
])
def test_each_leaderboard_name_means_one_card(name, vendor, arch, count):
    gpu = gpus.leaderboard_gpu(name)
    assert (gpu.vendor, gpu.arch, gpu.count) == (vendor, arch, count)
    assert gpu.bandwidth_bytes_per_s > 0 and gpu.fp16_flops_per_s > 0


def test_leaderboard_names_by_vendor_and_unknown_names():
    assert gpus.leaderboard_names(gpus.NVIDIA) == ["T4", "L4", "A100", "H100", "B200"]
    assert gpus.leaderboard_names(gpus.AMD) == ["MI300", "MI300x8", "MI355X"]
    assert gpus.leaderboard_gpu("H200") is None and gpus.leaderboard_gpu(None) is None  # a card, not a name
    assert {gpus.leaderboard_gpu(n).vendor for n in gpus.DEFAULT_GPU.values()} == {"nvidia", "amd"}


def test_torch_arch_is_the_arch_specific_variant_from_hopper_on():
    assert [gpus.leaderboard_gpu(n).torch_arch for n in gpus.leaderboard_names(gpus.NVIDIA)] == [
        "7.5", "8.9", "8.0", "9.0a", "10.0a"]
    assert gpus.leaderboard_gpu("MI300").torch_arch is None


def test_a_card_whose_name_contains_another_matches_first():
    names = [g.match for g in gpus.GPUS if g.match]
    for i, name in enumerate(names):
        assert not any(name in later for later in names[i + 1:]), f"{name} would hide a later card"
