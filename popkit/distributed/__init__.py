"""Runs on other machines: bundles, Ray, parity between workers, the scheduler and the worker."""
