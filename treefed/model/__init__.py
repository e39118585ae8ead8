"""The analytic propagation model: spillage counted without emulating brokers.

``exact`` walks interest through an estate as the federation rules do (the reference),
``truth`` reads the same counts off a replay-engine run (the ground truth), and
``spark`` computes them as DataFrame propagation with counts of alike consumers.
"""
