"""What this machine is and can run: NVML, torch's build, the environment probe, task needs."""
