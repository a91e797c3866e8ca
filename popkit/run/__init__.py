"""One eval of the leaderboard's chain: child processes, the watchdog, the sandbox, the protocol, the runner, warm workers, compile-only runs."""
