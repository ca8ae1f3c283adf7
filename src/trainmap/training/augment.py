"""Data augmentation of image batches, as the seed papers trained (``train.<task>.augment``).

Each training example gets its own draws (crop offset, flip, cutout centre, random-resized-crop box),
and each batch its MixUp coefficient and partner permutation, all from the seed's own generator
(``derive_seed(seed, "augment")``), drawn once per epoch beside the batch order
(:class:`~trainmap.training.step.BatchSampler`) and kept in its resume state: a resumed run, the
divergence replay and a seed trained in a block of any size see the draws the seed sees alone and
uninterrupted. The draws are applied as batched tensor operations on the training device between
the gather and the forward pass, outside ``vmap``, so no device random numbers are involved.

The order is the authors' transform pipelines': crop (or random-resized crop) and flip on the
``[0, 1]`` pixels, then per-channel normalisation, then cutout (which zeroes normalised values: a
square of the channel means), then MixUp on the normalised batch:

* random crop with padding: ``torchvision.transforms.RandomCrop(size, padding, padding_mode)``;
* horizontal flip with probability 0.5: ``RandomHorizontalFlip``;
* random-resized crop: ``RandomResizedCrop(size)`` (area 8-100 %, aspect ratio 3/4-4/3 log-uniform,
  ten tries, then the centre crop of the clamped ratio; bilinear with antialiasing);
* cutout (DeVries and Taylor 2017, the GradInit authors' ``utils.Cutout``): one square of side
  ``L``, centre ``(y, x)`` uniform over the image, rows ``clip(y - L//2, 0, H)`` to
  ``clip(y + L//2, 0, H)`` (columns alike), set to zero;
* MixUp (Zhang et al. 2018; the GradInit authors' ``utils.mixup_data``): ``x' = lam x + (1 - lam)
  x[perm]`` with one ``lam ~ Beta(alpha, alpha)`` per batch and a random permutation of the batch,
  the loss ``lam CE(f(x'), y) + (1 - lam) CE(f(x'), y[perm])``. The streamed training accuracy is
  then the agreement with each example's own label ``y``, as the authors' script counts it.

Evaluation never augments: :meth:`Augmentation.prepare` converts uint8 pixels to ``[0, 1]``, takes
the centre crop of the training crop's size where the image is larger, and normalises.

Presets (:data:`PRESETS`) hold the authors' values; an option given beside a preset replaces the
preset's (``null`` turns it off).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainmap.schema import section_defaults

#: The authors' recipes. ``gradinit_cifar``: zhuchen03/gradinit ``train_cifar.py`` (RandomCrop(32,
#: padding=4), RandomHorizontalFlip, Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994,
#: 0.2010)), ``utils.Cutout(n_holes=1, length=16)``); ``training_maps_cifar``:
#: michahu/modeling-training ``scripts/00_training/computer_vision.py`` (RandomCrop(32, padding=4,
#: padding_mode='reflect'), RandomHorizontalFlip, Normalize(CIFAR-100 mean, std));
#: ``repvgg_imagenet``: the PyTorch ImageNet example RepVGG follows (RandomResizedCrop(224),
#: RandomHorizontalFlip, Normalize(ImageNet mean, std)).
PRESETS: dict[str, dict[str, Any]] = {
    "gradinit_cifar": {
        "crop": 32, "padding": 4, "padding_mode": "zeros", "flip": True, "cutout": 16,
        "normalize": {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2023, 0.1994, 0.2010]},
    },
    "training_maps_cifar": {
        "crop": 32, "padding": 4, "padding_mode": "reflect", "flip": True,
        "normalize": {"mean": [0.5071, 0.4867, 0.4408], "std": [0.2675, 0.2565, 0.2761]},
    },
    "repvgg_imagenet": {
        "resized_crop": 224, "flip": True,
        "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    },
}  # fmt: skip

#: Options every preset takes beside its own (MixUp is independent of the crops).
ANY_PRESET_TAKES = ("mixup",)
OPTIONS = (
    "crop",
    "padding",
    "padding_mode",
    "flip",
    "resized_crop",
    "cutout",
    "mixup",
    "normalize",
)

#: Columns of the per-position draws of an epoch (:meth:`Augmentation.draw_epoch`).
DRAW_COLUMNS = ("crop_y", "crop_x", "flip", "cutout_y", "cutout_x", "box_top", "box_left",
                "box_height", "box_width", "lam", "partner")  # fmt: skip
_COLUMN = {name: index for index, name in enumerate(DRAW_COLUMNS)}
#: RandomResizedCrop's defaults (torchvision): area fraction and aspect-ratio ranges, tries.
RESIZED_SCALE, RESIZED_RATIO, RESIZED_TRIES = (0.08, 1.0), (3 / 4, 4 / 3), 10
#: An option left out (``train.<task>.augment``): the schema's default, off.
AUGMENT_DEFAULTS: dict[str, Any] = section_defaults("train", "augment")


@dataclass(frozen=True)
class Augmentation:
    """One resolved augmentation recipe (:func:`augmentation`); every field None/False is off."""

    preset: str | None = None
    crop: int | None = None
    padding: int = AUGMENT_DEFAULTS["padding"]
    padding_mode: str = AUGMENT_DEFAULTS["padding_mode"]
    flip: bool = AUGMENT_DEFAULTS["flip"]
    resized_crop: int | None = None
    cutout: int | None = None
    mixup: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    # --- what it is ----------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The recipe as the run's record names it (preset and every effective option)."""
        values = asdict(self)
        values["normalize"] = (
            None if self.mean is None else {"mean": list(self.mean), "std": list(self.std or ())}
        )
        del values["mean"], values["std"]
        return values

    def check(self, input_kind: str, input_shape: Sequence[int], where: str) -> None:
        """Refuse a recipe the task's inputs cannot take (a ValueError naming ``where``'s key):
        augmentation of a vector or token task, a crop larger than the padded image, a cutout
        larger than the image, normalisation statistics of another channel count."""
        if input_kind != "image" or len(input_shape) != 3:
            raise ValueError(f"{where}: augmentation applies to image tasks (C, H, W); this task's "
                             f"inputs are {input_kind} of shape {list(input_shape)}: remove "
                             f"{where}")  # fmt: skip
        channels, height, width = (int(v) for v in input_shape)
        if self.crop is not None and self.crop > min(height, width) + 2 * self.padding:
            raise ValueError(
                f"{where}.crop: {self.crop} is larger than the {height}x{width} image plus twice "
                f"the padding ({self.padding}); use a crop of at most "
                f"{min(height, width) + 2 * self.padding}"
            )
        if self.resized_crop is not None and self.crop is not None:
            raise ValueError(f"{where}: crop and resized_crop are two crops; set one of them "
                             "(the other to null)")  # fmt: skip
        if self.cutout is not None and self.cutout > min(height, width):
            raise ValueError(f"{where}.cutout: {self.cutout} is larger than the {height}x{width} "
                             f"image; use a side of at most {min(height, width)}")  # fmt: skip
        if self.mean is not None and (
            len(self.mean) != channels or len(self.std or ()) != channels
        ):
            raise ValueError(
                f"{where}.normalize: {len(self.mean)} means and {len(self.std or ())} standard "
                f"deviations for images of {channels} channel(s); give {channels} of each"
            )

    def output_shape(self, input_shape: Sequence[int]) -> list[int]:
        """The per-example shape the model sees at evaluation (:meth:`prepare`)."""
        channels, height, width = (int(v) for v in input_shape)
        side = self.crop or self.resized_crop
        return (
            [channels, min(side, height), min(side, width)] if side else [channels, height, width]
        )

    # --- the draws -----------------------------------------------------------------------------

    def draw_epoch(
        self, n: int, batch: int, shape: Sequence[int], generator: torch.Generator
    ) -> torch.Tensor:
        """One epoch's draws, ``(n, len(DRAW_COLUMNS))`` float32, row ``p`` for position ``p`` of
        the epoch's order (MixUp's ``lam`` and ``partner`` per batch of ``batch`` positions:
        ``partner`` is a position within the batch). Drawn from ``generator`` in a fixed order,
        only for the operations that are on."""
        _, height, width = (int(v) for v in shape)
        draws = torch.zeros(n, len(DRAW_COLUMNS), dtype=torch.float32)
        if self.crop is not None:
            room_y = height + 2 * self.padding - self.crop + 1
            room_x = width + 2 * self.padding - self.crop + 1
            draws[:, _COLUMN["crop_y"]] = torch.randint(room_y, (n,), generator=generator).float()
            draws[:, _COLUMN["crop_x"]] = torch.randint(room_x, (n,), generator=generator).float()
        if self.resized_crop is not None:
            boxes = _resized_crop_boxes(n, height, width, generator)
            for column, values in zip(("box_top", "box_left", "box_height", "box_width"),
                                      boxes.unbind(1), strict=True):  # fmt: skip
                draws[:, _COLUMN[column]] = values.float()
        if self.flip:
            draws[:, _COLUMN["flip"]] = torch.randint(2, (n,), generator=generator).float()
        if self.cutout is not None:
            draws[:, _COLUMN["cutout_y"]] = torch.randint(height, (n,), generator=generator).float()
            draws[:, _COLUMN["cutout_x"]] = torch.randint(width, (n,), generator=generator).float()
        if self.mixup is not None:
            batches = -(-n // batch)
            seed = int(torch.randint(2**62, (1,), generator=generator))
            lams = np.random.default_rng(seed).beta(self.mixup, self.mixup, size=batches)
            draws[:, _COLUMN["lam"]] = torch.from_numpy(lams).float().repeat_interleave(batch)[:n]
            partners = [torch.randperm(batch, generator=generator) for _ in range(batches)]
            draws[:, _COLUMN["partner"]] = torch.cat(partners)[:n].float()
        return draws

    # --- applying them -------------------------------------------------------------------------

    def apply(
        self, inputs: torch.Tensor, targets: torch.Tensor, draws: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Augment a training batch: ``inputs`` ``(..., B, C, H, W)`` (uint8 or ``[0, 1]``
        floats), ``draws`` ``(..., B, len(DRAW_COLUMNS))`` the rows of its positions. Returns the
        augmented, normalised inputs and, under MixUp, each example's partner label and the
        batch's ``lam`` (``(..., B)`` and ``(...,)``), else None twice."""
        lead = inputs.shape[:-3]
        x = to_unit(inputs).reshape(-1, *inputs.shape[-3:])
        d = draws.reshape(-1, draws.shape[-1])
        if self.crop is not None:
            x = _padded_crops(x, d, self.crop, self.padding, self.padding_mode)
        if self.resized_crop is not None:
            x = _resized_crops(x, d, self.resized_crop)
        if self.flip:
            flip = d[:, _COLUMN["flip"]].bool().reshape(-1, 1, 1, 1)
            x = torch.where(flip, x.flip(-1), x)
        x = self.normalise(x)
        if self.cutout is not None:
            x = x * _cutout_masks(d, self.cutout, x.shape[-2], x.shape[-1]).to(x.dtype)
        x = x.reshape(*lead, *x.shape[1:])
        if self.mixup is None:
            return x, None, None
        seeds = inputs.shape[:-4]  # the block's seed dimension, if any
        partner = draws[..., _COLUMN["partner"]].long()  # (..., B)
        lam = draws[..., 0, _COLUMN["lam"]].to(x.dtype)  # (...,): one per batch
        if seeds:
            index = partner.reshape(*partner.shape, 1, 1, 1).expand_as(x)
            mixed_with = x.gather(len(seeds), index)
            partner_targets = targets.gather(-1, partner)
            weight = lam.reshape(*lam.shape, 1, 1, 1, 1)
        else:
            mixed_with, partner_targets, weight = x[partner], targets[partner], lam
        x = weight * x + (1 - weight) * mixed_with
        return x, partner_targets, lam

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Per-channel ``(x - mean) / std`` of ``(N, C, H, W)`` ``[0, 1]`` pixels (as is: off)."""
        if self.mean is None:
            return x
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
        return (x - mean) / std

    def prepare(self, inputs: torch.Tensor) -> torch.Tensor:
        """The evaluation transform of ``(N, C, H, W)`` inputs: ``[0, 1]`` pixels, the centre crop
        of the training crop's size where the image is larger (``Resize`` + ``CenterCrop`` of the
        PyTorch ImageNet example, the image stored at its short side), normalised."""
        x = to_unit(inputs)
        side = self.crop or self.resized_crop
        if side is not None:
            x = _centre_crop(x, side)
        return self.normalise(x)


def to_unit(inputs: torch.Tensor) -> torch.Tensor:
    """uint8 pixels as float32 in ``[0, 1]`` (``ToTensor``); any other tensor as it is."""
    return inputs.float().div_(255) if inputs.dtype == torch.uint8 else inputs


def augmentation(settings: Mapping[str, Any] | None, where: str = "augment") -> Augmentation | None:
    """The recipe of ``train.<task>.augment`` settings (None: off, for None and ``{}``): the
    preset's values, each option given beside it replacing the preset's. Refuses (a ValueError
    naming ``where``'s key) an unknown preset or option, an option the preset does not take, and
    values no recipe can use (the schema's bounds, for a caller without the schema)."""
    if not settings:
        return None
    settings = dict(settings)
    unknown = sorted(set(settings) - {"preset", *OPTIONS})
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; allowed: preset, "
                         f"{', '.join(OPTIONS)}")  # fmt: skip
    preset = settings.pop("preset", None)
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"{where}.preset: unknown preset {preset!r}; allowed: "
                             f"{', '.join(PRESETS)}")  # fmt: skip
        values = dict(PRESETS[preset])
        foreign = sorted(set(settings) - set(values) - set(ANY_PRESET_TAKES))
        if foreign:
            raise ValueError(
                f"{where}.{foreign[0]}: preset {preset!r} does not take {foreign[0]!r} (it sets "
                f"{', '.join(values)}; any preset also takes {', '.join(ANY_PRESET_TAKES)}); drop "
                f"the preset to build a recipe of your own"
            )
    values.update(settings)
    recipe = _recipe(preset, values, where)
    return None if recipe == Augmentation(preset=preset) and preset is None else recipe


def _recipe(preset: str | None, values: Mapping[str, Any], where: str) -> Augmentation:
    """An :class:`Augmentation` of resolved option ``values``, each checked."""

    def positive(key: str) -> int | None:
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):  # fmt: skip
            raise ValueError(f"{where}.{key}: {value!r}; allowed: a whole number >= 1, or null")
        return value

    mixup = values.get("mixup")
    if mixup is not None and not (isinstance(mixup, int | float) and mixup > 0):
        raise ValueError(f"{where}.mixup: alpha {mixup!r}; allowed: a number > 0, or null (off)")
    padding = values.get("padding", AUGMENT_DEFAULTS["padding"])
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"{where}.padding: {padding!r}; allowed: a whole number >= 0")
    mode = values.get("padding_mode", AUGMENT_DEFAULTS["padding_mode"])
    if mode not in ("zeros", "reflect"):
        raise ValueError(f"{where}.padding_mode: {mode!r}; allowed: zeros, reflect")
    normalize = values.get("normalize")
    mean = std = None
    if normalize is not None:
        mean, std = tuple(map(float, normalize["mean"])), tuple(map(float, normalize["std"]))
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"{where}.normalize: {len(mean)} means and {len(std)} standard "
                             "deviations; give one of each per channel, every std > 0")  # fmt: skip
    return Augmentation(
        preset=preset, crop=positive("crop"), padding=padding, padding_mode=mode,
        flip=bool(values.get("flip", AUGMENT_DEFAULTS["flip"])), resized_crop=positive("resized_crop"),
        cutout=positive("cutout"), mixup=None if mixup is None else float(mixup), mean=mean,
        std=std,
    )  # fmt: skip


