"""Tests of ``tfdist.training.health``."""
