"""The leakage audit: gradient inversion on one round's upload (`pflower privacy`)."""