# --- the batched operations ------------------------------------------------------------------------


def _padded_crops(
    x: torch.Tensor, draws: torch.Tensor, size: int, padding: int, mode: str
) -> torch.Tensor:
    """Each image's ``size`` x ``size`` window at its drawn offset in the image padded by
    ``padding`` (zeros or reflect): ``RandomCrop(size, padding, padding_mode)``."""
    if padding:
        x = F.pad(x, (padding,) * 4, mode="constant" if mode == "zeros" else "reflect")
    top = draws[:, _COLUMN["crop_y"]].long()
    left = draws[:, _COLUMN["crop_x"]].long()
    n, channels, _, width = x.shape
    span = torch.arange(size, device=x.device)
    # each window's flat positions in the padded image, one gather for every channel
    flat = (top[:, None] + span)[:, :, None] * width + (left[:, None] + span)[:, None, :]
    index = flat.reshape(n, 1, size * size).expand(n, channels, size * size)
    return x.reshape(n, channels, -1).gather(2, index).reshape(n, channels, size, size)


def _cutout_masks(draws: torch.Tensor, length: int, height: int, width: int) -> torch.Tensor:
    """``(N, 1, H, W)`` masks, 0 on each image's square: rows ``clip(y - L//2, 0, H)`` up to
    ``clip(y + L//2, 0, H)`` (exclusive), columns alike (the authors' ``Cutout``)."""
    y = draws[:, _COLUMN["cutout_y"]].long()
    x = draws[:, _COLUMN["cutout_x"]].long()
    half = length // 2
    rows = torch.arange(height, device=draws.device)
    cols = torch.arange(width, device=draws.device)
    in_rows = (rows >= (y - half).clamp(0, height)[:, None]) & (
        rows < (y + half).clamp(0, height)[:, None]
    )
    in_cols = (cols >= (x - half).clamp(0, width)[:, None]) & (
        cols < (x + half).clamp(0, width)[:, None]
    )
    return ~(in_rows[:, :, None] & in_cols[:, None, :])[:, None]


