"""Tests of ``tfdist.training.pipeline``."""
