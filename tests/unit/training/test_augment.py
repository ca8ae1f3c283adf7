"""Batch augmentation (trainmap.training.augment): each operation against torchvision's (or the
authors' own code) given the same parameters, the presets against their sources, per-example draws
that a resume, the divergence replay and any seed-block size reproduce, and the config's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainmap.data import TaskData, make_task_data
from trainmap.io import load_json
from trainmap.training import augment as A
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block
from trainmap.training.step import BatchSampler

TF = pytest.importorskip("torchvision.transforms.v2.functional")


@pytest.fixture(scope="module")
def digits() -> TaskData:
    return make_task_data("digits", {})


def draws_of(recipe: A.Augmentation, n: int, shape, seed: int = 0, batch: int | None = None):
    return recipe.draw_epoch(n, batch or n, shape, torch.Generator().manual_seed(seed))


def column(draws: torch.Tensor, name: str) -> list[int]:
    return draws[:, A.DRAW_COLUMNS.index(name)].long().tolist()


# --- each operation against its reference -------------------------------------------------------


@pytest.mark.parametrize("mode", ["zeros", "reflect"])
def test_padded_crop_and_flip_equal_torchvision_with_the_same_parameters(mode):
    recipe = A.augmentation({"crop": 12, "padding": 3, "padding_mode": mode, "flip": True})
    images = torch.rand(16, 3, 12, 12)
    draws = draws_of(recipe, 16, (3, 12, 12))
    out, partner, lam = recipe.apply(images, torch.zeros(16, dtype=torch.long), draws)
    assert partner is None and lam is None
    for i, image in enumerate(images):
        padded = TF.pad(image, [3], padding_mode="constant" if mode == "zeros" else "reflect")
        expected = TF.crop(padded, column(draws, "crop_y")[i], column(draws, "crop_x")[i], 12, 12)
        if column(draws, "flip")[i]:
            expected = TF.horizontal_flip(expected)
        assert torch.equal(out[i], expected)


def test_draws_are_per_example():
    """Offsets, flips and cutout centres differ between the examples of one batch."""
    recipe = A.augmentation({"preset": "gradinit_cifar"})
    draws = draws_of(recipe, 256, (3, 32, 32))
    for name, values in (("crop_y", range(9)), ("crop_x", range(9)), ("flip", (0, 1)),
                         ("cutout_y", range(32))):  # fmt: skip
        seen = set(column(draws, name))
        assert seen <= set(values) and len(seen) > len(set(values)) // 2, name
    assert 0.35 < np.mean(column(draws, "flip")) < 0.65


def authors_cutout(image: torch.Tensor, y: int, x: int, length: int) -> torch.Tensor:
    """zhuchen03/gradinit utils.Cutout.__call__ with its numpy draws replaced by (y, x)."""
    h, w = image.shape[1:]
    mask = np.ones((h, w), np.float32)
    y1, y2 = np.clip(y - length // 2, 0, h), np.clip(y + length // 2, 0, h)
    x1, x2 = np.clip(x - length // 2, 0, w), np.clip(x + length // 2, 0, w)
    mask[y1:y2, x1:x2] = 0.0
    return image * torch.from_numpy(mask).expand_as(image)


def test_gradinit_preset_equals_the_authors_transform_pipeline():
    """RandomCrop(32, 4) + flip + ToTensor + Normalize + Cutout(1, 16), step by step with
    torchvision's functional ops and the authors' Cutout, on uint8 pixels."""
    recipe = A.augmentation({"preset": "gradinit_cifar"})
    pixels = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8)
    draws = draws_of(recipe, 12, (3, 32, 32), seed=3)
    out, _, _ = recipe.apply(pixels, torch.zeros(12, dtype=torch.long), draws)
    mean, std = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]
    for i, image in enumerate(pixels):
        x = TF.crop(
            TF.pad(image, [4]), column(draws, "crop_y")[i], column(draws, "crop_x")[i], 32, 32
        )
        if column(draws, "flip")[i]:
            x = TF.horizontal_flip(x)
        x = TF.normalize(TF.to_dtype(x, torch.float32, scale=True), mean, std)
        x = authors_cutout(x, column(draws, "cutout_y")[i], column(draws, "cutout_x")[i], 16)
        torch.testing.assert_close(out[i], x, rtol=0, atol=1e-6)
    # a square at the border is clipped: some masks hide fewer than 16 x 16 pixels
    hidden = (out == 0).all(dim=1).sum(dim=(1, 2))
    assert hidden.max() <= 256 and hidden.min() < 256


def test_presets_hold_the_authors_values():
    """Each preset's values as its source writes them (zhuchen03/gradinit train_cifar.py;
    michahu/modeling-training scripts/00_training/computer_vision.py; the PyTorch ImageNet
    example)."""
    gradinit = A.augmentation({"preset": "gradinit_cifar"})
    assert (gradinit.crop, gradinit.padding, gradinit.padding_mode, gradinit.flip) == (
        32,
        4,
        "zeros",
        True,
    )
    assert gradinit.cutout == 16 and gradinit.mixup is None and gradinit.resized_crop is None
    assert gradinit.mean == (0.4914, 0.4822, 0.4465) and gradinit.std == (0.2023, 0.1994, 0.2010)
    maps = A.augmentation({"preset": "training_maps_cifar"})
    assert (maps.crop, maps.padding, maps.padding_mode, maps.flip, maps.cutout) == (
        32,
        4,
        "reflect",
        True,
        None,
    )
    assert maps.mean == (0.5071, 0.4867, 0.4408) and maps.std == (0.2675, 0.2565, 0.2761)
    repvgg = A.augmentation({"preset": "repvgg_imagenet"})
    assert (repvgg.resized_crop, repvgg.flip, repvgg.crop, repvgg.cutout) == (224, True, None, None)
    assert repvgg.mean == (0.485, 0.456, 0.406) and repvgg.std == (0.229, 0.224, 0.225)


def test_an_option_beside_a_preset_replaces_its_value_and_the_record_names_it():
    recipe = A.augmentation({"preset": "gradinit_cifar", "cutout": None, "mixup": 0.7})
    assert recipe.cutout is None and recipe.mixup == 0.7 and recipe.crop == 32
    record = recipe.record()
    assert record["preset"] == "gradinit_cifar" and record["cutout"] is None
    assert A.recipe_of_record(record) == recipe


def test_resized_crop_equals_torchvision_and_its_boxes_follow_get_params():
    recipe = A.augmentation({"preset": "repvgg_imagenet"})
    images = torch.rand(6, 3, 40, 30)
    draws = draws_of(recipe, 400, (3, 40, 30))
    boxes = draws[:, [A.DRAW_COLUMNS.index(c) for c in ("box_top", "box_left", "box_height",
                                                          "box_width")]].long()  # fmt: skip
    top, left, h, w = boxes.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (top + h <= 40) & (left + w <= 30)).all())
    area = (h * w).double() / (40 * 30)
    assert area.min() >= 0.06 and area.max() <= 1.0 and area.std() > 0.1
    ratio = (w / h).double()
    assert ratio.min() > 0.7 and ratio.max() < 1.4
    small = A.augmentation({"resized_crop": 16, "flip": False})
    d = draws_of(small, 6, (3, 40, 30), seed=1)
    out, _, _ = small.apply(images, torch.zeros(6, dtype=torch.long), d)
    for i, image in enumerate(images):
        t, l_, hh, ww = d[i, [A.DRAW_COLUMNS.index(c) for c in ("box_top", "box_left",
                                                               "box_height", "box_width")]].long().tolist()  # fmt: skip
        expected = TF.resized_crop(image, t, l_, hh, ww, [16, 16], antialias=True)
        torch.testing.assert_close(out[i], expected, rtol=0, atol=1e-5)
    # evaluation: the centre crop of the training size, normalised; nothing drawn
    prepared = recipe.prepare(torch.full((2, 3, 256, 300), 255, dtype=torch.uint8))
    assert prepared.shape == (2, 3, 224, 224)
    torch.testing.assert_close(
        prepared[0, :, 0, 0], (1 - torch.tensor(recipe.mean)) / torch.tensor(recipe.std)
    )


def test_mixup_mixes_each_batch_with_a_permutation_and_one_lambda():
    recipe = A.augmentation({"mixup": 0.7})
    x = torch.rand(2, 8, 1, 4, 4)  # a block of two seeds
    y = torch.arange(16).reshape(2, 8)
    draws = torch.stack([draws_of(recipe, 8, (1, 4, 4), seed=s) for s in (0, 1)])
    mixed, partner, lam = recipe.apply(x, y, draws)
    for s in range(2):
        perm = column(draws[s], "partner")
        assert sorted(perm) == list(range(8))
        expected = lam[s] * x[s] + (1 - lam[s]) * x[s][perm]
        torch.testing.assert_close(mixed[s], expected)
        assert partner[s].tolist() == [int(y[s][p]) for p in perm]
        assert 0 < float(lam[s]) < 1
        # the seed alone (no block dimension) gets the same batch
        alone, alone_partner, alone_lam = recipe.apply(x[s], y[s], draws[s])
        assert torch.equal(alone, mixed[s]) and torch.equal(alone_partner, partner[s])


# --- draws: seeded, resumable, block-size independent ---------------------------------------------


def test_sampler_draws_continue_identically_after_a_resume():
    recipe = A.augmentation({"preset": "gradinit_cifar", "mixup": 0.5})

    def sampler():
        return BatchSampler(50, 8, torch.Generator().manual_seed(1), augment=recipe,
                            augment_generator=torch.Generator().manual_seed(2), shape=(3, 32, 32))  # fmt: skip

    straight = sampler()
    sequence = []
    for _ in range(14):  # past two epochs
        sequence.append(
            (straight.next_indices(), straight.draws[straight.position - 8 : straight.position])
        )
    resumed, saved = sampler(), None
    for step in range(14):
        if step == 9:
            saved = resumed.state_dict()
            resumed = sampler()
            resumed.load_state_dict(saved)
        indices = resumed.next_indices()
        assert torch.equal(indices, sequence[step][0])
        assert torch.equal(
            resumed.draws[resumed.position - 8 : resumed.position], sequence[step][1]
        )
    plain = BatchSampler(50, 8, torch.Generator().manual_seed(1))
    assert torch.equal(plain.next_indices(), sequence[0][0])  # augmentation leaves the order as is


DIGITS_AUGMENT = {"crop": 8, "padding": 1, "flip": True, "cutout": 3, "mixup": 0.4,
                  "normalize": {"mean": [0.3], "std": [0.4]}}  # fmt: skip


def run(directory, data, cfg, seeds, **kwargs):
    dtype = torch.float64 if data.x_train.dtype == torch.float64 else torch.float32
    models = [build_cell_model("vgg_bn", "kaiming", seed, data.meta,
                               {"widths": [4, 8], "convs_per_stage": [1, 1]}).to(dtype)
              for seed in seeds]  # fmt: skip
    paths = [TrainPaths.in_directory(directory / f"seed{seed}") for seed in seeds]
    infos = [
        {
            "arch": "vgg_bn",
            "method": "kaiming",
            "seed": seed,
            "meta": data.meta,
            "model_options": {"widths": [4, 8], "convs_per_stage": [1, 1]},
        }
        for seed in seeds
    ]
    summaries = train_block(models, data, cfg, seeds, paths, resume_path=directory / "resume.pt",
                            progress=False, model_info=infos, **kwargs)  # fmt: skip
    return summaries, models


@pytest.mark.slow  # real training runs
def test_a_seed_augmented_in_a_block_equals_the_seed_alone(tmp_path, digits):
    """The draws are the seed's own whatever the block: weights agree to 1e-10 in float64."""
    data = TaskData(digits.x_train.double(), digits.y_train, digits.x_test.double(),
                    digits.y_test, digits.meta)  # fmt: skip
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=32, steps=30, checkpoint_every=10,
                      resume_every=10**6, augment=DIGITS_AUGMENT)  # fmt: skip
    summaries, block = run(tmp_path / "block", data, cfg, [0, 1])
    assert summaries[1]["augment"]["mixup"] == 0.4
    _, alone = run(tmp_path / "alone", data, cfg, [1])
    for name, value in alone[0].state_dict().items():
        other = block[1].state_dict()[name]
        if value.is_floating_point():
            assert float((value - other).abs().max()) <= 1e-10 * max(
                1.0, float(value.abs().max())
            ), name
        else:
            assert torch.equal(value, other), name
    _, plain = run(tmp_path / "plain", data, TrainConfig(**{**vars(cfg), "augment": None}), [1])
    assert not torch.equal(plain[0].state_dict()["classifier.weight"],
                           alone[0].state_dict()["classifier.weight"])  # fmt: skip


