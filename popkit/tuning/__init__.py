"""`popkit tune`: probes, the race, results, the optuna search, the frozen file, the workflow."""
