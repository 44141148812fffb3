"""The loopback TLS deployment (experiments/run/deployment.py), re-exported for the tests."""

from experiments.run.deployment import CONNECTION, OUTSIDE, FleetProxy, TLSSuperLink, nginx_binary

__all__ = ["CONNECTION", "OUTSIDE", "FleetProxy", "TLSSuperLink", "nginx_binary"]
