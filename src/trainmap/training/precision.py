"""The arithmetic a training block runs in (``train.<task>.precision``, ``train.<task>.deterministic``).

* ``fp32``: every matmul and convolution in float32 (on CUDA, TF32 switched off for both; torch's
  own default lets cuDNN convolutions use TF32);
* ``tf32``: float32 storage, TensorFloat-32 matmuls and convolutions (CUDA devices of compute
  capability 8.0 and later; on the CPU it would change nothing, so it is refused there);
* ``bf16``: the forward pass and the loss under ``torch.autocast`` with bfloat16 (weights,
  gradients and optimiser state stay float32; no loss scaling, as bfloat16 has float32's range).

Whatever the precision, the 14 weight metrics are computed in float64 from the float32 weights, and
on CUDA the optimiser is torch's fused kernel. ``deterministic`` asks torch for deterministic
kernels (``torch.use_deterministic_algorithms``, with cuBLAS's ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
set before CUDA starts): a rerun on the same GPU model and software then gives the same bits; the
CPU's results are deterministic without it. GPU bits are never portable across GPU models or
library versions, so a results digest made on a GPU holds for that GPU only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision ``device`` cannot run, naming the key and what to use instead."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.<task>.precision: {precision!r} is not allowed; allowed: "
                         f"{', '.join(PRECISIONS)}")  # fmt: skip
    if precision == "tf32":
        if device.type != "cuda":
            raise ValueError(
                f"train.<task>.precision: tf32 runs on CUDA devices only (the training device is "
                f"{device}, where it would change nothing); use fp32 or bf16"
            )
        if torch.cuda.get_device_capability(device) < (8, 0):
            raise ValueError(
                f"train.<task>.precision: tf32 needs a CUDA device of compute capability 8.0 or "
                f"later; {torch.cuda.get_device_name(device)} is "
                f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}; use fp32"
            )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"train.<task>.precision: bf16 is not supported on {device} "
                         f"({torch.cuda.get_device_name(device)}); use fp32")  # fmt: skip


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """The context a forward pass and its loss run in: bf16 autocast, or nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@contextmanager
def arithmetic(precision: str, device: torch.device, deterministic: bool) -> Iterator[None]:
    """Within it: the TF32 switches ``precision`` asks for (CUDA) and, with ``deterministic``,
    deterministic kernels; both are put back as they were on leaving."""
    check_precision(precision, device)
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = (
            precision == "tf32"
        )
    if deterministic:
        # read when cuBLAS starts; a process that already used CUDA keeps its setting
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            deterministic_before,
            torch.backends.cudnn.benchmark,
        ) = saved
        torch.use_deterministic_algorithms(deterministic_before)