def _resized_crop_boxes(
    n: int, height: int, width: int, generator: torch.Generator
) -> torch.Tensor:
    """``(n, 4)`` boxes ``(top, left, h, w)`` of ``RandomResizedCrop.get_params`` (torchvision):
    up to ten tries of an area fraction uniform in :data:`RESIZED_SCALE` and a log-uniform aspect
    ratio in :data:`RESIZED_RATIO`, the first that fits, its offset uniform; none: the centre crop
    of the whole image with its ratio clamped to the range."""
    area = height * width
    tries = RESIZED_TRIES
    fraction = torch.empty(n, tries).uniform_(*RESIZED_SCALE, generator=generator)
    log_ratio = torch.empty(n, tries).uniform_(*map(math.log, RESIZED_RATIO), generator=generator)
    offsets = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    target = fraction * area
    ratio = torch.exp(log_ratio)
    w = torch.round(torch.sqrt(target * ratio)).long()
    h = torch.round(torch.sqrt(target / ratio)).long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.full((n,), -1))
    rows = torch.arange(n)
    chosen_h = torch.where(first >= 0, h[rows, first.clamp(min=0)], 0)
    chosen_w = torch.where(first >= 0, w[rows, first.clamp(min=0)], 0)
    in_ratio = width / height
    if in_ratio < min(RESIZED_RATIO):
        fallback_w, fallback_h = width, int(round(width / min(RESIZED_RATIO)))
    elif in_ratio > max(RESIZED_RATIO):
        fallback_h, fallback_w = height, int(round(height * max(RESIZED_RATIO)))
    else:
        fallback_w, fallback_h = width, height
    found = first >= 0
    box_h = torch.where(found, chosen_h, fallback_h)
    box_w = torch.where(found, chosen_w, fallback_w)
    top = torch.where(found, (offsets[:, 0] * (height - box_h + 1)).floor().long(),
                      (height - fallback_h) // 2)  # fmt: skip
    left = torch.where(found, (offsets[:, 1] * (width - box_w + 1)).floor().long(),
                       (width - fallback_w) // 2)  # fmt: skip
    return torch.stack([top, left, box_h, box_w], dim=1)


def _resized_crops(x: torch.Tensor, draws: torch.Tensor, size: int) -> torch.Tensor:
    """Each image's drawn box resized to ``size`` x ``size`` (bilinear, antialiased: what
    ``torchvision.transforms.v2.functional.resized_crop`` does to a float tensor)."""
    boxes = draws[:, [_COLUMN[c] for c in ("box_top", "box_left", "box_height", "box_width")]]
    out = []
    for image, (top, left, h, w) in zip(x, boxes.long().tolist(), strict=True):
        crop = image[None, :, top : top + h, left : left + w]
        out.append(F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False,
                                 antialias=True))  # fmt: skip
    return torch.cat(out)


def _centre_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """The centre ``size`` x ``size`` window (``CenterCrop``'s offsets); an image no larger than
    ``size`` on a side is kept as it is on that side."""
    height, width = x.shape[-2:]
    top = max(0, int(round((height - size) / 2.0)))
    left = max(0, int(round((width - size) / 2.0)))
    return x[..., top : top + min(size, height), left : left + min(size, width)]


def recipe_of_record(record: Mapping[str, Any] | None) -> Augmentation | None:
    """The recipe a run's record names (``train.json``'s ``augment``: :meth:`Augmentation.record`),
    or None (a run trained without augmentation)."""
    if not record:
        return None
    values = {key: value for key, value in record.items() if key != "preset"}
    return _recipe(record.get("preset"), values, "train.json augment")


def evaluation_inputs(
    recipe: Augmentation | None, dtype: torch.dtype
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How evaluation prepares a batch of inputs of ``dtype``: the recipe's
    :meth:`~Augmentation.prepare`, uint8 pixels to ``[0, 1]``, or nothing (float inputs, no
    recipe: the model sees the data as stored)."""
    if recipe is not None:
        return recipe.prepare
    return to_unit if dtype == torch.uint8 else None


def recipe_of(cfg_augment: Mapping[str, Any] | None) -> Augmentation | None:
    """The recipe a :class:`~trainmap.training.config.TrainConfig`'s ``augment`` holds."""
    return augmentation(cfg_augment, "train.<task>.augment")


def without_mixup(recipe: Augmentation | None) -> Augmentation | None:
    """``recipe`` without MixUp (GradInit's scale search draws batches without it, as the
    authors' ``gradinit_utils`` does)."""
    return None if recipe is None else replace(recipe, mixup=None)
