"""What popkit remembers and sends: the history, comparisons of recorded runs, popcorn-cli, submit."""
