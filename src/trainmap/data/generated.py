"""Generated tasks: data fully determined by its options and seed, no files and no packages.

``sparse_parity``
    Barak et al. (2022), as used by Hu et al., "Latent state models of training dynamics".
    ``x`` is uniform on {-1, +1}^n_bits; a secret set S of ``k`` distinct indices is drawn from the
    seed (``meta["secret"]``, sorted); ``y = 1`` when prod_{i in S} x_i = -1, else ``0``.
``modular_addition``
    The grokking task of Power et al. (2022) and Nanda et al. (2023): every pair ``(a, b)`` with
    ``0 <= a, b < p`` becomes the token sequence ``[a, b, p]`` (token ``p`` is "=") labelled
    ``(a + b) mod p``. A seeded permutation of the p * p pairs puts the first
    ``round(train_frac * p * p)`` in train and the rest in test.
"""

from __future__ import annotations

import torch

from trainmap.data.registry import register_data_kind
from trainmap.data.task import TaskData, require, task_data


def make_sparse_parity(
    n_bits: int = 40, k: int = 3, n_train: int = 1000, n_test: int = 100, seed: int = 0
) -> TaskData:
    """Sparse parity: the label is the parity of ``k`` secret bits out of ``n_bits`` +-1 inputs."""
    require(n_bits >= 1, f"n_bits must be >= 1, got {n_bits}")
    require(1 <= k <= n_bits, f"k must be in [1, n_bits={n_bits}], got {k}")
    require(n_train >= 1, f"n_train must be >= 1, got {n_train}")
    require(n_test >= 1, f"n_test must be >= 1, got {n_test}")
    generator = torch.Generator().manual_seed(seed)
    secret = torch.randperm(n_bits, generator=generator)[:k].sort().values
    x_train = _random_signs(n_train, n_bits, generator)
    x_test = _random_signs(n_test, n_bits, generator)
    return task_data(
        x_train,
        _parity_labels(x_train, secret),
        x_test,
        _parity_labels(x_test, secret),
        kind="sparse_parity",
        input_kind="vector",
        num_classes=2,
        n_bits=n_bits,
        k=k,
        secret=secret.tolist(),
        seed=seed,
    )


def _random_signs(n_rows: int, n_bits: int, generator: torch.Generator) -> torch.Tensor:
    bits = torch.randint(0, 2, (n_rows, n_bits), generator=generator)
    return (2 * bits - 1).to(torch.float32)


def _parity_labels(x: torch.Tensor, secret: torch.Tensor) -> torch.Tensor:
    # The product of +-1 values is -1 exactly when an odd number of them are -1.
    negatives = (x[:, secret] < 0).sum(dim=1)
    return (negatives % 2).to(torch.int64)


def make_modular_addition(p: int = 113, train_frac: float = 0.3, seed: int = 0) -> TaskData:
    """Modular addition ``a + b mod p`` on tokens ``[a, b, =]``; a seeded split of all pairs."""
    require(p >= 2, f"p must be >= 2, got {p}")
    require(0 < train_frac < 1, f"train_frac must be in (0, 1), got {train_frac}")
    n_pairs = p * p
    n_train = round(train_frac * n_pairs)
    require(
        0 < n_train < n_pairs,
        f"train_frac={train_frac} with p={p} gives {n_train} of {n_pairs} pairs for training; "
        "both splits must be non-empty",
    )
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    equals = torch.full_like(a, p)
    tokens = torch.stack([a, b, equals], dim=1)
    labels = (a + b) % p
    order = torch.randperm(n_pairs, generator=torch.Generator().manual_seed(seed))
    train, test = order[:n_train], order[n_train:]
    return task_data(
        tokens[train],
        labels[train],
        tokens[test],
        labels[test],
        kind="modular_addition",
        input_kind="tokens",
        num_classes=p,
        vocab_size=p + 1,
        p=p,
        equals_token=p,
        train_frac=train_frac,
        seed=seed,
    )


register_data_kind(
    "sparse_parity",
    make_sparse_parity,
    "vector",
    lambda o: {"input_shape": [o["n_bits"]], "num_classes": 2},
)
register_data_kind(
    "modular_addition",
    make_modular_addition,
    "tokens",
    lambda o: {"input_shape": [3], "num_classes": o["p"], "vocab_size": o["p"] + 1},
)
