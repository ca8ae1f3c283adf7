"""The ``image_folder`` reader: a directory of images sorted into class folders, decoded once into a
fixed-shape uint8 cache, and the checks the config check runs on it (missing splits; damaged
files, from headers only).

``image_folder``
    ``path/train/<class>/*`` and ``path/val/<class>/*``: any file PIL opens (JPEG, PNG, ...),
    directly inside its class folder (names starting with ``.`` are skipped). The classes are the
    sorted union of the class folder names of both splits, and an image's label is its class's
    index in that order; ``val`` is the test split. Each image is decoded once, converted to RGB
    (grayscale, palette and RGBA images: a warning counts them; alpha is dropped, 16-bit grayscale
    is scaled to 8 bits), resized so that its short side is ``size`` (bilinear, antialiased:
    ``torchvision.transforms.v2.functional.resize``) and centre-cropped to ``size`` x ``size``.
    The inputs stay **uint8** (N, 3, ``size``, ``size``), 3 ``size``\\ :sup:`2` bytes an image
    (``meta["pixels"] == "uint8"``): whoever trains on them scales them to [0, 1]. Decoding needs
    torchvision (the ``workflow`` extra), imported only when the data is built; the config check
    and :func:`image_folder_meta` read directory listings and file headers only. Nothing is
    downloaded; ``n_train`` keeps a seeded, class-stratified subsample of the training set, and
    only its images are decoded.

:func:`generate_image_folder` writes a synthetic folder of this layout (class-specific oriented
stripes under colour jitter and noise), for benchmarks and tests that need images a small CNN can
learn.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainmap.data.files import DamagedFile, content_hint, problem_text
from trainmap.data.packaged import MissingDataPackage
from trainmap.data.registry import register_data_kind
from trainmap.data.task import TaskData, require, subsample_train, task_data

#: The two split folders under ``path``: ``train`` is the training split, ``val`` the test split.
SPLITS = ("train", "val")
#: The modes PIL opens 16-bit grayscale images in: scaled to 8 bits, not clipped.
_WIDE_GRAY_MODES = ("I", "I;16", "I;16B", "I;16L")


# --------------------------------------------------------------------------------------------------
# The listing: classes and files, without opening any image


def _entries(folder: Path, directories: bool) -> list[str]:
    """The sorted names of the folders (``directories``) or files in ``folder``, hidden ones
    (``.``) skipped; ``[]`` when it is absent. ``os.scandir`` knows each entry's type from the
    listing itself on most file systems, so a folder of a million images costs no stat each."""
    if not folder.is_dir():
        return []
    with os.scandir(folder) as listing:
        return sorted(
            entry.name
            for entry in listing
            if not entry.name.startswith(".")
            and (entry.is_dir() if directories else entry.is_file())
        )


def split_classes(path: str | os.PathLike, split: str) -> list[str]:
    """The class folder names of ``path/<split>``, sorted; ``[]`` when the split is absent."""
    return _entries(Path(path) / split, directories=True)


def image_folder_classes(path: str | os.PathLike) -> list[str]:
    """The classes of the image folder at ``path``: the sorted union of the class folder names of
    ``train`` and ``val``; a label is the index of its class in this list."""
    return sorted({name for split in SPLITS for name in split_classes(path, split)})


def _class_files(folder: Path) -> list[Path]:
    """The files directly inside class ``folder``, sorted by name (hidden ones skipped)."""
    return [folder / name for name in _entries(folder, directories=False)]


def image_folder_files(path: str | os.PathLike, split: str) -> tuple[list[Path], torch.Tensor]:
    """The image files of ``path/<split>`` (class by class in sorted order, each class's files by
    name) and their labels (int64, the index in :func:`image_folder_classes`)."""
    classes = image_folder_classes(path)
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = _class_files(Path(path) / split / name)
        files.extend(found)
        labels.extend([label] * len(found))
    return files, torch.tensor(labels, dtype=torch.int64)


def image_folder_sizes(path: str | os.PathLike, n_train: int | None = None) -> tuple[int, int]:
    """``(n_train, n_test)``: the training images the reader keeps (all of ``train``, or
    ``n_train`` of them) and the images of ``val``, counted from the listing."""
    counts = [len(image_folder_files(path, split)[0]) for split in SPLITS]
    return (counts[0] if n_train is None else min(n_train, counts[0])), counts[1]


def image_folder_cache_bytes(path: str | os.PathLike, size: int, n_train: int | None = None) -> int:
    """Bytes of the uint8 cache the reader makes of the folder at ``path``: the images it keeps
    (:func:`image_folder_sizes`) x 3 x ``size`` x ``size``, counted from the listing, nothing
    decoded (labels not included: 8 bytes an image)."""
    return sum(image_folder_sizes(path, n_train)) * 3 * size * size


def image_folder_meta(options: Mapping[str, Any]) -> dict[str, Any]:
    """``input_shape`` [3, size, size] and ``num_classes`` (the class folders of both splits) of
    the folder ``options["path"]``, from its listing; a folder not there yet takes the option
    ``num_classes`` (a plan made before the data arrives), else a ValueError names it. A
    ``num_classes`` the folder contradicts is refused."""
    path = Path(options["path"])
    stated = options.get("num_classes")
    if not path.is_dir() and stated is not None:
        size = int(options["size"])
        return {"input_shape": [3, size, size], "num_classes": int(stated)}
    require(path.is_dir(), f"data kind 'image_folder': directory {str(path)!r} does not exist; "
           "its class folders give the number of classes: put the image folder there "
           "(train/<class>/ and val/<class>/), fix the path, or state data.<task>.num_classes "
           "to plan before the folder is there")  # fmt: skip
    classes = image_folder_classes(path)
    require(stated is None or int(stated) == len(classes),
            f"data kind 'image_folder': num_classes {stated} but {path} holds {len(classes)} "
            f"class folders; set num_classes: {len(classes)} or remove it")  # fmt: skip
    require(bool(classes), f"data kind 'image_folder': {path} holds no class folders under "
           f"{' or '.join(f'{split}/' for split in SPLITS)}; put each class's images in "
           "train/<class>/ and val/<class>/")  # fmt: skip
    size = int(options["size"])
    return {"input_shape": [3, size, size], "num_classes": len(classes)}


# --------------------------------------------------------------------------------------------------
# The reader


def read_image_folder(
    path: str | os.PathLike,
    size: int = 64,
    n_train: int | None = None,
    seed: int = 0,
    num_classes: int | None = None,
) -> TaskData:
    """Read the image folder at ``path`` (``train/<class>/*``, ``val/<class>/*``) into uint8
    inputs (N, 3, ``size``, ``size``): each image decoded once, converted to RGB, resized to short
    side ``size`` (bilinear, antialiased) and centre-cropped; labels by sorted class name. With
    ``n_train``, a seeded, class-stratified subsample of ``train`` (only it is decoded).
    ``num_classes`` (optional): the number of class folders, stated so that a study can be planned
    before the folder is there; refused when the folder holds another number.

    Raises :class:`~trainmap.data.packaged.MissingDataPackage` without torchvision, and a
    ValueError naming the folder or the file for a missing split, a class with no training image
    or a file PIL cannot decode."""
    require(isinstance(size, int) and size >= 1, f"size must be a positive integer (the short "
           f"side in pixels), got {size!r}")  # fmt: skip
    functional = _torchvision_functional()
    root = Path(path)
    missing = missing_image_folder_files(root)
    require(not missing, f"image folder {root} lacks the split folder(s) {', '.join(missing)}; "
           "put the images in train/<class>/ and val/<class>/ there or fix the path")  # fmt: skip
    classes = image_folder_classes(root)
    require(num_classes is None or num_classes == len(classes),
            f"image folder {root}: num_classes {num_classes} but it holds {len(classes)} class "
            f"folders; set num_classes: {len(classes)} or remove it")  # fmt: skip
    train_files, y_train = image_folder_files(root, "train")
    test_files, y_test = image_folder_files(root, "val")
    empty = [name for label, name in enumerate(classes) if not bool((y_train == label).any())]
    require(not empty, f"image folder {root}: class(es) {', '.join(empty)} have no image in "
           "train/; every class needs training images")  # fmt: skip
    require(len(test_files) > 0, f"image folder {root}: val/ holds no image")
    keep, y_train = subsample_train(torch.arange(len(train_files)), y_train, n_train, seed)
    train_files = [train_files[i] for i in keep.tolist()]
    x_train, x_test = _decode_images(root, [train_files, test_files], size, functional)
    return task_data(
        x_train,
        y_train,
        x_test,
        y_test,
        kind="image_folder",
        input_kind="image",
        num_classes=len(classes),
        classes=classes,
        pixels="uint8",
        path=str(path),
        size=size,
        subsampled=n_train is not None,
        seed=seed,
    )


def _torchvision_functional() -> Any:
    """``torchvision.transforms.v2.functional``, imported here: torchvision is optional."""
    try:
        from torchvision.transforms.v2 import functional
    except ImportError as error:
        raise MissingDataPackage(
            f"data kind 'image_folder' needs torchvision ({type(error).__name__}: {error}): "
            "pip install 'trainmap[workflow]'"
        ) from error
    return functional


def _decode_images(
    root: Path, splits: list[list[Path]], size: int, functional: Any
) -> list[torch.Tensor]:
    """One uint8 (N, 3, size, size) tensor per list of ``splits``, filled image by image under one
    progress bar; warns once with the count of images converted to RGB."""
    from PIL import Image
    from tqdm import tqdm

    converted: list[tuple[Path, str]] = []
    caches = [torch.empty((len(files), 3, size, size), dtype=torch.uint8) for files in splits]
    with tqdm(total=sum(map(len, splits)), desc=f"decode {root}", unit="image") as bar:
        for files, cache in zip(splits, caches, strict=True):
            for index, file in enumerate(files):
                try:
                    with Image.open(file) as image:
                        pixels, mode = _rgb_pixels(image)
                except (OSError, ValueError, Image.DecompressionBombError) as error:
                    raise ValueError(
                        f"image folder {root}: {file} cannot be decoded ({error}); replace or "
                        "remove it"
                    ) from None
                if mode != "RGB":
                    converted.append((file, mode))
                cache[index] = _short_side_crop(pixels, size, functional)
                bar.update()
    if converted:
        modes = ", ".join(sorted({mode for _, mode in converted}))
        warnings.warn(
            f"image folder {root}: {len(converted)} image(s) not RGB (modes {modes}; e.g. "
            f"{converted[0][0]}) converted to RGB",
            stacklevel=3,
        )
    return caches


def _rgb_pixels(image: Any) -> tuple[torch.Tensor, str]:
    """The pixels of the PIL ``image`` as uint8 (3, H, W) RGB, and the mode it had."""
    mode = image.mode
    if mode in _WIDE_GRAY_MODES:  # 16-bit grayscale: scale to 8 bits (convert would clip)
        wide = np.asarray(image, dtype=np.int64).clip(0, 65535)
        gray = ((wide * 255 + 32767) // 65535).astype(np.uint8)
        rgb = np.repeat(gray[:, :, None], 3, axis=2)
    else:
        if mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")  # what PIL asks for before dropping a palette's alpha
        rgb = np.array(image.convert("RGB"), dtype=np.uint8)  # a writable copy for torch
    return torch.from_numpy(rgb).permute(2, 0, 1), mode


def _short_side_crop(pixels: torch.Tensor, size: int, functional: Any) -> torch.Tensor:
    """``pixels`` (3, H, W) uint8 resized to short side ``size`` (bilinear, antialiased) and
    centre-cropped to ``size`` x ``size``."""
    from torchvision.transforms import InterpolationMode

    resized = functional.resize(
        pixels, [size], interpolation=InterpolationMode.BILINEAR, antialias=True
    )
    return functional.center_crop(resized, [size, size])


# --------------------------------------------------------------------------------------------------
# Missing and damaged files, checked before any job: the listing and each file's header only


def missing_image_folder_files(directory: Path) -> list[str]:
    """The split folders (``train``, ``val``) that ``directory`` lacks."""
    return [split for split in SPLITS if not (directory / split).is_dir()]


def damaged_image_folder_files(directory: Path) -> list[tuple[str, str]]:
    """``(file or folder, what is wrong)`` for the image folder at ``directory``: a split with no
    class folder, a class folder in one split only, an empty class folder, an empty (0-byte) file
    and a file PIL cannot identify as an image. Reads headers only (PIL's lazy open), no pixels.
    Images not in RGB (grayscale, RGBA, palette) are not damage: they are converted when the
    folder is decoded, and a warning here says how many."""
    from PIL import Image

    found: list[tuple[str, str]] = []
    converted: dict[str, list[Path]] = {}
    present = [split for split in SPLITS if (directory / split).is_dir()]
    by_split = {split: split_classes(directory, split) for split in present}
    for split in present:
        if not by_split[split]:
            found.append((str(directory / split), "holds no class folder: put each class's "
                          f"images in {split}/<class>/"))  # fmt: skip
    if len(present) == len(SPLITS) and all(by_split.values()):
        for split in SPLITS:
            other = next(s for s in SPLITS if s != split)
            for name in sorted(set(by_split[other]) - set(by_split[split])):
                found.append((str(directory / split), f"lacks class {name!r} (in {other}/ only): "
                              f"every class needs images in both train/ and val/; add "
                              f"{split}/{name}/ or remove {other}/{name}/"))  # fmt: skip
    for split in present:
        for name in by_split[split]:
            folder = directory / split / name
            files = _class_files(folder)
            if not files:
                found.append((str(folder), f"is an empty class folder: put class {name!r}'s "
                              "images in it or remove it"))  # fmt: skip
            for file in files:
                try:
                    mode = _check_image_header(file, Image)
                except (DamagedFile, OSError) as error:
                    found.append((str(file), problem_text(error)))
                    continue
                if mode != "RGB":
                    converted.setdefault(mode, []).append(file)
    if converted:
        count = sum(map(len, converted.values()))
        modes = ", ".join(f"{mode} ({len(files)})" for mode, files in sorted(converted.items()))
        example = next(iter(converted.values()))[0]
        warnings.warn(f"image folder {directory}: {count} image(s) are not RGB ({modes}, e.g. "
                      f"{example}); they are converted to RGB when the folder is decoded",
                      stacklevel=2)  # fmt: skip
    return found


def _check_image_header(file: Path, image_module: Any) -> str:
    """``file``'s colour mode (from its header) when it is not empty and PIL identifies it; else
    :class:`DamagedFile`."""
    if file.stat().st_size == 0:
        raise DamagedFile("is empty (0 bytes): replace it with the image or remove it")
    try:
        with image_module.open(file) as image:  # lazy: reads the header, not the pixels
            return str(image.mode)
    except image_module.UnidentifiedImageError:
        with open(file, "rb") as stream:
            head = stream.read(64)
        raise DamagedFile(
            f"is not an image PIL can identify{content_hint(head)}: remove it or replace it "
            "with the image"
        ) from None
    except image_module.DecompressionBombError as error:
        raise DamagedFile(f"is too large to decode safely ({error})") from None


# --------------------------------------------------------------------------------------------------
# A generated folder of this layout: class-specific oriented stripes a small CNN can learn


def generate_image_folder(
    root: str | os.PathLike,
    n_classes: int = 4,
    n_train: int = 32,
    n_val: int = 16,
    size: int = 32,
    seed: int = 0,
    noise: float = 0.2,
) -> Path:
    """Write a synthetic image folder at ``root`` (which must not exist, or be empty) and return
    it: ``train/class_<c>/`` with ``n_train`` and ``val/class_<c>/`` with ``n_val`` RGB PNGs for
    each of ``n_classes`` classes, identical for the same arguments.

    Class ``c`` is stripes at angle pi c / ``n_classes`` (jittered by up to a sixth of the gap
    between classes) and 2 + c mod 3 periods per ``size`` pixels, in a foreground colour whose hue
    is c / ``n_classes`` (jittered by up to half the gap) over a random background, at a random
    phase, plus Gaussian noise of standard deviation ``noise`` (pixels in [0, 1]). Width and height
    are each drawn from ``size`` .. 1.5 ``size``, so the reader's resize and crop do work. The
    folder appears whole or not at all (written beside it, then renamed)."""
    require(n_classes >= 2, f"n_classes must be at least 2, got {n_classes}")
    require(n_train >= 1 and n_val >= 1, f"n_train and n_val must be at least 1 (images per "
           f"class), got {n_train} and {n_val}")  # fmt: skip
    require(size >= 8, f"size must be at least 8 pixels, got {size}")
    target = Path(root)
    require(not target.exists() or (target.is_dir() and not any(target.iterdir())),
           f"{target} exists and is not an empty directory; generate into a new path or remove "
           "it")  # fmt: skip
    from PIL import Image

    target.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for split, count in (("train", n_train), ("val", n_val)):
            for label in range(n_classes):
                folder = staging / split / f"class_{label:0{len(str(n_classes - 1))}d}"
                folder.mkdir(parents=True)
                for index in range(count):
                    pixels = _stripes(rng, label, n_classes, size, noise)
                    Image.fromarray(pixels, "RGB").save(folder / f"{index:05d}.png")
        staging.chmod(0o755)  # mkdtemp makes it owner-only
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _stripes(
    rng: np.random.Generator, label: int, n_classes: int, size: int, noise: float
) -> np.ndarray:
    """One image of class ``label``: (H, W, 3) uint8 (see :func:`generate_image_folder`)."""
    height, width = (int(rng.integers(size, size * 3 // 2 + 1)) for _ in range(2))
    gap = math.pi / n_classes
    angle = label * gap + rng.uniform(-gap / 6, gap / 6)
    periods = 2 + label % 3
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    along = x * math.cos(angle) + y * math.sin(angle)
    wave = 0.5 + 0.5 * np.sin(2 * math.pi * periods * along / size + rng.uniform(0, 2 * math.pi))
    hue = (label / n_classes + rng.uniform(-0.5, 0.5) / n_classes) % 1.0
    foreground = _hue_rgb(hue) * rng.uniform(0.7, 1.0)
    background = rng.uniform(0.0, 0.4, size=3)
    image = background + wave[:, :, None] * (foreground - background)
    image = image + rng.normal(0.0, noise, size=image.shape)
    return np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)


def _hue_rgb(hue: float) -> np.ndarray:
    """The fully saturated RGB colour (each in [0, 1]) of ``hue`` in [0, 1)."""
    return np.clip(np.abs((hue * 6 + np.array([0.0, 4.0, 2.0])) % 6 - 3) - 1, 0.0, 1.0)


register_data_kind(
    "image_folder",
    read_image_folder,
    "image",
    image_folder_meta,
    reads="directory",
    missing_files=missing_image_folder_files,
    damaged_files=damaged_image_folder_files,
)