class Crash(Exception):
    pass


@pytest.mark.slow  # real training runs
def test_an_augmented_run_resumed_after_a_crash_is_bit_identical(tmp_path, digits):
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=64, steps=40, checkpoint_every=10,
                      resume_every=15, augment=DIGITS_AUGMENT)  # fmt: skip
    _, reference = run(tmp_path / "a", digits, cfg, [0, 1], fingerprint="x")

    def crash(index, metrics, step):
        if step == 30:
            raise Crash

    with pytest.raises(Crash):
        run(tmp_path / "b", digits, cfg, [0, 1], fingerprint="x", on_checkpoint=crash)
    summaries, resumed = run(tmp_path / "b", digits, cfg, [0, 1], fingerprint="x")
    assert [s["resumed_from_step"] for s in summaries] == [15, 15]
    for a, b in zip(reference, resumed, strict=True):
        for name, value in a.state_dict().items():
            assert torch.equal(value, b.state_dict()[name]), name
    assert (tmp_path / "a" / "seed0" / "history.csv").read_bytes() == (
        tmp_path / "b" / "seed0" / "history.csv"
    ).read_bytes()
    assert load_json(tmp_path / "b" / "seed0" / "train.json")["augment"]["crop"] == 8


@pytest.mark.slow  # real training runs
def test_uint8_pixels_train_and_evaluate_as_unit_floats(tmp_path, digits):
    """Pixels stored as uint8 (an image folder's cache) reach the model as x / 255: the same run
    as the float data they round to."""
    pixels = (digits.x_train * 255).round().to(torch.uint8)
    test_pixels = (digits.x_test * 255).round().to(torch.uint8)
    as_uint8 = TaskData(pixels, digits.y_train, test_pixels, digits.y_test, digits.meta)
    as_float = TaskData(pixels.float() / 255, digits.y_train, test_pixels.float() / 255,
                        digits.y_test, digits.meta)  # fmt: skip
    cfg = TrainConfig(lr=0.05, batch_size=64, steps=20, checkpoint_every=10, resume_every=10**6,
                      augment={"flip": True, "normalize": {"mean": [0.3], "std": [0.4]}})  # fmt: skip
    run(tmp_path / "u", as_uint8, cfg, [0])
    run(tmp_path / "f", as_float, cfg, [0])
    assert (tmp_path / "u/seed0/history.csv").read_bytes() == (
        tmp_path / "f/seed0/history.csv"
    ).read_bytes()


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "shape", "kind", "message"),
    [
        ({"flip": True}, [40], "vector", "image tasks"),
        ({"crop": 32}, [1, 8, 8], "image", "crop: 32 is larger than the 8x8 image"),
        ({"cutout": 9}, [1, 8, 8], "image", "cutout: 9 is larger"),
        ({"normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}}, [1, 8, 8], "image",
         "3 means and 3 standard deviations for images of 1 channel"),
    ],
)  # fmt: skip
def test_a_recipe_the_inputs_cannot_take_is_refused(settings, shape, kind, message):
    with pytest.raises(ValueError, match=message):
        A.augmentation(settings).check(kind, shape, "train.t.augment")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"preset": "autoaugment"}, "unknown preset 'autoaugment'"),
        ({"preset": "gradinit_cifar", "resized_crop": 224}, "does not take 'resized_crop'"),
        ({"mixup": 0}, "mixup: alpha 0"),
        ({"cutout": 0}, "cutout: 0"),
        ({"rotate": 10}, r"unknown option\(s\) \['rotate'\]"),
    ],
)
def test_bad_augment_settings_are_refused_naming_the_key(settings, message):
    with pytest.raises(ValueError, match=message):
        A.augmentation(settings, "train.t.augment")


