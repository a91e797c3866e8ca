"""scripts/ray_start_cost.py: what a local Ray instance costs apart from the runs (docs/benchmarks.md, "The cluster (Ray)")."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ray_start_cost", ROOT / "scripts" / "ray_start_cost.py")
cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost)


def test_the_summary_gives_each_phases_range_and_the_totals():
    starts = [{"import": 1.0, "init": 6.0, "first_task": 0.5, "shutdown": 1.5},
              {"import": 1.5, "init": 7.0, "first_task": 0.75, "shutdown": 1.75}]
    assert cost.summary(starts) == ("2 starts: import 1.00-1.50 s, init 6.00-7.00 s, first task 0.50-0.75 s, "
                                    "shutdown 1.50-1.75 s; in all 9.00-11.00 s")


def test_bad_counts_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as info:
        cost.main(["--starts", "0"])
    assert info.value.code == 2 and "--starts and --cpus must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_one_start_on_the_cpu_times_every_phase(capsys):
    pytest.importorskip("ray")
    assert cost.main(["--starts", "1", "--cpus", "1"]) == 0
    first, last = capsys.readouterr().out.strip().splitlines()
    phases = json.loads(first)
    assert phases["gpu"] in (0, 1) and all(phases[name] > 0 for name in cost.PHASES)
    assert last.startswith("1 starts: import ")
