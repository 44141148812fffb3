"""The server's math runs on one thread (BLAS and torch): no contention with the clients' workers, and the same
last bits on every machine."""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_info, threadpool_limits

from server_app.app import single_threaded_math


def test_the_server_sets_blas_and_torch_to_one_thread() -> None:
    threads = torch.get_num_threads()
    original = threadpool_limits(limits=None)  # remembers every pool's count, to restore after the test
    try:
        with threadpool_limits(limits=2):  # as on a 2-core machine
            torch.set_num_threads(2)
            single_threaded_math()
            pools = threadpool_info()
            assert pools and all(pool["num_threads"] == 1 for pool in pools)
            assert torch.get_num_threads() == 1
    finally:
        original.restore_original_limits()
        torch.set_num_threads(threads)
