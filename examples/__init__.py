"""Examples: real training runs with dualloss next to the loss code people write by hand.

Run from the repository root, e.g. ``python -m examples.focal_digits``.
"""
