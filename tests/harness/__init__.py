"""Test and benchmark harness: private local SuperLinks and loopback deployments (not shipped in the wheel)."""
