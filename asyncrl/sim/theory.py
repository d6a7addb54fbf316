"""docs/algorithms.md §6: the throughput bounds of queue-scheduled asynchronous rollout, as pure functions.

K inference workers, N samples per step, μ_gen mean and L_gen longest generation time per sample, μ_train
training time per sample, E epochs, α async ratio (times in worker-seconds: what one worker spends per sample).
"""

from __future__ import annotations

__all__ = ["async_step_bound", "best_train_share", "max_speedup", "mean_time_per_sample"]


def mean_time_per_sample(mu_gen: float, l_gen: float, k: int, q: int) -> float:
    """`T̄ ≤ μ_gen/K + L_gen/Q` (Q samples in the queue: sync Q = N, async Q = (α+1)·N)."""
    return mu_gen / k + l_gen / q


def async_step_bound(n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, alpha: int,
                     epochs: int = 1) -> float:
    """`T_async ≤ (N/K)(μ_gen + E·μ_train) + L_gen/(α+1)`: step time at the best training share."""
    return (n / k) * (mu_gen + epochs * mu_train) + l_gen / (alpha + 1)


def best_train_share(n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, alpha: int,
                     epochs: int = 1) -> float:
    """`β* = E·N·μ_train / (N·μ_gen + K·L_gen/(α+1) + E·N·μ_train)`."""
    num = epochs * n * mu_train
    return num / (n * mu_gen + k * l_gen / (alpha + 1) + num)


def max_speedup(n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, epochs: int = 1) -> float:
    """Upper bound of the async speedup over sync as α → ∞: `1 + K·L_gen / (N·(μ_gen + E·μ_train))`."""
    return 1 + k * l_gen / (n * (mu_gen + epochs * mu_train))
