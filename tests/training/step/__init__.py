"""Tests of ``tfdist.training.step``."""
