"""Datasets, partitioners, per-client splits and test-time shift."""
