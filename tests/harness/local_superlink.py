"""The private local SuperLink the CLI uses, re-exported for the tests and benchmarks."""

from experiments.run.superlink import LocalSuperLink, RunOutcome, descendants, free_port, stop_process_tree

__all__ = ["LocalSuperLink", "RunOutcome", "descendants", "free_port", "stop_process_tree"]
