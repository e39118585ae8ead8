"""treefed.persistence."""
