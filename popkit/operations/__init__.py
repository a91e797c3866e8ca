"""The workflows every front end calls: test, bench, A/B, watch, doctor."""
