"""Tests of ``tfdist.training.local_sgd``."""
