"""treefed.client."""
