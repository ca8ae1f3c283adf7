"""Plugins: a user's architectures, data kinds and init methods, imported before the config is checked.

A plugin is a Python module that registers into the public registries at import time
(:func:`trainmap.models.register_architecture`, :func:`trainmap.data.register_data_kind`,
:func:`trainmap.methods.register_method`), exactly as the built-ins do, so the configuration check
treats its names and options as strictly as a built-in's. Two sources:

* the installed packages' entry points of group :data:`ENTRY_POINT_GROUP` (``trainmap.plugins``),
  each naming a module to import (``my_net = my_lab.trainmap_plugin``);
* the config key ``plugins``: importable module names (``my_lab.trainmap_plugin``) or Python files,
  relative to the project directory (``plugins/my_net.py``) or absolute
  (``/home/me/lab/my_net.py``, ``~/lab/my_net.py``).

They are loaded by every entry point before the config is validated: the Snakefile (at parse time,
so also in every cluster job, which re-parses it), ``python -m trainmap.grid``
(:func:`trainmap.grid.load_config`), the job server before it forks its jobs, and a job that runs in
its own process (both from :data:`PLUGINS_ENV`, which :func:`load_plugins` sets for the processes
Snakemake starts). A plugin is code: it runs with the workflow's rights, like a Snakefile.

**The trust rule.** A plugin runs when the workflow is parsed (a dry run too) and in every job, on
every node a job runs on, with the rights of whoever runs it; trainmap never finds plugins by
itself, it imports only what the config lists or an installed package declares. So list only code
you would run yourself; a file outside the project is as trusted as one inside it, and must be
readable at the same path wherever a job runs (a cluster's shared file system). Its source is an
input of the rules that build data and models (:func:`plugin_sources`), inside the project or not:
editing it reruns them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from trainmap.errors import ConfigError

ENTRY_POINT_GROUP = "trainmap.plugins"
#: ``{"names": [...], "base_dir": "..."}`` of the last :func:`load_plugins`, for job processes.
PLUGINS_ENV = "TRAINMAP_PLUGINS"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def load_plugins(names: object, base_dir: str | os.PathLike) -> list[str]:
    """Import the installed entry-point plugins, then each plugin ``names`` lists (the config key
    ``plugins``; files relative to ``base_dir``, the project directory); return the modules imported.

    Importing a plugin twice in one process is a no-op, and so is one file listed under another
    spelling (``plugins/../plugins/my_net.py``). Raises :class:`ConfigError` (first line
    ``config key plugins[i]: ...``) for a value that is not a module name or a ``.py`` file, a
    missing file, a plugin whose import fails (a registration under a name already taken
    included), naming the plugin and the exception, or one that exits at import (``sys.exit``:
    ``... exited at import (status N)``); a KeyboardInterrupt propagates. Records the list in
    :data:`PLUGINS_ENV` so that the jobs Snakemake starts load the same plugins.
    """
    names = _plugin_names(names)
    base = Path(base_dir).resolve()
    loaded = [_load_entry_point(entry_point) for entry_point in _entry_points()]
    for index, name in enumerate(names):
        loaded.append(_load_named(index, name, base))
    os.environ[PLUGINS_ENV] = json.dumps({"names": names, "base_dir": str(base)})
    return loaded


def load_exported_plugins() -> list[str]:
    """In a job process: load the plugins the workflow loaded (:data:`PLUGINS_ENV`), if any."""
    exported = os.environ.get(PLUGINS_ENV)
    if not exported:
        return []
    settings = json.loads(exported)
    return load_plugins(settings["names"], settings["base_dir"])


def plugin_sources(names: object, base_dir: str | os.PathLike) -> list[str]:
    """The source files of the plugins :func:`load_plugins` loads (installed entry points and the
    config key ``plugins``), for the workflow's rules that build models or data: editing a plugin
    reruns them, as editing trainmap's own code does. Call after :func:`load_plugins`."""
    base = Path(base_dir).resolve()
    sources = []
    modules = [entry_point.module for entry_point in _entry_points()]
    for name in _plugin_names(names):
        if _is_file_name(name):
            sources.append(str((base / Path(name).expanduser()).resolve()))
        else:
            modules.append(name)
    for module in modules:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            sources.append(spec.origin)
    return sorted(dict.fromkeys(sources))


