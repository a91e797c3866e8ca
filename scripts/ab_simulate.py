#!/usr/bin/env python3
"""The A/B's decision rule on simulated rounds (popkit/measure/absim.py): false winners and power, on the CPU.

    python3 scripts/ab_simulate.py --out OUTDIR [--trials 400] [--seed 0]

For each noise profile (what one eval's time is made of, docs/timing.md) and each true ratio B / A
(1.0: identical arms; 1.01, 1.05, 1.7), `--trials` simulated default A/Bs of four shapes (8 rounds at
most, a 60 s budget, evals of 5 s), every shape verdict counted. Writes OUTDIR/ab_simulate.json and
prints a table: the share of shape verdicts that named a winner (identical arms: false winners, the rule
promises at most 5%) or named the right one, mean rounds and mean simulated seconds per A/B.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popkit import api  # noqa: E402

Noise = api.SimNoise

PROFILES = {
    # sd of a round's log ratio about 0.002: the 100 us shapes of the identical-file A/Bs on an H100 gave 95%
    # intervals of +-0.3-0.6% at 4 rounds (docs/benchmarks.md section 10), i.e. an sd of 0.0014-0.0029
    "100 us shapes, H100": Noise(process_sd=0.001, shape_sd=0.0007, order=0.001, drift=0.0003),
    "100 us shapes, twice that noise": Noise(process_sd=0.002, shape_sd=0.0014, order=0.002, drift=0.0006),
    "10 us shapes": Noise(process_sd=0.02, shape_sd=0.01),
    "10 us shapes, stalls every 5th eval": Noise(process_sd=0.02, shape_sd=0.01, stall=0.2),
}
RATIOS = (1.0, 1.01, 1.05, 1.7)


def table(rows: list[dict]) -> str:
    lines = ["| noise | B / A | shape verdicts | named | named right | rounds | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["outcome"]
        right = "-" if r["ratio"] == 1.0 else f"{o['right'] / o['verdicts']:.1%}"
        lines.append(f"| {r['profile']} | {r['ratio']} | {o['verdicts']} | {o['named'] / o['verdicts']:.1%} | "
                     f"{right} | {o['rounds']:.2f} | {o['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for k, (name, noise) in enumerate(PROFILES.items()):
        for ratio in RATIOS:
            outcome = api.simulate_ab(args.trials, ratio, noise, seed=args.seed + k)
            rows.append({"profile": name, "noise": asdict(noise), "ratio": ratio, "outcome": outcome.to_json()})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab_simulate.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
