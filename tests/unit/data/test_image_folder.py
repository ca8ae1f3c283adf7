"""The ``image_folder`` kind: a uint8 cache of short-side-resized, centre-cropped RGB images,
labelled by sorted class name, its header-only file checks, its listing-only model meta, the
generated folder and the plan's estimate of its cache."""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from trainmap import data, grid, plan
from trainmap.data import image_folder
from trainmap.data.packaged import MissingDataPackage

SIZE = 12
#: class -> split -> [(file name, PIL mode, (width, height))]; classes sorted: ant, bee, cat.
LAYOUT = {
    "cat": {"train": [("c0.png", "RGB", (20, 14)), ("c1.jpg", "RGB", (14, 20)),
                      ("c2.png", "L", (20, 14)), ("c3.png", "RGB", (16, 16))],
            "val": [("v0.png", "RGB", (14, 20)), ("v1.jpg", "RGB", (20, 14))]},
    "ant": {"train": [("a0.png", "RGB", (14, 20)), ("a1.jpg", "RGB", (20, 14)),
                      ("a2.png", "RGBA", (20, 14)), ("a3.png", "RGB", (15, 22))],
            "val": [("v0.png", "RGB", (20, 14)), ("v1.png", "RGB", (14, 20))]},
    "bee": {"train": [("b0.png", "RGB", (20, 14)), ("b1.jpg", "RGB", (14, 20)),
                      ("b2.png", "RGB", (21, 13)), ("b3.jpg", "RGB", (14, 20))],
            "val": [("v0.jpg", "RGB", (14, 20)), ("v1.png", "RGB", (20, 14))]},
}  # fmt: skip
CLASSES = ["ant", "bee", "cat"]


def write_folder(root: Path, layout: dict = LAYOUT, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for name, splits in layout.items():
        for split, files in splits.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for file, mode, (width, height) in files:
                channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
                pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
                Image.fromarray(pixels.squeeze(2) if channels == 1 else pixels, mode).save(
                    folder / file
                )
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def task(folder: Path) -> data.TaskData:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the RGB conversion, tested on its own
        return data.make_task_data("image_folder", {"path": str(folder), "size": SIZE})


def expected_pixels(file: Path, size: int) -> torch.Tensor:
    """torchvision's own short-side resize (bilinear, antialiased) and centre crop of ``file``."""
    from torchvision.transforms.v2 import functional

    rgb = np.array(Image.open(file).convert("RGB"))
    image = torch.from_numpy(rgb).permute(2, 0, 1)
    resized = functional.resize(image, [size], antialias=True)
    return functional.center_crop(resized, [size, size])


# --- the cache: shapes, labels, pixels ------------------------------------------------------------


def test_the_cache_is_uint8_images_labelled_by_sorted_class_name(task: data.TaskData) -> None:
    assert task.x_train.shape == (12, 3, SIZE, SIZE) and task.x_test.shape == (6, 3, SIZE, SIZE)
    assert task.x_train.dtype == task.x_test.dtype == torch.uint8
    assert task.y_train.dtype == task.y_test.dtype == torch.int64
    assert task.y_train.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # ant, bee, cat
    assert task.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    assert task.meta["classes"] == CLASSES and task.meta["num_classes"] == 3
    assert task.meta["input_kind"] == "image" and task.meta["input_shape"] == [3, SIZE, SIZE]
    assert task.meta["pixels"] == "uint8" and task.meta["size"] == SIZE


def test_each_image_is_resized_to_its_short_side_and_centre_cropped(
    folder: Path, task: data.TaskData
) -> None:
    files, _ = image_folder.image_folder_files(folder, "train")
    for index in (0, 1, 5, 8):  # 14x20 PNG, 20x14 JPEG, 14x20 JPEG, 20x14 PNG
        expected = expected_pixels(files[index], SIZE).int()
        assert (task.x_train[index].int() - expected).abs().max() <= 1, files[index]


def test_the_crop_is_the_centre_of_the_resized_image(tmp_path: Path) -> None:
    """Independently of torchvision: a 30x10 image (short side already 10) keeps its middle 10
    columns, 10..19: all green of red/green/blue bands of 10, half red half green shifted by 5."""
    bands = np.zeros((10, 30, 3), dtype=np.uint8)
    bands[:, :10, 0], bands[:, 10:20, 1], bands[:, 20:, 2] = 255, 255, 255
    for split in ("train", "val"):
        (tmp_path / split / "x").mkdir(parents=True)
        Image.fromarray(bands).save(tmp_path / split / "x" / "bands.png")
    shifted = np.roll(bands, 5, axis=1)  # red 5..14, green 15..24
    Image.fromarray(shifted).save(tmp_path / "train" / "x" / "shifted.png")
    task = data.read_image_folder(tmp_path, size=10)
    green = torch.zeros(3, 10, 10, dtype=torch.uint8)
    green[1] = 255
    assert torch.equal(task.x_train[0], green)
    assert task.x_train[1, 0, :, :5].eq(255).all() and task.x_train[1, 1, :, 5:].eq(255).all()
    assert task.x_train[1, 2].eq(0).all()


def test_two_reads_are_identical(folder: Path, task: data.TaskData) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        again = data.read_image_folder(folder, size=SIZE)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(task, key), getattr(again, key)), key
    assert again.meta == task.meta


