"""treefed.node."""
