"""The checkpoint archive: which of a run's checkpoints are kept on disk, and in which dtype.

A run's metrics are computed inside the training loop at every checkpoint
(:class:`trainmap.training.record.CheckpointRecorder`), so its weights need not be kept for the
map. What is kept is a choice per task (``train.<task>.archive``), declared once in the config
schema:

``schedule``
    ``all`` (every checkpoint), ``none`` (no checkpoint; the final model is always kept as
    ``model.pt``), ``every N`` (every N-th checkpoint) or ``log K`` (about K checkpoints spaced
    evenly in log(checkpoint index), dense early as Pythia's suites are). Every schedule but
    ``none`` keeps the first and the last checkpoint.
``dtype``
    ``float32`` (the training dtype: a full archive gives back today's weights bit for bit),
    ``bfloat16`` or ``float16`` (half the bytes; integer buffers such as BatchNorm's
    ``num_batches_tracked`` are kept as they are).

One safetensors file per kept checkpoint and seed, ``<run dir>/checkpoints/step_<step>.safetensors``,
written (atomically) when the checkpoint is taken and never held in memory or in a resume file
afterwards. The directory is an external run's layout (:mod:`trainmap.dynamics.runs.external`: state
dicts named by step), so an archive can be mapped, and its metrics recomputed, by the same code that
reads any other run's checkpoints.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainmap.faults import fault_point
from trainmap.io import write_atomic
from trainmap.schema import section_defaults

ARCHIVE_DIRECTORY = "checkpoints"
SCHEDULE_PATTERN = re.compile(r"^(all|none|every ([1-9][0-9]*)|log ([1-9][0-9]*))$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The defaults of ``train.<task>.archive``: the schema's.
ARCHIVE_DEFAULTS: dict[str, str] = section_defaults("train", "archive")


#: The most checkpoints one run may take. Each is a row of the metric table (14 metrics, 8 bytes
#: each, before any analysis) and a step of every HMM pass over the run: at 1,000,000 checkpoints
#: one run's table is 112 MB in memory and a study of 32 runs 3.6 GB, past what the analysis jobs
#: of a workstation hold. A count above it is refused before any work (``config key
#: train.<task>.checkpoint_every``), computed by :func:`n_checkpoints` without listing the steps.
MAX_CHECKPOINTS = 1_000_000


def n_checkpoints(steps: int, checkpoint_every: int) -> int:
    """``len(checkpoint_steps(steps, checkpoint_every))`` in constant time and memory: 0, every
    ``checkpoint_every`` steps, and the last step when it is not a multiple."""
    return steps // checkpoint_every + 1 + (steps % checkpoint_every != 0)


def checkpoint_steps(steps: int, checkpoint_every: int) -> list[int]:
    """The steps at which the loop takes a checkpoint: 0, every ``checkpoint_every`` steps, and the
    last step (``steps``) when it is not a multiple."""
    taken = list(range(0, steps + 1, checkpoint_every))
    return taken if taken[-1] == steps else [*taken, steps]


def kept_indices(n_checkpoints: int, schedule: str) -> list[int]:
    """The indices (0 .. n - 1) of the checkpoints ``schedule`` keeps (see the module docstring)."""
    match = SCHEDULE_PATTERN.match(schedule)
    if match is None:
        raise ValueError(f"archive schedule {schedule!r}: use all, none, 'every N' or 'log K' "
                         "(N, K positive integers)")  # fmt: skip
    if n_checkpoints <= 0 or schedule == "none":
        return []
    last = n_checkpoints - 1
    if schedule == "all":
        return list(range(n_checkpoints))
    if match.group(2):
        return sorted({*range(0, n_checkpoints, int(match.group(2))), last})
    count = int(match.group(3))
    if last == 0:
        return [0]
    # K points evenly spaced in log(1 + index) from index 0 to the last one.
    spaced = {round(math.expm1(math.log1p(last) * i / max(count - 1, 1))) for i in range(count)}
    return sorted(spaced | {0, last})


@dataclass(frozen=True)
class ArchivePolicy:
    """``train.<task>.archive``: which checkpoints a run keeps on disk and in which dtype (an
    omitted one: the schema's default, :data:`ARCHIVE_DEFAULTS`)."""

    schedule: str = ARCHIVE_DEFAULTS["schedule"]
    dtype: str = ARCHIVE_DEFAULTS["dtype"]

    @classmethod
    def from_value(cls, value: ArchivePolicy | Mapping[str, Any] | None) -> ArchivePolicy:
        """From the config mapping (missing keys: the defaults); a bad value is an error naming
        ``train.<task>.archive`` and the allowed values."""
        if isinstance(value, ArchivePolicy):
            return value
        settings = dict(value or {})
        unknown = sorted(set(settings) - {"schedule", "dtype"})
        if unknown:
            raise ValueError(f"train.<task>.archive: unknown keys {unknown}; allowed: schedule, "
                             "dtype")  # fmt: skip
        policy = cls(**settings)
        if SCHEDULE_PATTERN.match(str(policy.schedule)) is None:
            raise ValueError(f"train.<task>.archive.schedule: {policy.schedule!r} is not a "
                             "schedule; use all, none, 'every N' or 'log K'")  # fmt: skip
        if policy.dtype not in DTYPES:
            raise ValueError(f"train.<task>.archive.dtype: {policy.dtype!r}; allowed: "
                             f"{', '.join(DTYPES)}")  # fmt: skip
        return policy

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def full(self) -> bool:
        """Whether the archive gives back every checkpoint exactly (schedule ``all``, float32):
        then redefining a metric needs no retraining."""
        return self.schedule == "all" and self.dtype == "float32"

    def kept_steps(self, steps: Sequence[int]) -> list[int]:
        """The checkpoint ``steps`` (in order) this policy keeps."""
        return [steps[i] for i in kept_indices(len(steps), self.schedule)]

    def bytes_per_run(self, n_checkpoints: int, n_elements: int) -> int:
        """Bytes of the kept checkpoints' tensors of one run (``n_elements`` floating-point
        entries per checkpoint; safetensors adds a header of a few kB per file)."""
        size = torch.empty((), dtype=self.torch_dtype).element_size()
        return len(kept_indices(n_checkpoints, self.schedule)) * n_elements * size

    def check_device(self, device: torch.device) -> None:
        """A dtype the training device cannot convert to is an error naming the key before any
        step (bfloat16 on a CUDA device without bfloat16 support)."""
        if (
            self.dtype == "bfloat16"
            and device.type == "cuda"
            and not torch.cuda.is_bf16_supported()
        ):
            raise ValueError(f"train.<task>.archive.dtype: bfloat16 is not supported on {device} "
                             f"({torch.cuda.get_device_name(device)}); use float16 or float32")  # fmt: skip


def archive_directory(run_directory: str | os.PathLike) -> Path:
    """Where a run keeps its archived checkpoints."""
    return Path(run_directory) / ARCHIVE_DIRECTORY


def checkpoint_file(run_directory: str | os.PathLike, step: int) -> Path:
    """The archive file of checkpoint ``step`` (``step_00000100.safetensors``: names sort by step)."""
    return archive_directory(run_directory) / checkpoint_name(step)


def checkpoint_name(step: int) -> str:
    """The archive file name of checkpoint ``step``."""
    return f"step_{step:08d}.safetensors"


def write_checkpoint(path: str | os.PathLike, state: Mapping[str, torch.Tensor],
                     dtype: torch.dtype) -> None:  # fmt: skip
    """One checkpoint's state dict as a safetensors file, floating-point entries in ``dtype``,
    written atomically (the same content is the same bytes)."""
    from safetensors.torch import save

    # copies: entries may be views of one block's stacked tensors, or tied weights sharing memory
    tensors = {
        name: value.detach().to("cpu", dtype if value.is_floating_point() else None, copy=True)
        for name, value in state.items()
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # Serialised here and written by Python (the same bytes as safetensors' save_file): a full
    # disk then raises OSError (ENOSPC, EFBIG), which the atomic write names with its path.
    content = save(tensors, metadata={"format": "trainmap"})

    def write(tmp: Path) -> None:
        fault_point("checkpoint")
        with open(tmp, "wb") as stream:
            stream.write(content)

    write_atomic(path, write)


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """One archived checkpoint's state dict (floating-point entries in the archive's dtype)."""
    from safetensors.torch import load_file

    return load_file(str(path), device="cpu")


def archived_steps(run_directory: str | os.PathLike) -> list[int]:
    """The steps whose checkpoints a run's archive holds, in order (none: an empty list)."""
    directory = archive_directory(run_directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.stem.removeprefix("step_")) for p in directory.glob("step_*.safetensors"))


def read_archive(run_directory: str | os.PathLike) -> dict[str, Any]:
    """A run's archived checkpoints stacked: ``{"step": LongTensor[n], "state": {name: [n, ...]}}``
    (every kept checkpoint in memory at once: for small runs and tests; the metrics path reads an
    archive a chunk at a time through :mod:`trainmap.dynamics.runs.external`)."""
    steps = archived_steps(run_directory)
    if not steps:
        raise FileNotFoundError(f"{archive_directory(run_directory)}: no archived checkpoint; the "
                                "run's train.<task>.archive.schedule kept none")  # fmt: skip
    states = [read_checkpoint(checkpoint_file(run_directory, step)) for step in steps]
    return {"step": torch.tensor(steps, dtype=torch.long),
            "state": {name: torch.stack([s[name] for s in states]) for name in states[0]}}  # fmt: skip
