"""Plugins: a config's ``plugins`` register architectures, data kinds and methods before
the config is checked, as strictly as built-ins; a bad plugin is refused before any job."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, copy_workflow, snakemake

from trainmap import data, methods, models, plugins
from trainmap.grid import ConfigError, load_config
from trainmap.methods import MethodSpec, kaiming_init

TINY_NET = """
from torch import nn

from trainmap.models.registry import ArchSpec, check_positive, register_architecture


def build_tiny_net(meta, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(meta["input_shape"][0], width), nn.ReLU(),
                         nn.Linear(width, meta["num_classes"]))


register_architecture(ArchSpec(
    name="tiny_net", builder=build_tiny_net, defaults={"width": 8},
    input_kinds=frozenset({"vector"}), description="a plugin's one-hidden-layer net",
    check_options=lambda options: check_positive("width", options["width"]),
))
"""

GRID = """
plugins: [{plugin}]
dvc: {{configfile: grid.yaml}}
grid:
  - {{task: sparse_parity, archs: [tiny_net], methods: [kaiming], seeds: [0, 1]}}
model:
  sparse_parity:
    tiny_net: {{width: {width}}}
analysis: {{joint: []}}
"""


@pytest.fixture(autouse=True)
def fresh_registries():
    """Each test's plugins registered into the registries, removed again afterwards (in place:
    ``trainmap.models`` and ``trainmap.grid`` hold the same registries)."""
    registries = (models.ARCHITECTURES, methods.METHODS, data.DATA_KINDS)
    saved = [set(registry_) for registry_ in registries]
    modules = set(sys.modules)
    exported = os.environ.get(plugins.PLUGINS_ENV)
    yield
    for registry_, before in zip(registries, saved, strict=True):
        for name in set(registry_) - before:
            registry_.unregister(name)
    for name in set(sys.modules) - modules:
        if name.startswith("trainmap_plugin_") or name.startswith("lab_"):
            del sys.modules[name]
    os.environ.pop(plugins.PLUGINS_ENV, None)
    if exported is not None:
        os.environ[plugins.PLUGINS_ENV] = exported


def project(tmp_path: Path, plugin_source: str = TINY_NET, width: object = 16,
            plugin: str = "plugins/tiny_net.py") -> Path:  # fmt: skip
    """A project directory with ``plugins/tiny_net.py`` and ``grid.yaml`` running it."""
    (tmp_path / "plugins").mkdir(parents=True, exist_ok=True)
    (tmp_path / "plugins" / "tiny_net.py").write_text(plugin_source)
    (tmp_path / "grid.yaml").write_text(GRID.format(plugin=plugin, width=width))
    return tmp_path


def load(project_dir: Path) -> dict:
    return load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml",
                       project_dir / "grid.yaml", check_paths_from=project_dir)  # fmt: skip


def first_line(error: pytest.ExceptionInfo) -> str:
    return str(error.value).splitlines()[0]


def test_plugin_architecture_is_accepted_and_its_options_checked(tmp_path: Path) -> None:
    config = load(project(tmp_path))
    assert config["plugins"] == ["plugins/tiny_net.py"]
    assert "tiny_net" in models.ARCHITECTURES
    model = models.build_model("tiny_net", data.model_meta("sparse_parity", {"n_bits": 40}),
                               **config["model"]["sparse_parity"]["tiny_net"])  # fmt: skip
    assert model[1].out_features == 16
    # The plugin's declared option is type-checked like a built-in's, and unknown ones refused.
    with pytest.raises(ConfigError) as bad_value:
        load(project(tmp_path, width="'wide'"))
    assert first_line(bad_value).startswith("config key model.sparse_parity.tiny_net:")
    assert "'wide' is not a positive int" in first_line(bad_value)


def test_plugin_unknown_option_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "grid.yaml").write_text((root / "grid.yaml").read_text().replace("width:", "widht:"))
    with pytest.raises(ConfigError) as error:
        load(root)
    assert first_line(error).startswith("config key model.sparse_parity.tiny_net:")
    assert "did you mean 'width'" in first_line(error)


def test_name_collision_names_both_modules(tmp_path: Path) -> None:
    root = project(tmp_path, TINY_NET.replace('name="tiny_net"', 'name="mlp"'))
    with pytest.raises(ConfigError) as error:
        load(root)
    line = first_line(error)
    assert line.startswith("config key plugins[0]: plugin 'plugins/tiny_net.py' failed to import")
    assert "already registered by trainmap.models.mlp" in line
    assert "trainmap_plugin_plugins_tiny_net" in line


def test_the_three_registries_refuse_a_second_registration_with_one_message() -> None:
    """Architectures, methods and data kinds: a name registered again is refused with the same
    message, naming the module that registered it and the one that registers it again."""
    mlp = models.ARCHITECTURES["mlp"]
    again = [
        ("architecture", "mlp", "trainmap.models.mlp", lambda: models.register_architecture(mlp)),
        ("method", "kaiming", "trainmap.methods",
         lambda: methods.register_method(MethodSpec("kaiming", "again", kaiming_init))),
        ("data kind", "digits", "trainmap.data.packaged",
         lambda: data.register_data_kind("digits", data.make_digits, "image", lambda o: {})),
    ]  # fmt: skip
    for what, name, source, register in again:
        with pytest.raises(ValueError) as error:
            register()
        assert str(error.value) == (
            f"{what} {name!r} is already registered by {source}; {__name__} registers it again "
            "(rename one of them)"
        )
    assert (models.ARCHITECTURES["mlp"], data.DATA_KINDS["digits"].make) == (mlp, data.make_digits)


def test_plugin_data_kind_is_checked_like_a_built_in(tmp_path: Path) -> None:
    def make_ones(n: int = 4, seed: int = 0) -> data.TaskData:
        raise NotImplementedError

    data.register_data_kind("ones", make_ones, "vector",
                            lambda o: {"input_shape": [o["n"]], "num_classes": 2})  # fmt: skip
    assert data.model_meta("ones", {"n": 3}) == {
        "kind": "ones", "input_kind": "vector", "input_shape": [3], "num_classes": 2,
    }  # fmt: skip
    with pytest.raises(ValueError, match="unknown input kind 'pixels'"):
        data.register_data_kind("ones2", make_ones, "pixels", lambda o: {})
    with pytest.raises(ValueError, match="declares file checks but reads no files"):
        data.register_data_kind("ones3", make_ones, "vector", lambda o: {}, missing_files=list)
    with pytest.raises(ValueError, match="reads a directory, but its function takes no 'path'"):
        data.register_data_kind("ones4", make_ones, "vector", lambda o: {}, reads="directory")
    assert "ones2" not in data.DATA_KINDS and "ones3" not in data.DATA_KINDS


# --- a plugin's reader kind: its declared file checks run before any job, as a built-in's ---------

LINES_KIND = """
from trainmap.data import register_data_kind

