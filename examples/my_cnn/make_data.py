"""Write the example's data file, digits.npz: your own data set goes in the same four arrays.

trainmap's ``arrays`` data kind reads ``x_train``, ``y_train``, ``x_test`` and ``y_test`` from one
``.npz`` (written by ``numpy.savez``). Here they are scikit-learn's bundled 8x8 digits (no download):
images as float32 of shape (N, 1, 8, 8) in [0, 1], labels as integer classes 0-9, a stratified 80/20
split with a fixed seed, so every run of this script writes the same arrays.

    python examples/my_cnn/make_data.py [OUT]      # default: examples/my_cnn/digits.npz
"""

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main(out: Path) -> None:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8): one channel
    labels = digits.target.astype(np.int64)
    train, test = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0
    )
    np.savez_compressed(out, x_train=images[train], y_train=labels[train],
                        x_test=images[test], y_test=labels[test])  # fmt: skip
    print(f"wrote {out}: {len(train)} training and {len(test)} test images {images.shape[1:]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("digits.npz"))
