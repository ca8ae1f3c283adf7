"""Portable numbers: the same seed and config give the same bits whatever x86-64 CPU runs them.

A CPU run's bits depend on which code path each math library picks for the CPU it finds. Portable
mode pins every such choice a library lets a process make (an Intel Xeon still gave other bits for
a few stages than the AMD EPYC that publishes the digests: docs/running.md, Portable numbers):

* ATen's vectorised kernels (``ATEN_CPU_CAPABILITY``: element-wise ops, reductions, the optimisers'
  foreach updates);
* MKL's conditional numerical reproducibility branch (``MKL_CBWR``: torch's BLAS, every ``Linear``
  and matmul; MKL honours ``COMPATIBLE`` on AMD CPUs too);
* oneDNN's JIT kernels (``ONEDNN_MAX_CPU_ISA`` and its old name ``DNNL_MAX_CPU_ISA``: torch's
  convolutions);
* OpenBLAS's kernels (``OPENBLAS_CORETYPE``: numpy's and scipy's BLAS, the HMM fits of the
  analysis);
* numpy's dispatched loops (``NPY_DISABLE_CPU_FEATURES``, read when numpy is imported).

Two levels (:data:`LEVELS`):

* ``baseline`` (the default): every library on the path any x86-64 CPU takes (ATen ``default``,
  MKL ``COMPATIBLE``, oneDNN SSE4.1, OpenBLAS Nehalem, numpy's x86-64-v2 baseline).
* ``avx2``: ATen, oneDNN, OpenBLAS and numpy on their AVX2 paths, the ones any
  x86-64 CPU with AVX2 and FMA takes (Intel since 2013, AMD since 2015; every current server CPU),
  their AVX-512 paths off, and MKL on its ``COMPATIBLE`` branch: MKL is the one library that picks
  kernels by CPU vendor (asked for its AVX2 branch on this AMD EPYC, it reports ``CNR:AUTO``), and
  ``COMPATIBLE`` is the branch it documents as the same on Intel and non-Intel CPUs. The other
  libraries' kernels are vendor-neutral code, so one ISA gives one set of bits.

What each level costs, and which pins change which bits, is measured in the docs (running.md,
"Portable numbers"; decisions/default-study.md).

Each library reads its variable once, at its first use (ATen at the first kernel dispatch, MKL at
its first call, oneDNN at its first primitive, OpenBLAS and numpy's dispatch when numpy loads), so
the variables must be in ``os.environ`` before the process imports numpy and runs its first torch
operation; :func:`apply_portable_mode` sets them, and :func:`conflicts` says when it came too late.

What stays the config's: the intra-op thread count changes bits on its own (the training rules run
one thread; the analysis limits BLAS to one thread where it fits).

What it cannot cover: GPUs (cuBLAS / cuDNN choose kernels per device model), other architectures
(ARM, POWER: other libraries, other kernels), other versions of torch, MKL, oneDNN or OpenBLAS (the
lock file fixes them), and, for ``avx2``, CPUs without AVX2 (refused with the fix).

Switch: ``TRAINMAP_PORTABLE`` in the environment Snakemake (or a cluster job) starts from:
``baseline`` (default; ``1`` means it too), ``avx2``, or ``0`` (each library takes the fastest path of
the CPU it runs on, and the numbers are that CPU's).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import warnings
from collections.abc import MutableMapping
from pathlib import Path

#: The switch: a level of :data:`LEVELS` (``baseline``, the default, or ``avx2``), or ``0``.
SWITCH_ENV = "TRAINMAP_PORTABLE"
DEFAULT_LEVEL = "baseline"
#: Each level's environment; every library reads its variable at its first use.
LEVELS: dict[str, dict[str, str]] = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    },
    "baseline": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "DNNL_MAX_CPU_ISA": "SSE41",
        "OPENBLAS_CORETYPE": "Nehalem",
        "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    },
}
#: The default level's environment.
PORTABLE_ENV = LEVELS[DEFAULT_LEVEL]
#: What ``torch.backends.cpu.get_cpu_capability()`` reports under each level.
CPU_CAPABILITY = {"avx2": "AVX2", "baseline": "DEFAULT"}
_ON = {"1", "on", "true", "yes"}
_OFF = {"0", "off", "false", "no"}


def portable_level(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The level ``$TRAINMAP_PORTABLE`` asks for (unset: :data:`DEFAULT_LEVEL`), None when off; a
    value that is neither is refused with the choices."""
    value = environ.get(SWITCH_ENV, DEFAULT_LEVEL).strip().lower()
    if value in _OFF:
        return None
    if value in _ON:
        return DEFAULT_LEVEL
    if value not in LEVELS:
        raise ValueError(f"{SWITCH_ENV}={value!r}: choose one of {', '.join(LEVELS)} or 0 (off)")
    return value


