"""treefed.transport."""
