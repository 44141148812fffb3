"""Running experiments: presets, runs and sweeps, the two launchers, preflight checks, data exports."""
