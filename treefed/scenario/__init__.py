"""treefed.scenario."""
