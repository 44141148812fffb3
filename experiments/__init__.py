"""Experiments from the command line: presets, `pflower run`, sweeps of runs, and reports across runs and seeds."""