def portable_enabled(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether portable mode is on (``$TRAINMAP_PORTABLE`` unset, a level, or 1/on/true/yes)."""
    return portable_level(environ) is not None


def _level_of(enabled: bool | str) -> str | None:
    if enabled is True:
        return DEFAULT_LEVEL
    return enabled or None


def portable_environment(enabled: bool | str) -> dict[str, str]:
    """The variables to set for a level (``True``: the default level) or for off (``False``)."""
    level = _level_of(enabled)
    return {**LEVELS[level], SWITCH_ENV: level} if level else {SWITCH_ENV: "0"}


def cpu_problem(level: str) -> str | None:
    """Why this CPU cannot take ``level`` (Linux: from /proc/cpuinfo's flags), None when it can."""
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        return (f"portable mode pins x86-64 code paths, and this is a {platform.machine()} CPU: "
                f"set {SWITCH_ENV}=0 (its numbers are then this CPU's)")  # fmt: skip
    if level != "avx2":
        return None
    flags = cpu_model_and_flags()[1]
    if flags is None:
        return None  # not Linux: the libraries fall back to this CPU's best path
    if not {"avx2", "fma"} <= set(flags):
        return (f"portable mode {level!r} runs AVX2 kernels, and this CPU has no AVX2/FMA: set "
                f"{SWITCH_ENV}=baseline (any x86-64 CPU, the default) or {SWITCH_ENV}=0")  # fmt: skip
    return None


def switch_problem(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Why ``$TRAINMAP_PORTABLE`` cannot hold in this environment, as a message that leads with the
    variable and gives the fix: a value that is no level, or a level this CPU cannot run
    (:func:`cpu_problem`); None when it can (or when it is off)."""
    shown = f"environment variable {SWITCH_ENV}={environ.get(SWITCH_ENV, DEFAULT_LEVEL)!r}"
    try:
        level = portable_level(environ)
    except ValueError:
        return (f"{shown}: not a portable level; choose {' or '.join(LEVELS)} (the default, "
                f"{DEFAULT_LEVEL!r}, when unset) or 0 (off: this CPU's fastest paths)")  # fmt: skip
    problem = cpu_problem(level) if level else None
    return f"{shown}: {problem}" if problem else None


def conflicts(
    environ: MutableMapping[str, str] = os.environ, level: str | None = None
) -> list[str]:
    """Why this process may not compute with ``level``'s code paths (None: the one ``environ``
    asks for): a pinned variable that differs in ``environ``, or ATen already dispatching with
    another CPU capability (torch ran before the pin was set). Empty when the pin holds, as far as
    can be seen from Python (MKL and oneDNN cannot be asked which path they took)."""
    level = level or portable_level(environ) or DEFAULT_LEVEL
    found = [f"{name}={environ.get(name)!r}, not {value!r}"
             for name, value in LEVELS[level].items() if environ.get(name) != value]  # fmt: skip
    torch = sys.modules.get("torch")
    if torch is not None:
        capability = torch.backends.cpu.get_cpu_capability()  # read once per process, then fixed
        if capability != CPU_CAPABILITY[level]:
            found.append(f"torch already runs with CPU capability {capability}, not "
                         f"{CPU_CAPABILITY[level]}: portable mode was set after torch's first "
                         "operation")  # fmt: skip
    return found


def apply_portable_mode(
    enabled: bool | str | None = None,
    environ: MutableMapping[str, str] = os.environ,
    *,
    strict: bool = False,
) -> list[str]:
    """Set a level's variables in ``environ`` (``enabled`` None: as ``$TRAINMAP_PORTABLE`` says;
    True: the default level; a level's name; False: off). Call it before the process imports
    numpy and runs its first torch operation. Returns :func:`conflicts` (empty when off) after a
    warning naming them, or raises ``RuntimeError`` with them when ``strict``; a CPU the level
    cannot run on is refused the same way."""
    level = portable_level(environ) if enabled is None else _level_of(enabled)
    problem = cpu_problem(level) if level else None
    if problem:
        if strict:
            raise RuntimeError(problem)
        warnings.warn(problem, stacklevel=2)
        level = None
    environ.update(portable_environment(level or False))
    found = conflicts(environ, level) if level else []
    if found:
        message = f"trainmap portable mode {level!r} does not hold: " + "; ".join(found)
        if strict:
            raise RuntimeError(message)
        warnings.warn(message, stacklevel=2)
    return found


# --- what a run's bits were made with -------------------------------------------------------------

#: The /proc/cpuinfo flags that decide a kernel's code path (SIMD extensions and their siblings).
_KERNEL_FLAGS = ("sse", "ssse", "avx", "fma", "f16c", "amx", "bmi", "vnni", "vpclmul", "gfni",
                 "vaes", "sha_ni", "adx")  # fmt: skip


@functools.cache
def _first_processor() -> dict[str, str] | None:
    """The first processor's /proc/cpuinfo entries up to its flags (None where there is none);
    read once a process (the vendor, model and flags of one record all come from it)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    found: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        found.setdefault(key.strip(), value.strip())
        if key.strip() == "flags":
            break
    return found


def cpu_vendor() -> str | None:
    """The first processor's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``): MKL picks its
    kernels by it. None where there is no /proc/cpuinfo."""
    return (_first_processor() or {}).get("vendor_id")


def cpu_model_and_flags() -> tuple[str, list[str] | None]:
    """This CPU's model name and the /proc/cpuinfo flags that decide a kernel's code path (sorted;
    None where there is no /proc/cpuinfo, and the platform's name for the model)."""
    name, flags = platform.processor() or platform.machine(), None
    found = _first_processor()
    if found is None:
        return name, None
    if "flags" in found:
        flags = sorted(f for f in found["flags"].split() if f.startswith(_KERNEL_FLAGS))
    return found.get("model name", name), flags


def cpu_caches() -> dict[str, str]:
    """The first CPU's caches as Linux lists them (``L1d``, ``L2``, ...: size, e.g. ``1024K``);
    oneDNN sizes some of its blocks by the per-core L2. Empty where /sys does not say."""
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip()
                                 for name in ("level", "type", "size"))  # fmt: skip
        except OSError:
            continue
        if kind != "Instruction":
            caches[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return caches


def numeric_environment(environ: MutableMapping[str, str] = os.environ) -> dict[str, object]:
    """What decides a run's bits besides its seed and config: the CPU (model, vendor,
    kernel-relevant flags, cache sizes), the portable level and its pins as set in ``environ``,
    and the versions and chosen code paths of the C library (its libm computes ATen's portable
    exp, log and pow), Python, torch (its ATen CPU capability, MKL, oneDNN), numpy and its
    OpenBLAS (version and the core type it dispatched to). JSON-ready; published beside a
    study's digest (trainmap.digest) so that a mismatch can say what differs between the two
    machines."""
    import re

    import numpy as np
    import torch
    from threadpoolctl import threadpool_info

    name, flags = cpu_model_and_flags()
    try:
        level = portable_level(environ)
    except ValueError as error:
        level = f"invalid ({error})"
    config = torch.__config__.show()

    def found(pattern: str) -> str | None:
        match = re.search(pattern, config)
        return match.group(1) if match else None

    blas = [pool for pool in threadpool_info() if pool.get("user_api") == "blas"]
    return {
        "cpu": name,
        "cpu_vendor": cpu_vendor(),
        "cpu_flags": flags or [],
        "cpu_caches": cpu_caches(),
        "libc": " ".join(platform.libc_ver()).strip() or None,
        "machine": platform.machine(),
        "portable": level or "0",
        "pins": {key: environ[key] for key in sorted(LEVELS[DEFAULT_LEVEL]) if key in environ},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": found(r"Math Kernel Library Version ([^\s]+)"),
        "onednn": found(r"MKL-DNN v([^\s]+)"),
        "numpy": np.__version__,
        "blas": [
            f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('architecture')})"
            for pool in blas
        ],  # fmt: skip
    }


def environment_differences(published: dict, here: dict) -> list[str]:
    """Each entry of two :func:`numeric_environment` records that differs, as ``key: here vs
    published`` (flags: the ones only here with +, only there with -); empty when the same. A
    key the published record lacks (written before trainmap recorded it) says nothing."""
    differences = []
    for key in sorted(set(published) | set(here)):
        mine, theirs = here.get(key), published.get(key)
        if mine == theirs or key not in published:
            continue
        if key == "cpu_flags" and isinstance(mine, list) and isinstance(theirs, list):
            more = [f"+{f}" for f in sorted(set(mine) - set(theirs))]
            fewer = [f"-{f}" for f in sorted(set(theirs) - set(mine))]
            differences.append(f"cpu_flags here {' '.join(more + fewer)}")
        else:
            differences.append(f"{key}: {mine!r} here, {theirs!r} published")
    return differences
