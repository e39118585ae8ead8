"""treefed.wire."""