def test_n_train_keeps_a_seeded_stratified_subsample_of_the_same_images(
    folder: Path, task: data.TaskData
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        small = data.read_image_folder(folder, size=SIZE, n_train=6, seed=3)
        again = data.read_image_folder(folder, size=SIZE, n_train=6, seed=3)
    assert small.y_train.tolist() == [0, 0, 1, 1, 2, 2]
    assert small.meta["n_train"] == 6 and small.meta["subsampled"] is True
    assert torch.equal(small.x_train, again.x_train)
    keep = data.stratified_subsample(task.y_train, 6, 3)
    assert torch.equal(small.x_train, task.x_train[keep])
    assert torch.equal(small.x_test, task.x_test)
    with pytest.raises(ValueError, match=r"n_train must be in \[1, 12\], got 13"):
        data.read_image_folder(folder, size=SIZE, n_train=13)


def test_non_rgb_images_are_converted_with_one_warning_naming_the_count_and_a_file(
    folder: Path,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.read_image_folder(folder, size=SIZE)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    assert "2 image(s) not RGB (modes L, RGBA; e.g. " in messages[0]
    assert "a2.png" in messages[0] and messages[0].endswith("converted to RGB")


def test_a_grayscale_image_becomes_three_equal_channels_and_16_bits_are_scaled(
    tmp_path: Path,
) -> None:
    wide = np.full((8, 8), 65535, dtype=np.uint16)
    wide[:, 4:] = 32896  # 128.5 x 256: 128 in 8 bits
    for split in ("train", "val"):
        (tmp_path / split / "g").mkdir(parents=True)
        Image.fromarray(wide).save(tmp_path / split / "g" / "wide.png")
    with pytest.warns(UserWarning, match="converted to RGB"):
        task = data.read_image_folder(tmp_path, size=8)
    x = task.x_train[0]
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])
    assert x[0, :, :4].eq(255).all() and x[0, :, 4:].eq(128).all()


