"""Tests of ``tfdist.training.balance``."""
