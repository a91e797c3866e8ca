"""The submission file on its way to a run: read once, validated, and what a failed run says about it."""
