"""Tests of ``tfdist.training.backup``."""
