"""treefed.analysis."""
