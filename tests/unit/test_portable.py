"""Portable numbers: with the pin, every code path this CPU can be forced into gives the
same bits; without it, some give others (so the comparison can fail)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from trainmap.portable import (
    LEVELS,
    PORTABLE_ENV,
    SWITCH_ENV,
    apply_portable_mode,
    conflicts,
    cpu_problem,
    cpu_vendor,
    portable_enabled,
    portable_environment,
    portable_level,
    switch_problem,
)

# --- the module ------------------------------------------------------------------------------------


def test_the_portable_environment_pins_every_library_and_says_so():
    assert portable_environment(True) == {**PORTABLE_ENV, SWITCH_ENV: "baseline"}
    assert portable_environment("avx2") == {**LEVELS["avx2"], SWITCH_ENV: "avx2"}
    for level in LEVELS.values():  # every level pins the same libraries
        assert set(level) == {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                              "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES"}  # fmt: skip
    assert portable_environment(False) == {SWITCH_ENV: "0"}  # off leaves the libraries' own choice


def test_the_level_is_named_and_a_wrong_one_refused():
    assert portable_level({}) == "baseline" and portable_level({SWITCH_ENV: "avx2"}) == "avx2"
    with pytest.raises(ValueError, match="TRAINMAP_PORTABLE='avx512': choose one of"):
        portable_level({SWITCH_ENV: "avx512"})


def test_a_cpu_a_level_cannot_run_on_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert "TRAINMAP_PORTABLE=0" in cpu_problem("avx2")
    with pytest.raises(RuntimeError, match="aarch64"):
        apply_portable_mode(True, {}, strict=True)


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("1", True), ("on", True),
                                                ("0", False), ("off", False)])  # fmt: skip
def test_the_switch_is_on_unless_turned_off(value, enabled):
    assert portable_enabled({} if value is None else {SWITCH_ENV: value}) is enabled


def test_applying_overrides_what_the_environment_forced(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch("DEFAULT"))
    environ = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "PATH": "/bin"}
    assert conflicts(environ, "baseline")  # forced elsewhere: named
    assert apply_portable_mode("baseline", environ) == []
    assert environ == {"PATH": "/bin", **LEVELS["baseline"], SWITCH_ENV: "baseline"}
    environ = {"MKL_CBWR": "AVX2", SWITCH_ENV: "off"}
    assert apply_portable_mode(None, environ) == [] and environ == {"MKL_CBWR": "AVX2",
                                                                     SWITCH_ENV: "0"}  # fmt: skip


def test_torch_already_running_another_path_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch("AVX2"))
    with pytest.warns(UserWarning, match="CPU capability AVX2, not DEFAULT"):
        assert len(apply_portable_mode("baseline", {})) == 1
    with pytest.raises(RuntimeError, match="after torch's first operation"):
        apply_portable_mode("baseline", {}, strict=True)
    assert apply_portable_mode("avx2", {}) == []  # the capability the avx2 level asks for
    assert apply_portable_mode(False, {}, strict=True) == []  # off: nothing to hold


def fake_torch(capability: str) -> types.ModuleType:
    module = types.ModuleType("torch")
    cpu = types.SimpleNamespace(get_cpu_capability=lambda: capability)
    module.backends = types.SimpleNamespace(cpu=cpu)
    return module


# --- the libraries read the pins at their first use ------------------------------------------------

LIBRARIES_READ = """
import os, sys
import torch  # importing torch reads none of the pins
from trainmap.portable import apply_portable_mode
if sys.argv[1] == "late":
    torch.ones(3).sum()
