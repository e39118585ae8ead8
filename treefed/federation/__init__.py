"""treefed.federation."""