def test_off_is_none():
    assert A.augmentation(None) is None and A.augmentation({}) is None


def test_gradinit_draws_are_augmented_as_training_draws_them(digits):
    """GradInit's scale search draws augmented batches (crop, flip, normalisation), never mixed:
    the same seed gives the same draws, and without a recipe the draws are the plain batches."""
    from trainmap.methods.gradinit import batch_draws

    recipe = A.augmentation({"crop": 8, "padding": 1, "flip": True, "mixup": 0.5,
                             "normalize": {"mean": [0.3], "std": [0.4]}})  # fmt: skip

    def first(recipe_or_none, seed=0):
        return next(batch_draws(digits, 64, torch.Generator().manual_seed(seed), recipe_or_none))

    plain_x, plain_y = first(None)
    x, y = first(recipe)
    assert torch.equal(y, plain_y)  # the same examples: the order is drawn first
    assert not torch.equal(x, plain_x) and x.min() < 0  # augmented and normalised
    assert torch.equal(first(recipe)[0], x)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(digits.x_train), generator=generator)[:64]
    draws = A.without_mixup(recipe).draw_epoch(len(digits.x_train), 64, (1, 8, 8), generator)
    expected, partner, _ = A.without_mixup(recipe).apply(digits.x_train[order], plain_y, draws[:64])
    assert partner is None and torch.equal(x, expected)


