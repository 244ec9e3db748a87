"""Benchmarks of dualloss against the peer loss a user would otherwise call."""
