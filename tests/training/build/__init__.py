"""Tests of ``tfdist.training.build``."""
