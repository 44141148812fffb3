"""Run several algorithms on one federated setting and print accuracy at every shift degree, costs and time.

    python bench/compare.py --algorithms fedavg,local --dataset mnist --data-dir ../shared/data \\
        --clients 100 --rounds 30 --fraction 0.1 --epochs 5 --batch-size 64 --lr 0.05 --eval-every 5 \\
        [--engine inprocess|simulation]

The work is done by experiments/benchmarks/compare.py (shared with the benchmarks built on it).
"""

from experiments.benchmarks.compare import main

if __name__ == "__main__":
    main()
