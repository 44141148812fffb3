"""FedAMP / HeurFedAMP server step at scale: vectorised (Gram matrix + GEMM) vs a direct double loop.

For m clients x d parameters (float32 rows), one server round is: store the round's uploads (a fraction of
the rows), compute the attention weights xi and the cloud models u_i of the next round's sampled clients.
Three ways are timed:
  incremental  the strategy's way: the uploaded rows update the cached Gram matrix (k x d by d x m), then xi
               and U = xi[S] W (one GEMM)
  full         Gram matrix from scratch (m x d by d x m), xi, U for the sampled clients
  loop         per sampled client i, per client j: ||w_i - w_j||^2 (or cos), then u_i = sum_j xi_ij w_j
The loop is timed on `--loop-clients` sampled clients and scaled to all of them (said in the table).
Peak memory is the largest extra allocation traced during the step (tracemalloc sees numpy buffers),
on top of the model matrix itself.

    python bench/fedamp_scale.py                       # m in {100, 1000}, d = 1M, 10% per round
    python bench/fedamp_scale.py --clients 100 --params 100000
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from common.methods.attention import (
    ModelMatrix,
    cloud_models,
    fedamp_weights_from_gram,
    gram_rows,
    heurfedamp_weights_from_gram,
)


def attention(G: np.ndarray, heur: bool) -> np.ndarray:
    """xi from a Gram matrix (FedAMP exp-distance or HeurFedAMP cosine softmax)."""
    if heur:
        return heurfedamp_weights_from_gram(G, sigma=25.0, tau=0.95)
    return fedamp_weights_from_gram(G, alpha_k=1.0, sigma=1e4)[0]


def measured(step) -> tuple[float, float, object]:
    """(seconds, peak traced MB, result) of one call."""
    tracemalloc.start()
    t0 = time.perf_counter()
    out = step()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak, out


def loop_step(W: np.ndarray, sampled: list[int], heur: bool) -> np.ndarray:
    """The direct implementation: Python loops over client pairs, one vector operation per pair."""
    m = W.shape[0]
    out = np.zeros((len(sampled), W.shape[1]), dtype=np.float32)
    for row, i in enumerate(sampled):
        wi = W[i].astype(np.float64)
        if heur:
            ni = np.linalg.norm(wi)
            scores = np.array(
                [
                    np.exp(25.0 * float(wi @ W[j]) / (ni * np.linalg.norm(W[j]) + 1e-30)) if j != i else 0.0
                    for j in range(m)
                ]
            )
            weights = 0.95 * scores / scores.sum()
            weights[i] = 0.05
        else:
            weights = np.array(
                [np.exp(-float(np.sum((wi - W[j]) ** 2)) / 1e4) / 1e4 if j != i else 0.0 for j in range(m)]
            )
            off = weights.sum()
            weights = weights / off if off > 1 else weights
            weights[i] = 0.0 if off > 1 else 1.0 - off
        acc = np.zeros(W.shape[1], dtype=np.float64)
        for j in range(m):
            if weights[j]:
                acc += weights[j] * W[j]
        out[row] = acc
    return out


def run(m: int, d: int, fraction: float, loop_clients: int, heur: bool, repeats: int, seed: int) -> dict:
    """Time the three ways for one (m, d)."""
    rng = np.random.default_rng(seed)
    k = max(1, int(round(fraction * m)))
    matrix = ModelMatrix(m, np.zeros(d, np.float32))
    for start in range(0, m, 64):  # fill rows in blocks (random models around a common point)
        stop = min(m, start + 64)
        matrix.set_rows(list(range(start, stop)), 0.01 * rng.standard_normal((stop - start, d), dtype=np.float32) + 0.1)
    assert matrix.G.shape == (m, m)  # the first read computes the whole Gram matrix, before the timings
    incremental, full = [], []
    peak_inc = peak_full = 0.0
    for _ in range(repeats):
        uploaded = sorted(rng.choice(m, size=k, replace=False).tolist())
        sampled = sorted(rng.choice(m, size=k, replace=False).tolist())
        new_rows = matrix.W[uploaded] + 0.001 * rng.standard_normal((k, d), dtype=np.float32)

        def step_incremental(uploaded=uploaded, new_rows=new_rows, sampled=sampled):
            matrix.set_rows(uploaded, new_rows)
            return cloud_models(attention(matrix.G, heur), matrix.W, sampled)

        def step_full(sampled=sampled):
            return cloud_models(attention(gram_rows(matrix.W), heur), matrix.W, sampled)

        t, peak, U_inc = measured(step_incremental)
        incremental.append(t)
        peak_inc = max(peak_inc, peak)
        t, peak, U_full = measured(step_full)
        full.append(t)
        peak_full = max(peak_full, peak)
        np.testing.assert_allclose(U_inc, U_full, rtol=1e-4, atol=1e-5)
    probe = sampled[:loop_clients]
    t, peak_loop, U_loop = measured(lambda: loop_step(matrix.W, probe, heur))
    np.testing.assert_allclose(U_loop, U_full[: len(probe)], rtol=1e-3, atol=1e-4)
    return {
        "m": m,
        "d": d,
        "k": k,
        "incremental": statistics.median(incremental),
        "full": statistics.median(full),
        "loop": t * k / len(probe),
        "loop_measured_clients": len(probe),
        "peak_inc": peak_inc,
        "peak_full": peak_full,
        "peak_loop": peak_loop,
        "matrix_mb": matrix.W.nbytes / 2**20,
    }


def main() -> None:
    """Print one table row per client count."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="100,1000", help="comma-separated client counts")
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--fraction", type=float, default=0.1, help="clients uploading / sampled per round")
    parser.add_argument("--loop-clients", type=int, default=3, help="sampled clients the loop is timed on")
    parser.add_argument("--heur", action="store_true", help="HeurFedAMP's cosine attention instead of FedAMP's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = [
        run(int(m), args.params, args.fraction, args.loop_clients, args.heur, args.repeats, args.seed)
        for m in args.clients.split(",")
    ]
    name = "HeurFedAMP" if args.heur else "FedAMP"
    print(
        f"\n{name} server step, d = {args.params:,} parameters, {100 * args.fraction:g}% of clients upload and "
        f"{100 * args.fraction:g}% are sampled per round (median of {args.repeats}; loop scaled from "
        f"{args.loop_clients} sampled clients)\n"
    )
    print(
        "| clients | matrix (MB) | incremental (s) | full Gram (s) | direct loop (s) | loop / incremental | "
        "peak extra MB inc / full / loop |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['m']} | {r['matrix_mb']:.0f} | {r['incremental']:.2f} | {r['full']:.2f} | {r['loop']:.1f} | "
            f"{r['loop'] / r['incremental']:.0f}x | {r['peak_inc']:.0f} / {r['peak_full']:.0f} / "
            f"{r['peak_loop']:.0f} |"
        )


if __name__ == "__main__":
    main()
