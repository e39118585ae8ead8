"""treefed.analysis: the Spark comparison job (``job``) and its report (``report``).

The only package that imports pyspark; nothing is imported here, so ``treefed`` commands
that never report never load Spark or matplotlib.
"""
