"""Tests of treefed.analysis: the Spark job and the report."""