@pytest.mark.slow  # a real training run
def test_evaluation_of_a_run_normalises_as_its_training_did(tmp_path, digits):
    """evaluate_run reads the recipe the run's train.json names and evaluates every form on
    normalised inputs: the accuracy its training loop recorded at the last checkpoint."""
    import pandas as pd

    from trainmap.evaluation import evaluate_run

    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=64, steps=20, checkpoint_every=10,
                      resume_every=10**6, augment={"flip": True,
                                                   "normalize": {"mean": [5.0], "std": [0.1]}})  # fmt: skip
    summaries, _ = run(tmp_path, digits, cfg, [0])
    history = pd.read_csv(tmp_path / "seed0" / "history.csv")
    record = evaluate_run(tmp_path / "seed0" / "model.pt", history, summaries[0], digits,
                          threshold=0.5, latency="none")  # fmt: skip
    assert record["test_acc"] == pytest.approx(history["test_acc"].iloc[-1], abs=1e-12)
    unnormalised = {**summaries[0], "augment": None}
    other = evaluate_run(tmp_path / "seed0" / "model.pt", history, unnormalised, digits,
                         threshold=0.5, latency="none")  # fmt: skip
    assert other["test_acc"] != record["test_acc"]  # the statistics matter


def test_the_schema_lists_the_presets_and_options_the_code_has():
    from trainmap.schema import config_schema

    augment = config_schema()["$defs"]["train_settings"]["properties"]["augment"]
    assert augment["properties"]["preset"]["enum"] == list(A.PRESETS)
    assert set(augment["properties"]) == {"preset", *A.OPTIONS}