def test_without_torchvision_the_reader_names_the_extra(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision.transforms.v2", None)
    with pytest.raises(MissingDataPackage, match=r"needs torchvision .*pip install "
                       r"'trainmap\[workflow\]'$"):  # fmt: skip
        data.read_image_folder(folder)
    # the listing-only paths need no torchvision
    assert data.model_meta("image_folder", {"path": str(folder)})["num_classes"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the RGB conversion, tested on its own
        assert data.damaged_data_files("image_folder", folder) == []


# --- checks before any job: listing and headers only ----------------------------------------------


def test_model_meta_counts_class_folders_without_opening_an_image(
    folder: Path, task: data.TaskData, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("model_meta opened an image")

    monkeypatch.setattr(Image, "open", refuse)
    described = data.model_meta("image_folder", {"path": str(folder), "size": SIZE})
    assert described == {"kind": "image_folder", "input_kind": "image",
                         "input_shape": [3, SIZE, SIZE], "num_classes": 3}  # fmt: skip
    assert described == {key: task.meta[key] for key in described}
    assert data.model_meta("image_folder", {"path": str(folder)})["input_shape"] == [3, 64, 64]


def test_model_meta_counts_a_class_of_one_split_and_names_a_missing_folder(tmp_path: Path) -> None:
    for split, name in (("train", "a"), ("train", "b"), ("val", "a"), ("val", "z")):
        (tmp_path / split / name).mkdir(parents=True)
    assert data.model_meta("image_folder", {"path": str(tmp_path)})["num_classes"] == 3
    absent = tmp_path / "absent"
    with pytest.raises(ValueError, match=rf"directory '{absent}' does not exist; .*fix the path"):
        data.model_meta("image_folder", {"path": str(absent)})


def test_a_missing_split_is_named(folder: Path, tmp_path: Path) -> None:
    assert data.missing_data_files("image_folder", folder) == []
    (tmp_path / "train" / "a").mkdir(parents=True)
    assert data.missing_data_files("image_folder", tmp_path) == ["val"]
    with pytest.raises(ValueError, match=r"lacks the split folder\(s\) val"):
        data.read_image_folder(tmp_path)


def test_damaged_files_names_each_problem_from_headers_only(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "images", {
        "ant": {"train": [("a.png", "RGB", (9, 9))], "val": [("a.png", "RGB", (9, 9))]},
        "bee": {"train": [("b.png", "RGB", (9, 9))], "val": [("b.png", "RGB", (9, 9))]},
        "cat": {"train": [("c.png", "RGB", (9, 9))]},
    })  # fmt: skip
    assert data.damaged_data_files("image_folder", root) == [
        (str(root / "val"), "lacks class 'cat' (in train/ only): every class needs images in "
         "both train/ and val/; add val/cat/ or remove train/cat/"),
    ]  # fmt: skip
    (root / "val" / "cat").mkdir()
    (root / "train" / "ant" / "empty.png").write_bytes(b"")
    (root / "train" / "bee" / "page.jpg").write_text("<html>Not Found</html>")
    (root / "train" / "bee" / ".DS_Store").write_bytes(b"\0\1")  # hidden: not an image file
    truncated = (root / "val" / "ant" / "a.png").read_bytes()
    (root / "val" / "ant" / "a.png").write_bytes(truncated[:-40])  # pixels cut: header intact
    assert dict(data.damaged_data_files("image_folder", root)) == {
        str(root / "train" / "ant" / "empty.png"):
            "is empty (0 bytes): replace it with the image or remove it",
        str(root / "train" / "bee" / "page.jpg"):
            "is not an image PIL can identify (an HTML or XML page: a saved error page?): "
            "remove it or replace it with the image",
        str(root / "val" / "cat"): "is an empty class folder: put class 'cat''s images in it or "
                                   "remove it",
    }  # fmt: skip


def test_a_split_without_class_folders_is_named(tmp_path: Path) -> None:
    (tmp_path / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (9, 9)).save(tmp_path / "train" / "a" / "x.png")
    (tmp_path / "val").mkdir()
    assert data.damaged_data_files("image_folder", tmp_path) == [
        (str(tmp_path / "val"), "holds no class folder: put each class's images in val/<class>/")
    ]


# --- the generated folder -------------------------------------------------------------------------


def test_generate_image_folder_is_deterministic_class_structured_and_readable(
    tmp_path: Path,
) -> None:
    first = data.generate_image_folder(tmp_path / "a", n_classes=3, n_train=4, n_val=2, size=16,
                                       seed=5)  # fmt: skip
    second = data.generate_image_folder(tmp_path / "b", n_classes=3, n_train=4, n_val=2, size=16,
                                        seed=5)  # fmt: skip
    files = sorted(p.relative_to(first) for p in first.rglob("*.png"))
    assert len(files) == 3 * (4 + 2)
    assert files == sorted(p.relative_to(second) for p in second.rglob("*.png"))
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    sizes = {Image.open(first / f).size for f in files}
    assert all(16 <= side <= 24 for size in sizes for side in size) and len(sizes) > 1
    assert data.image_folder_classes(first) == ["class_0", "class_1", "class_2"]
    assert data.damaged_data_files("image_folder", first) == []
    other = data.generate_image_folder(tmp_path / "c", n_classes=3, n_train=4, n_val=2, size=16,
                                       seed=6)  # fmt: skip
    assert (other / files[0]).read_bytes() != (first / files[0]).read_bytes()
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        data.generate_image_folder(first)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_generated_classes_differ_more_between_than_within(tmp_path: Path) -> None:
    """The class is in the pixels: each image is nearer its own class's mean image than any
    other's (the stripes' orientation and hue), so a small CNN has something to learn."""
    root = data.generate_image_folder(tmp_path / "g", n_classes=3, n_train=12, n_val=1, size=16,
                                      noise=0.1)  # fmt: skip
    task = data.read_image_folder(root, size=16)
    x = task.x_train.float() / 255
    # the phase is random, so compare the images' power spectra per channel, not their pixels
    spectra = torch.fft.fft2(x - x.mean(dim=(2, 3), keepdim=True)).abs().flatten(1)
    means = torch.stack([spectra[task.y_train == c].mean(0) for c in range(3)])
    nearest = torch.cdist(spectra, means).argmin(1)
    assert (nearest == task.y_train).float().mean() >= 0.9


# --- the plan's estimate of the cache -------------------------------------------------------------


def test_the_plan_counts_the_cache_from_the_listing(folder: Path) -> None:
    assert data.image_folder_sizes(folder) == (12, 6)
    assert data.image_folder_sizes(folder, n_train=6) == (6, 6)
    assert data.image_folder_cache_bytes(folder, 32) == 18 * 3 * 32 * 32
    assert plan.dataset_examples("image_folder", {"path": str(folder), "n_train": 3}) == (3, 6)
    config = {"data": {"imgs": {"kind": "image_folder", "path": str(folder), "size": 32}}}
    profile = plan.ModelProfile(*[0] * 8, input_bytes=4 * 3 * 32 * 32, linear_only=False)
    assert plan.dataset_bytes(config, "imgs", profile) == (18 * (3 * 32 * 32 + 8), 6)


def test_the_plan_refuses_a_cache_past_the_node_naming_the_data_keys(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data job holds the cache (3 copies while it is read and saved); past the node's RAM it
    is refused naming n_train and size. A missing folder is refused, not planned without it: the
    plan counts its classes and images from it."""
    monkeypatch.chdir(Path(__file__).resolve().parents[3])  # params.yaml, config/config.yaml
    study = {
        "grid": [{"task": "imgs", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}],
        "data": {"imgs": {"kind": "image_folder", "path": str(folder), "size": 16}},
        "train": {"imgs": {"optimizer": "sgd", "lr": 0.1, "batch_size": 8, "steps": 20,
                           "checkpoint_every": 10}},
        "evaluate": {"imgs": {"threshold": 0.5}},
    }  # fmt: skip
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    config = grid.merged_config("params.yaml", "config/config.yaml", str(tmp_path / "study.yaml"))
    profile = plan.ModelProfile(*[0] * 8, input_bytes=4 * 3 * 16 * 16, linear_only=False)
    monkeypatch.setattr("trainmap.plan.estimates.model_profile", lambda *args: profile)
    job = next(job for job in plan.block_jobs(config) if job.rule == "data")
    assert job.ram == plan.BASE_RAM + 3 * 18 * (3 * 16 * 16 + 8)
    jobs = pd.DataFrame([asdict(job)])
    with pytest.raises(plan.PlanError, match=r"rule data, job imgs: host RAM .* exceeds the node's "
                       r".* GB; change data\.imgs\.n_train or data\.imgs\.size$"):  # fmt: skip
        plan.check_limits(jobs, plan.NodeLimits(ram_gb=(job.ram - 1) / plan.GB))
    study["data"]["imgs"]["path"] = str(tmp_path / "absent")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    with pytest.raises(grid.ConfigError, match=r"data\.imgs\.path: directory .*absent"):
        plan.load_plan_config([str(tmp_path / "study.yaml")])


def test_the_config_check_says_which_images_it_will_convert(folder: Path) -> None:
    """Mixed grayscale/RGBA images are not damage: the header check warns how many it converts."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert data.damaged_data_files("image_folder", folder) == []
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1 and "2 image(s) are not RGB (L (1), RGBA (1)" in messages[0], messages


def test_num_classes_sizes_a_folder_not_there_yet_and_must_match_one_that_is(
    folder: Path, tmp_path: Path
) -> None:
    absent = {"path": str(tmp_path / "later"), "size": 16, "num_classes": 10}
    assert data.model_meta("image_folder", absent)["num_classes"] == 10
    assert data.model_meta("image_folder", absent)["input_shape"] == [3, 16, 16]
    with pytest.raises(ValueError, match="num_classes 5 but .* holds 3 class folders"):
        data.model_meta("image_folder", {"path": str(folder), "num_classes": 5})
