"""popkit: run GPU MODE leaderboard tasks locally, exactly as the leaderboard runner does."""

__version__ = "0.1.0"
