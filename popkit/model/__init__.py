"""What popkit reads and reports: tasks and problem sets, `#!POPCORN` directives, tune declarations, results, diagnostics, statistics."""
