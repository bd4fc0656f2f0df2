"""A real image data set for the tests: scikit-learn's handwritten digits as PNG files.

`load_digits` ships with scikit-learn (1797 8x8 images, 16 grey levels, 10 classes), so the
tests train on real data without downloading anything. The images are written in the
ImageFolder layout the model reads, split 70/10/20 (stratified, seeded):

    <root>/train/<digit>/<index>.png
    <root>/validation/<digit>/<index>.png
    <root>/test/<digit>/<index>.png

Usage: python -m harness.digits OUT_DIR [--size 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from harness.cluster import Cluster

SPLITS: tuple[tuple[str, float], ...] = (("train", 0.7), ("validation", 0.1), ("test", 0.2))
# The built-in model's hyperparameters for these images: they train in seconds at 32x32 with a
# batch of 32 and a rate of 2e-3 (the defaults fit larger images). Tests and `make smoke` use them.
DIGITS_HYPERPARAMETERS: dict[str, str] = {
    "image_size": "32",
    "batch_size": "32",
    "learning_rate": "0.002",
    "seed": "1",
}
# load_digits' pixel values run from 0 to 16.
_MAX_LEVEL = 16


def split_indices(labels: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Stratified 70/10/20 split of the sample indices, the same for the same seed."""
    indices = np.arange(len(labels))
    train, rest = train_test_split(
        indices, train_size=SPLITS[0][1], stratify=labels, random_state=seed
    )
    # Validation is 1/3 of the remaining 30%.
    validation, test = train_test_split(
        rest, train_size=SPLITS[1][1] / (1 - SPLITS[0][1]), stratify=labels[rest], random_state=seed
    )
    return {"train": np.sort(train), "validation": np.sort(validation), "test": np.sort(test)}


def logistic_regression_accuracy(seed: int = 0) -> float:
    """The linear baseline: scikit-learn's LogisticRegression trained on the raw 8x8 pixels of
    the train split `make_digits(seed=seed)` writes, its accuracy on that test split (0.958 for
    seed 0). A model that does not beat it has not learned what a CNN should."""
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 - only the tests' need

    digits = load_digits()
    split = split_indices(digits.target, seed)
    train, test = split["train"], split["test"]
    classifier = LogisticRegression(max_iter=10_000).fit(digits.data[train], digits.target[train])
    return float(np.mean(classifier.predict(digits.data[test]) == digits.target[test]))


def to_png_pixels(image: np.ndarray, size: int) -> np.ndarray:
    """An 8x8 image of levels 0..16 -> size x size RGB uint8 (0..255), dark digit on white
    like ink on paper."""
    grey = np.rint(255 - image * (255 / _MAX_LEVEL)).astype(np.uint8)
    resized = Image.fromarray(grey).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(resized.convert("RGB"))


def make_digits(root: Path, *, seed: int = 0, size: int = 32) -> dict[str, Path]:
    """Write the digits under `root`; returns {split name: its folder}."""
    digits = load_digits()
    images: np.ndarray = digits.images
    labels: np.ndarray = digits.target
    folders: dict[str, Path] = {}
    for split, indices in split_indices(labels, seed).items():
        folder = root / split
        for label in np.unique(labels):
            (folder / str(label)).mkdir(parents=True, exist_ok=True)
        for index in indices:
            path = folder / str(labels[index]) / f"{index:04d}.png"
            Image.fromarray(to_png_pixels(images[index], size)).save(path)
        folders[split] = folder
    return folders


def one_host_digits_cluster(
    *, docker: str, image: str, root: Path, channels: Mapping[str, Path], epochs: str
) -> Cluster:
    """The built-in model on the digits in ONE container, started as SageMaker starts it (not
    yet started): what `make smoke`, serve's tests and its benchmark train."""
    return Cluster(
        docker=docker,
        image=image,
        root=root,
        hosts=("algo-1",),
        hyperparameters={**DIGITS_HYPERPARAMETERS, "epochs": epochs},
        channels=channels,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")
    args = parser.parse_args(argv)
    folders = make_digits(args.out_dir, seed=args.seed, size=args.size)
    for split, folder in folders.items():
        count = sum(1 for _ in folder.rglob("*.png"))
        print(f"{split}: {count} images in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
