"""Portable numbers: the same seed and config give the same bits on any x86-64 CPU (issue 31).

A CPU run's bits depend on which code path each math library picks for the CPU it finds. Portable
mode pins every such choice to the path that any x86-64 CPU can take:

* ``ATEN_CPU_CAPABILITY=default``: ATen's vectorised kernels (element-wise ops, reductions, the
  optimisers' foreach updates) as compiled for baseline x86-64, not their AVX2 / AVX-512 builds;
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility, the branch that gives the
  same results on Intel and non-Intel CPUs (torch's BLAS: every ``Linear`` and matmul);
* ``ONEDNN_MAX_CPU_ISA=SSE41`` (and its old name ``DNNL_MAX_CPU_ISA``): oneDNN's JIT kernels, which
  torch uses for convolutions, capped at SSE4.1 (oneDNN's lowest ISA);
* ``OPENBLAS_CORETYPE=Nehalem``: the OpenBLAS kernels of numpy and scipy (the HMM fits of the
  analysis), which otherwise follow the CPU (measured here: a full-covariance HMM fit gives other
  bits under Haswell, Sandybridge and Nehalem kernels), pinned to x86-64-v2, numpy's own baseline;
* ``NPY_DISABLE_CPU_FEATURES``: numpy's dispatched AVX2 / AVX-512 loops off, so its ufuncs run the
  baseline build on every CPU (read when numpy is imported).

Each library reads its variable once, at its first use (ATen at the first kernel dispatch, MKL at
its first call, oneDNN at its first primitive), so the variables must be in ``os.environ`` before
the process's first torch operation; importing torch alone reads none of them.
:func:`apply_portable_mode` sets them, and :func:`conflicts` says when it came too late.

What stays the same without a pin: the intra-op thread count is the job's own (the ``train`` rule
runs one thread) and changes bits on its own, so it is part of the config, not of the CPU.

What it cannot cover: GPUs (cuBLAS / cuDNN choose kernels per device model), other architectures
(ARM, POWER: other libraries, other kernels), other versions of torch, MKL or oneDNN (their baseline
kernels may change), and CPUs older than x86-64-v2 (SSE4.2, 2008), which numpy itself needs.

Switch: ``TRAINMAP_PORTABLE`` in the environment Snakemake (or a cluster job) starts from: on by
default (``1``), so the published default study reproduces on any x86-64 CPU; ``TRAINMAP_PORTABLE=0``
gives each library the fastest path of the CPU it runs on (bench/portable.py: portable training
runs at about 0.7 of that speed on an AVX2 CPU).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import MutableMapping

#: The switch: "1" (the default) or "0".
SWITCH_ENV = "TRAINMAP_PORTABLE"
#: The environment of the portable mode; every library reads its variable at its first use.
PORTABLE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "DNNL_MAX_CPU_ISA": "SSE41",
    "OPENBLAS_CORETYPE": "Nehalem",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
}
#: What ``torch.backends.cpu.get_cpu_capability()`` reports under the pin.
PORTABLE_CPU_CAPABILITY = "DEFAULT"


def portable_enabled(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether portable mode is on: ``$TRAINMAP_PORTABLE`` unset or 1/on/true/yes."""
    return environ.get(SWITCH_ENV, "1").strip().lower() in {"1", "on", "true", "yes"}


def portable_environment(enabled: bool) -> dict[str, str]:
    """The variables to set for portable mode on (the pins and the switch) or off (the switch)."""
    return {**PORTABLE_ENV, SWITCH_ENV: "1"} if enabled else {SWITCH_ENV: "0"}


def conflicts(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Why this process may not compute with the pinned code paths: a pinned variable that differs
    in ``environ``, or ATen already dispatching with another CPU capability (torch ran before the
    pin was set). Empty when portable mode holds, as far as can be seen from Python (MKL and oneDNN
    cannot be asked which path they took)."""
    found = [f"{name}={environ.get(name)!r}, not {value!r}"
             for name, value in PORTABLE_ENV.items() if environ.get(name) != value]  # fmt: skip
    torch = sys.modules.get("torch")
    if torch is not None:
        capability = torch.backends.cpu.get_cpu_capability()  # read once per process, then fixed
        if capability != PORTABLE_CPU_CAPABILITY:
            found.append(f"torch already runs with CPU capability {capability}, not "
                         f"{PORTABLE_CPU_CAPABILITY}: portable mode was set after torch's first "
                         "operation")  # fmt: skip
    return found


def apply_portable_mode(
    enabled: bool | None = None,
    environ: MutableMapping[str, str] = os.environ,
    *,
    strict: bool = False,
) -> list[str]:
    """Set portable mode's variables in ``environ`` (``enabled`` None: as ``$TRAINMAP_PORTABLE``
    says). Call it before the process's first torch operation. Returns :func:`conflicts` (empty
    when off) after a warning naming them, or raises ``RuntimeError`` with them when ``strict``."""
    if enabled is None:
        enabled = portable_enabled(environ)
    environ.update(portable_environment(enabled))
    found = conflicts(environ) if enabled else []
    if found:
        message = "trainmap portable mode does not hold: " + "; ".join(found)
        if strict:
            raise RuntimeError(message)
        warnings.warn(message, stacklevel=2)
    return found