NEEDED = ("train.txt", "test.txt")


def read_lines(path, seed=0):
    raise NotImplementedError("the config check never builds the data")


def missing_lines_files(directory):
    return [name for name in NEEDED if not (directory / name).is_file()]


def damaged_lines_files(directory):
    return [(str(directory / name), "is empty (0 bytes)") for name in NEEDED
            if (directory / name).is_file() and (directory / name).stat().st_size == 0]


register_data_kind("lines", read_lines, "vector",
                   lambda options: {"input_shape": [4], "num_classes": 2}, reads="directory",
                   missing_files=missing_lines_files, damaged_files=damaged_lines_files)
"""


def lines_project(tmp_path: Path) -> Path:
    """A project whose plugin registers the reader kind ``lines`` and whose grid trains on the
    directory ``data/lines`` (its model, train and evaluate settings: sparse_parity's)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "lines.py").write_text(LINES_KIND)
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    settings = {
        "plugins": ["plugins/lines.py"],
        "dvc": {"configfile": "grid.yaml"},
        "grid": [{"task": "lines", "archs": ["mlp"], "methods": ["kaiming"], "seeds": [0]}],
        "data": {"lines": {"kind": "lines", "path": "data/lines"}},
        "analysis": {"joint": []},
        **{key: {"lines": params[key]["sparse_parity"]} for key in ("model", "train", "evaluate")},
    }
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(settings))
    return tmp_path


