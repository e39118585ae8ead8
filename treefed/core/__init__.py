"""treefed.core."""
