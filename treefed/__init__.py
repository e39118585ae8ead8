"""treefed: broker federation for organisations shaped like a tree."""

__version__ = "0.1.0"
