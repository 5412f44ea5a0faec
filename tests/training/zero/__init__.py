"""Tests of ``tfdist.training.zero``."""