found = apply_portable_mode(sys.argv[2])
torch.randn(64, 64) @ torch.randn(64, 64)
torch.nn.functional.conv2d(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))
print("capability", torch.backends.cpu.get_cpu_capability(), "conflicts", len(found))
"""


def libraries_read(when: str, level: str) -> str:
    environ = clean_environment() | {"MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}
    result = subprocess.run([sys.executable, "-c", LIBRARIES_READ, when, level], env=environ,
                            capture_output=True, text=True, check=True)  # fmt: skip
    return result.stdout + result.stderr


@pytest.mark.integration  # starts a program (a subprocess)
@pytest.mark.parametrize(("level", "capability", "mkl", "onednn"), [
    ("baseline", "DEFAULT", "CNR:COMPATIBLE", "isa:Intel SSE4.1"),
    ("avx2", "AVX2", "CNR:COMPATIBLE", "isa:Intel AVX2"),
])  # fmt: skip
def test_aten_mkl_and_onednn_take_the_pinned_paths_set_after_import(level, capability, mkl, onednn):
    if level == "avx2" and cpu_problem("avx2"):
        pytest.skip(cpu_problem("avx2"))
    output = libraries_read("early", level)
    assert f"capability {capability} conflicts 0" in output
    assert mkl in output  # MKL's verbose line of the SGEMM (an AMD CPU too)
    assert onednn in output  # oneDNN's ISA line


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_pin_set_after_torch_ran_is_reported():
    output = libraries_read("late", "baseline")
    assert "capability AVX2 conflicts 1" in output or "capability AVX512 conflicts 1" in output


# --- same bits on every code path ----------------------------------------------------------------

TRAIN = """
import sys
from pathlib import Path
from trainmap.portable import apply_portable_mode
apply_portable_mode(sys.argv[2] if sys.argv[2] != "0" else False)
import torch
from trainmap.data import make_task_data
from trainmap.training.loop import TrainConfig, TrainPaths, build_cell_model, train_block
torch.set_num_threads(1)  # the train rule's threads
out = Path(sys.argv[1])
blocks = [  # the default study's sparse parity MLP (with Adam: more ATen kernels) and digits RepVGG
    ("sparse_parity", {"n_bits": 40, "k": 3, "n_train": 128, "n_test": 64}, "mlp", {"hidden": [128]},
     {"optimizer": "adam", "lr": 1e-3, "batch_size": 32, "steps": 30, "checkpoint_every": 10}),
    ("digits", {}, "repvgg", {"widths": [4, 8, 8, 16]},
     {"lr": 0.05, "momentum": 0.9, "batch_size": 64, "steps": 4, "checkpoint_every": 2,
      "schedule": "cosine", "grad_clip": 1.0}),
]
for index, (task, data_options, arch, options, settings) in enumerate(blocks):
    data = make_task_data(task, data_options)
    models = [build_cell_model(arch, "kaiming", s, data.meta, options) for s in (0, 1)]
    cfg = TrainConfig.from_dict({**settings, "resume_every": 10**6})
    paths = [TrainPaths.in_directory(out / f"block{index}" / f"seed{s}") for s in (0, 1)]
    train_block(models, data, cfg, [0, 1], paths, resume_path=out / f"block{index}.resume.pt",
                progress=False, fingerprint="portable")
# The stages whose bits differed on an Intel Xeon: GradInit's scales and AWQ's search (a grid
# argmin over output errors).
from trainmap.methods.gradinit import run_gradinit
from trainmap.methods.quantize import awq_search, layer_inputs, quantizable_layers
data = make_task_data("sparse_parity", {"n_bits": 40, "k": 3, "n_train": 256, "n_test": 64})
model = build_cell_model("mlp", "gradinit", 0, data.meta, {"hidden": [128]})
result = run_gradinit(model, data, {"variant": "sgd", "eta": 0.1, "gamma": 1.0, "tau": 0.01,
                                    "iterations": 20, "batch_size": 32}, seed=0)
result.history.to_csv(out / "gradinit_history.csv")
(out / "gradinit_scales.txt").write_text(repr(result.scales))
names = quantizable_layers(model)
inputs = layer_inputs(model, names, data.x_train)
for name in names:
    module = model.get_submodule(name)
    scale, alpha, error = awq_search(module, module.weight, inputs[name], bits=4)
    (out / f"awq_{name}.txt").write_text(repr((scale.tolist(), alpha, error)))
"""

#: MKL picks its kernels by CPU vendor (``mkl_serv_intel_cpu_true``) and has paths for AMD's Zen
#: (``mkl_serv_cpuiszen``); both are exported from torch's library, so a preloaded stub makes MKL on
#: this CPU dispatch as on an Intel one (its verbose line then names Intel's AVX2 / AVX-512 branches).
MKL_AS_ON_INTEL = """
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_cpuiszen(void) { return 0; }
"""


def mkl_as_on_intel(directory: Path) -> dict[str, str]:
    """The environment that preloads :data:`MKL_AS_ON_INTEL`, compiled with the C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "this test compiles a 2-line C library: install a C compiler (gcc)"
    directory.mkdir(parents=True, exist_ok=True)
    source, library = directory / "mkl_as_on_intel.c", directory / "mkl_as_on_intel.so"
    source.write_text(MKL_AS_ON_INTEL)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return {"LD_PRELOAD": str(library)}


