"""Tests of ``tfdist.training.fit``."""
