"""The model's Spark tests share tests/analysis's session (starting one costs seconds)."""

from tests.analysis.conftest import spark  # noqa: F401  (the session fixture)
