"""Every interval popkit prints: positive for a time, both ends in one unit."""

from __future__ import annotations

import re

from popkit.model.results import CaseResult
from popkit.views.common import format_interval, format_time
from popkit.views.running import _ci95


def test_format_interval_uses_one_unit_for_both_ends():
    assert format_interval(1_500.0, 2_500.0) == "[1.50, 2.50] µs"
    assert format_interval(900_000.0, 2_100_000.0) == "[0.90, 2.10] ms"
    assert format_interval(12.0, 15.5) == "[12.0, 15.5] ns"
    assert format_time(2_500.0) == "2.50 µs"  # the upper end is formatted as format_time would
    assert format_interval(3_200.0, 3_125_000.0) == "[0.0032, 3.1250] ms"  # the low end keeps two digits


def test_bench_interval_of_a_stalled_run_is_positive_and_in_one_unit():
    # On a loaded CPU a run printed `95% CI [-85489.25 ns, 690 µs]`: a few huge calls among small ones.
    samples = (20_000.0,) * 8 + (2_000_000.0,)
    case = CaseResult(kind="benchmark", index=0, spec="size: 1", passed=True, runs=9, mean_ns=sum(samples) / 9,
                      samples_ns=samples)
    text = _ci95(case)
    match = re.fullmatch(r"95% CI \[([\d.]+), ([\d.]+)\] (ns|µs|ms)", text)
    assert match, text
    assert 0 < float(match.group(1)) < float(match.group(2))


def test_bench_interval_from_err_alone_is_positive():
    case = CaseResult(kind="benchmark", index=0, spec="size: 1", passed=True, runs=3, mean_ns=100_000.0,
                      err_ns=80_000.0)
    text = _ci95(case)
    assert text == "95% CI [0.0032, 3.1253] ms", text  # t(2) = 4.30: exp(±4.30 · 0.8) around 100 µs
