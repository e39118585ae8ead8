"""Estates: generate broker configs, import ActiveMQ's, forecast a move to the tree."""