def code_paths(directory: Path) -> dict[str, dict[str, str]]:
    """Every code path this CPU can be forced into, one library at a time ({}: its own choice),
    and MKL dispatching as on an Intel CPU (the vendor check that no variable pins)."""
    paths = {"own choice": {}, "MKL as on Intel": mkl_as_on_intel(directory)}
    for capability in ("default", "avx2", "avx512"):
        paths[f"ATen {capability}"] = {"ATEN_CPU_CAPABILITY": capability}
    for branch in ("AUTO", "COMPATIBLE", "SSE4_2", "AVX", "AVX2", "AVX512"):
        paths[f"MKL {branch}"] = {"MKL_CBWR": branch}
    for isa in ("SSE41", "AVX", "AVX2", "AVX512_CORE"):
        paths[f"oneDNN {isa}"] = {"ONEDNN_MAX_CPU_ISA": isa}
    if not torch.cpu._is_avx512_supported():
        # ATen would run AVX-512 kernels anyway and die of an illegal instruction; MKL and oneDNN
        # fall back to this CPU's best path, which is already in the table.
        paths = {name: env for name, env in paths.items() if "512" not in name}
    return paths


def clean_environment() -> dict[str, str]:
    names = {*PORTABLE_ENV, SWITCH_ENV, "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS"}
    return {k: v for k, v in os.environ.items() if k not in names}


def train_digests(directory: Path, forced: dict[str, str], level: str) -> dict[str, str]:
    """Train the blocks under the ``forced`` code path with portable ``level`` ("0": off)."""
    environ = clean_environment() | forced
    subprocess.run([sys.executable, "-c", TRAIN, str(directory), level], env=environ,
                   check=True, capture_output=True)  # fmt: skip
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*"))
            if path.is_file() and ".timing." not in path.name}  # fmt: skip


@pytest.mark.integration
def test_every_code_path_gives_the_same_bits_with_the_pin_and_not_without(tmp_path):
    if cpu_problem("avx2"):
        pytest.skip(cpu_problem("avx2"))
    paths = code_paths(tmp_path / "library")
    # the CPU's own paths and the slowest, forced: each level must override both
    some = ("own choice", "ATen default", "MKL COMPATIBLE", "oneDNN SSE41", "ATen avx2",
            "oneDNN AVX2", "MKL as on Intel")  # fmt: skip
    runs = [(name, "avx2") for name in paths]
    runs += [(name, level) for name in some if name in paths for level in ("baseline", "0")]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        digests = dict(zip(runs, pool.map(
            lambda run: train_digests(tmp_path / f"{run[0]}-{run[1]}", paths[run[0]], run[1]),
            runs), strict=True))  # fmt: skip
    for level in ("avx2", "baseline"):
        pinned = {name: digest for (name, pin), digest in digests.items() if pin == level}
        reference = pinned["own choice"]
        assert len(reference) >= 2 * 2 * 4 + 2 + 2  # per seed per block; GradInit; AWQ per layer
        assert {name for name, digest in pinned.items() if digest != reference} == set(), level
    assert digests["own choice", "avx2"] != digests["own choice", "baseline"]
    unpinned = {name: digest for (name, pin), digest in digests.items() if pin == "0"}
    # Without the pin, forcing ATen's, MKL's or oneDNN's path changes the bits: the comparisons
    # above can fail.
    differing = ["ATen default", "MKL COMPATIBLE", "oneDNN SSE41"]
    if cpu_vendor() != "GenuineIntel":  # on an Intel CPU the stub changes nothing
        differing.append("MKL as on Intel")
    for name in differing:
        assert unpinned[name] != unpinned["own choice"], name


def test_a_switch_that_cannot_hold_is_refused_before_any_job_naming_the_variable(monkeypatch):
    from trainmap.grid import ConfigError, load_config
    from trainmap.grid.validate import main

    assert switch_problem({}) is None and switch_problem({SWITCH_ENV: "0"}) is None
    problem = switch_problem({SWITCH_ENV: "avx512"})
    assert problem.startswith("environment variable TRAINMAP_PORTABLE='avx512': not a portable")
    assert "avx2 or baseline" in problem and "or 0" in problem
    monkeypatch.setattr("platform.machine", lambda: "aarch64")  # the level cannot run here
    assert "aarch64" in switch_problem({}) and "TRAINMAP_PORTABLE=0" in switch_problem({})
    assert switch_problem({SWITCH_ENV: "0"}) is None  # off: this CPU's own paths
    # The config check (python -m trainmap.grid, and the Snakefile's parse) stops on it.
    monkeypatch.undo()
    monkeypatch.setenv(SWITCH_ENV, "avx512")
    monkeypatch.chdir(REPO_ROOT)
    assert main(["config/smoke.yaml"]) == 1
    with pytest.raises(ConfigError, match="TRAINMAP_PORTABLE='avx512'"):
        load_config("params.yaml", "config/config.yaml", "config/smoke.yaml")
