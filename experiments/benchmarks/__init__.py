"""What the bench/ scripts measure with: head-to-head comparisons and steady-round measurement."""