def _is_file_name(name: str) -> bool:
    """Whether a ``plugins`` entry names a file (``plugins/my_net.py``), not a module."""
    return name.endswith(".py") or "/" in name or os.sep in name


def _plugin_names(names: object) -> list[str]:
    # Loaded before the schema check, so the key's type is checked here.
    if names is None:
        return []
    if not isinstance(names, list):
        raise ConfigError(
            f"config key plugins: {names!r} is not a list; allowed: a list of module names "
            "(my_lab.trainmap_plugin) or .py files (plugins/my_net.py, /abs/path/my_net.py)"
        )
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"config key plugins[{index}]: {name!r} is not a module name or a .py file; "
                "allowed: my_lab.trainmap_plugin, plugins/my_net.py"
            )
    return list(names)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def _load_entry_point(entry_point: importlib.metadata.EntryPoint) -> str:
    what = (f"installed plugin {entry_point.name} = {entry_point.value} "
            f"(entry point group {ENTRY_POINT_GROUP})")  # fmt: skip
    try:
        entry_point.load()
    except SystemExit as error:
        raise _exited_at_import("config key plugins", what, error) from error
    except Exception as error:  # noqa: BLE001 - any failure of user code is reported the same way
        raise ConfigError(
            f"config key plugins: {what} failed to import: {type(error).__name__}: {error}"
        ) from error
    return entry_point.module


def _exited_at_import(where: str, what: str, error: SystemExit) -> ConfigError:
    """The error for a plugin whose import raised :class:`SystemExit` (``sys.exit``, ``exit()``).

    SystemExit is not an :class:`Exception`, so without this the config check would end with the
    plugin's status (0 for ``sys.exit()``: a silent "success" that checked nothing). The status is
    the one the interpreter would exit with: 0 for None, the code for an int, 1 (the message
    printed) for anything else."""
    code = error.code
    if code is None or isinstance(code, int):
        status, said = code or 0, ""
    else:
        status, said = 1, f" with the message {str(code)!r}"
    return ConfigError(
        f"{where}: {what} exited at import (status {status}){said}; a plugin module must not call "
        "sys.exit (or exit/quit): remove the call, or put the module's script part under "
        '`if __name__ == "__main__":`'
    )


def _load_named(index: int, name: str, base: Path) -> str:
    where = f"config key plugins[{index}]"
    is_file = _is_file_name(name)
    if not is_file and not _MODULE_NAME.match(name):
        raise ConfigError(
            f"{where}: {name!r} is neither a module name nor a .py file; allowed: a dotted module "
            "name (my_lab.trainmap_plugin) or a .py file (plugins/my_net.py, /abs/path/my_net.py)"
        )
    try:
        if is_file:
            return _import_file(_plugin_path(where, name, base))
        importlib.import_module(name)
        return name
    except ConfigError:
        raise
    except SystemExit as error:  # KeyboardInterrupt and the like still propagate
        raise _exited_at_import(where, f"plugin {name!r}", error) from error
    except Exception as error:  # noqa: BLE001 - any failure of user code is reported the same way
        raise ConfigError(
            f"{where}: plugin {name!r} failed to import: {type(error).__name__}: {error}"
        ) from error


def _plugin_path(where: str, name: str, base: Path) -> Path:
    """A plugin file's path: relative to the project directory ``base``, or absolute (``~``
    expanded); inside the project or outside it (module docstring: the trust rule)."""
    path = (base / Path(name).expanduser()).resolve()
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(
            f"{where}: plugin file {name!r} does not exist (looked for {path}); allowed: a .py "
            "file, relative to the project or absolute"
        )
    return path


def _import_file(path: Path) -> str:
    """Import the plugin file at the resolved ``path`` once per process; return its module name.

    The module name is a function of the resolved path alone (its folder and file name, readable,
    e.g. ``trainmap_plugin_plugins_my_net_<hash>``; then a hash of the whole path, which keeps two
    projects' plugins/my_net.py apart), so every spelling of one file (``plugins/ok.py``,
    ``plugins/../plugins/ok.py``, its absolute path) names one module and imports it once, as
    :func:`plugin_sources` lists it once. The module is in :data:`sys.modules` before it runs, as
    dataclasses need."""
    stem = re.sub(r"\W", "_", f"{path.parent.name}_{path.stem}")
    module_name = f"trainmap_plugin_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if module_name in sys.modules:
        return module_name
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module_name