def test_a_plugin_reader_kind_gets_its_file_checks_before_any_job(tmp_path: Path) -> None:
    root = lines_project(tmp_path)
    with pytest.raises(ConfigError) as absent:
        load(root)
    assert first_line(absent).startswith(
        "config key data.lines.path: directory 'data/lines' does not exist"
    ), first_line(absent)
    directory = root / "data" / "lines"
    directory.mkdir(parents=True)
    (directory / "train.txt").write_text("0 1 0 1\n")
    with pytest.raises(ConfigError) as missing:
        load(root)
    assert first_line(missing) == (
        f"config key data.lines.path: directory 'data/lines' lacks the lines file(s) test.txt "
        f"(looked in {directory}); put the standard lines files there or fix the path"
    )
    (directory / "test.txt").write_bytes(b"")
    with pytest.raises(ConfigError) as damaged:
        load(root)
    assert first_line(damaged).startswith(
        f"config key data.lines.path: task 'lines' reads damaged lines file(s): "
        f"{directory / 'test.txt'} is empty (0 bytes). Replace each with the standard file"
    ), first_line(damaged)
    (directory / "test.txt").write_text("1 1 0 0\n")
    assert load(root)["data"]["lines"]["kind"] == "lines"  # the healthy directory passes


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ("plugins/absent.py", "plugin file 'plugins/absent.py' does not exist"),
        ("../absent.py", "plugin file '../absent.py' does not exist"),
        ("/etc/passwd.py", "plugin file '/etc/passwd.py' does not exist"),
        ("lab_no_such_module", "plugin 'lab_no_such_module' failed to import: ModuleNotFound"),
        ("not a module", "'not a module' is neither a module name nor a .py file"),
    ],
)
def test_bad_plugin_is_refused(tmp_path: Path, plugin: str, message: str) -> None:
    root = project(tmp_path / "project", plugin=plugin)
    (tmp_path / "outside.py").write_text(TINY_NET)
    with pytest.raises(ConfigError) as error:
        load(root)
    assert first_line(error).startswith(f"config key plugins[0]: {message}")
    assert "tiny_net" not in models.ARCHITECTURES


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_listed_plugin_file_outside_the_project_is_loaded(tmp_path: Path, where: str) -> None:
    """A lab's shared plugin outside the project, listed by a path relative to the project or an
    absolute one, loads as one inside it does, and is an input of the rules that build models."""
    shared = tmp_path / "lab" / "tiny_net.py"
    shared.parent.mkdir()
    shared.write_text(TINY_NET)
    listed = "../lab/tiny_net.py" if where == "relative" else str(shared)
    root = project(tmp_path / "project", plugin=listed)
    (root / "plugins" / "tiny_net.py").unlink()  # only the shared one exists
    config = load(root)
    assert "tiny_net" in models.ARCHITECTURES and config["plugins"] == [listed]
    assert plugins.plugin_sources(config["plugins"], root) == [str(shared.resolve())]


def test_plugin_raising_on_import_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path, "raise RuntimeError('no GPU driver here')\n")
    with pytest.raises(ConfigError) as error:
        load(root)
    assert first_line(error) == (
        "config key plugins[0]: plugin 'plugins/tiny_net.py' failed to import: "
        "RuntimeError: no GPU driver here"
    )
    # A fixed plugin loads on the next try (the failed module was not kept).
    (root / "plugins" / "tiny_net.py").write_text(TINY_NET)
    load(root)


EXIT_FIX = (
    "a plugin module must not call sys.exit (or exit/quit): remove the call, or put the "
    'module\'s script part under `if __name__ == "__main__":`'
)


@pytest.mark.parametrize(
    ("call", "status"),
    [("sys.exit(0)", "(status 0)"), ("sys.exit(3)", "(status 3)"), ("sys.exit()", "(status 0)"),
     ("sys.exit('no GPU')", "(status 1) with the message 'no GPU'")],
)  # fmt: skip
def test_plugin_exiting_at_import_is_refused(tmp_path: Path, call: str, status: str) -> None:
    """SystemExit is no Exception: without its own handler the check would end with the plugin's
    status (0: a silent success that checked nothing)."""
    root = project(tmp_path, f"import sys\n{call}\n")
    with pytest.raises(ConfigError) as error:
        load(root)
    assert first_line(error) == (
        f"config key plugins[0]: plugin 'plugins/tiny_net.py' exited at import {status}; {EXIT_FIX}"
    )
    assert not [name for name in sys.modules if name.startswith("trainmap_plugin_")]


