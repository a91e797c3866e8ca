"""Comparisons over runs: the A/B, shape-by-shape ratios, GPU-sized work on a CPU, Nsight Compute."""