def test_installed_plugin_exiting_at_import_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "lab_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = importlib.metadata.EntryPoint("exits", "lab_exits", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [entry_point])
    with pytest.raises(ConfigError) as error:
        plugins.load_plugins([], tmp_path)
    assert first_line(error) == (
        "config key plugins: installed plugin exits = lab_exits (entry point group "
        f"trainmap.plugins) exited at import (status 3); {EXIT_FIX}"
    )


def test_a_keyboard_interrupt_in_a_plugin_still_stops_the_check(tmp_path: Path) -> None:
    root = project(tmp_path, "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load(root)
    assert not [name for name in sys.modules if name.startswith("trainmap_plugin_")]


def test_one_plugin_file_listed_by_two_spellings_loads_once(tmp_path: Path) -> None:
    """``plugins/tiny_net.py``, ``plugins/../plugins/tiny_net.py`` and its absolute path are one
    file: imported once (one module), so its names register once and the check passes."""
    absolute = str((tmp_path / "plugins" / "tiny_net.py").resolve())
    spellings = ["plugins/tiny_net.py", "plugins/../plugins/tiny_net.py", absolute]
    root = project(tmp_path, plugin=", ".join(spellings))
    config = load(root)
    assert config["plugins"] == spellings and "tiny_net" in models.ARCHITECTURES
    loaded = plugins.load_plugins(spellings, root)
    assert len(set(loaded)) == 1 and re.fullmatch(PLUGIN_MODULE, loaded[0]), loaded
    assert plugins.plugin_sources(spellings, root) == [absolute]


def test_plugins_key_must_be_a_list_of_strings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config key plugins: 'plugins/x.py' is not a list"):
        plugins.load_plugins("plugins/x.py", tmp_path)
    with pytest.raises(ConfigError, match=r"^config key plugins\[1\]: 3 is not a module name"):
        plugins.load_plugins(["json", 3], tmp_path)


def test_jobs_load_the_exported_plugins(tmp_path: Path) -> None:
    root = project(tmp_path)
    plugins.load_plugins(["plugins/tiny_net.py"], root)
    models.ARCHITECTURES.unregister("tiny_net")
    for name in [name for name in sys.modules if name.startswith("trainmap_plugin_")]:
        del sys.modules[name]  # as in a fresh job process
    assert plugins.load_exported_plugins()[-1].startswith("trainmap_plugin_plugins_tiny_net")
    assert "tiny_net" in models.ARCHITECTURES


def test_installed_entry_point_plugins_load_first(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "lab_tiny_net.py").write_text(TINY_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_point = importlib.metadata.EntryPoint("tiny", "lab_tiny_net", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [entry_point] if group == plugins.ENTRY_POINT_GROUP else [])  # fmt: skip
    assert plugins.load_plugins([], tmp_path) == ["lab_tiny_net"]
    assert "tiny_net" in models.ARCHITECTURES
    # Installed once and listed in the config too: the second registration is refused.
    root = project(tmp_path / "project")
    with pytest.raises(ConfigError, match=r"^config key plugins\[0\]: .*'tiny_net' is already "
                                          r"registered by lab_tiny_net; trainmap_plugin_"):  # fmt: skip
        load(root)


def test_failing_entry_point_plugin_is_refused(monkeypatch) -> None:
    entry_point = importlib.metadata.EntryPoint("gone", "lab_gone", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [entry_point])
    with pytest.raises(ConfigError, match=r"^config key plugins: installed plugin gone = lab_gone "
                                          r"\(entry point group trainmap.plugins\) failed to import: "
                                          "ModuleNotFoundError"):  # fmt: skip
        plugins.load_plugins([], ".")


@pytest.mark.integration
def test_dry_run_with_a_plugin_architecture(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "workflow")
    project(workdir)
    result = snakemake("-n", "--cores", "1", "--configfile", "grid.yaml", cwd=workdir,
                       MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", timeout=120)  # fmt: skip
    assert "results/train/sparse_parity/tiny_net/kaiming/" in result.stdout
    # Refused before any job: a plugin that fails to import.
    (workdir / "plugins" / "tiny_net.py").write_text("import no_such_module_here\n")
    failed = snakemake("-n", "--cores", "1", "--configfile", "grid.yaml", cwd=workdir,
                       check=False, timeout=120)  # fmt: skip
    assert failed.returncode != 0
    assert "config key plugins[0]: plugin 'plugins/tiny_net.py' failed to import: " \
           "ModuleNotFoundError" in failed.stderr + failed.stdout  # fmt: skip


# --- a plugin builder that fails, or options of the wrong type: refused by the config check -------

BUILDER = """
from torch import nn

from trainmap.models.registry import ArchSpec, register_architecture


def build(meta, width=8, bias=True, scale=1.0, hidden=[8], note=None):
    {body}


register_architecture(ArchSpec(
    name="tiny_net", builder=build,
    defaults={{"width": 8, "bias": True, "scale": 1.0, "hidden": [8], "note": None}},
    input_kinds=frozenset({{"vector"}}), description="a plugin's builder under test",
))
"""
BUILDS = 'return nn.Linear(meta["input_shape"][0], meta["num_classes"], bias=bias)'


def builder_project(tmp_path: Path, body: str = BUILDS, options: str = "{}") -> Path:
    """A project whose plugin builder runs ``body``, with ``model.sparse_parity.tiny_net:
    options`` (YAML)."""
    root = project(tmp_path, BUILDER.format(body=body))
    grid = (root / "grid.yaml").read_text().replace("tiny_net: {width: 16}", f"tiny_net: {options}")
    (root / "grid.yaml").write_text(grid)
    return root


PLUGIN_MODULE = r"trainmap_plugin_plugins_tiny_net_[0-9a-f]{8}"


def test_plugin_builder_that_raises_is_refused(tmp_path: Path) -> None:
    root = builder_project(tmp_path, "raise RuntimeError('layer sizes do not fit\\nsecond line')")
    with pytest.raises(ConfigError) as error:
        load(root)
    assert re.fullmatch(
        rf"config key model.sparse_parity.tiny_net: architecture 'tiny_net' \(registered by "
        rf"{PLUGIN_MODULE}\) failed to build: RuntimeError: layer sizes do not fit; fix the "
        rf"builder in {PLUGIN_MODULE} or the options in model.sparse_parity.tiny_net \(built "
        r"for \{'kind': 'sparse_parity', 'input_kind': 'vector', 'input_shape': \[40\].*\}\)",
        first_line(error),
    ), first_line(error)


def test_plugin_builder_that_returns_no_module_is_refused(tmp_path: Path) -> None:
    root = builder_project(tmp_path, "return {'weight': None}")
    with pytest.raises(ConfigError) as error:
        load(root)
    assert re.fullmatch(
        rf"config key model.sparse_parity.tiny_net: architecture 'tiny_net' \(registered by "
        rf"{PLUGIN_MODULE}\) returned a dict, not a torch.nn.Module; its builder in "
        rf"{PLUGIN_MODULE} must return the model",
        first_line(error),
    ), first_line(error)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("{bias: 'no'}", "option 'bias': 'no' is of type str; expected true or false, as its "
                         "default True"),
        ("{bias: 1}", "option 'bias': 1 is of type int; expected true or false"),
        ("{width: 8.5}", "option 'width': 8.5 is of type float; expected an int, as its default 8"),
        ("{width: true}", "option 'width': True is of type bool; expected an int"),
        ("{scale: '2'}", "option 'scale': '2' is of type str; expected a number, as its default 1.0"),
        ("{hidden: 4}", "option 'hidden': 4 is of type int; expected a list, as its default [8]"),
    ],
)  # fmt: skip
def test_plugin_option_of_the_wrong_type_is_refused(tmp_path, options, message) -> None:
    with pytest.raises(ConfigError) as error:
        load(builder_project(tmp_path, options=options))
    assert first_line(error).startswith(
        f"config key model.sparse_parity.tiny_net: architecture 'tiny_net': {message}"
    ), first_line(error)


def test_plugin_options_of_the_default_types_are_accepted(tmp_path: Path) -> None:
    """An int where the default is a float, a list for a list, anything where it is None."""
    options = "{width: 4, bias: false, scale: 2, hidden: [4, 4], note: {any: thing}}"
    config = load(builder_project(tmp_path, options=options))
    assert config["model"]["sparse_parity"]["tiny_net"]["scale"] == 2
