"""The package's import graph has no cycle and keeps the layering docs/architecture.md states:
every import between trainmap's modules, at module level or inside a function (a deferred import
hides a cycle or a layer crossed, it does not remove it), read from the source with ``ast``.
``if TYPE_CHECKING:`` imports are left out: they never run."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "trainmap"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The trainmap modules ``module`` imports (``from a import b`` counts module ``a.b`` when it
    is one, else ``a``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in known and name != module}


Graph = dict[str, set[str]]


def import_graph() -> Graph:
    """Module -> the trainmap modules it imports. A submodule that imports its own package (``from
    trainmap.models import x`` inside ``trainmap.models.repvgg``) while the package imports it is a
    cycle like any other: the package is half initialised when the submodule runs."""
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(path) for path in paths}
    graph: Graph = defaultdict(set)
    for path in paths:
        module = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] |= imported_modules(tree, module, path.name == "__init__.py", known)
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of ``graph`` (depth-first search), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_from_the_source() -> None:
    graph = import_graph()
    assert len(graph) > 30
    assert "trainmap.training.loop" in graph["trainmap.jobs.train"]


def test_a_cycle_is_found_when_there_is_one() -> None:
    """Positive control: the search finds a cycle, and none in a chain."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_import_cycle_in_trainmap() -> None:
    cycle = find_cycle(import_graph())
    if cycle:
        pytest.fail(f"an import cycle in src/trainmap: {' -> '.join(cycle)}")


#: The layers, lowest first (docs/architecture.md, "Layers"). A module belongs to the layer of the
#: longest prefix that names it; it may import its own layer and every layer below, never above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("trainmap", "trainmap.io", "trainmap.schema", "trainmap.errors",
                "trainmap.registry", "trainmap.portable", "trainmap.gpus", "trainmap.lineage",
                "trainmap.tracking", "trainmap.figures", "trainmap.plugins", "trainmap.faults",
                "trainmap.processes", "trainmap.stopping", "trainmap.locks")),
    ("data and models", ("trainmap.data", "trainmap.models", "trainmap.methods")),
    ("metrics", ("trainmap.dynamics", "trainmap.dynamics.metrics")),
    ("training", ("trainmap.training",)),
    ("methods", tuple(f"trainmap.methods.{name}" for name in
                      ("gradinit", "gradinit_report", "nm", "packing", "quantize", "sparse",
                       "sparse_layers"))),
    ("evaluation", ("trainmap.evaluation",)),
    ("runs", ("trainmap.dynamics.runs", "trainmap.recorder")),
    ("maps", ("trainmap.dynamics.maps",)),
    ("verdicts", ("trainmap.dynamics.verdicts",)),
    ("analysis", ("trainmap.dynamics.paper", "trainmap.dynamics.plots",
                  "trainmap.dynamics.pipeline", "trainmap.seed_groups", "trainmap.findings",
                  "trainmap.digest", "trainmap.records")),
    ("grid", ("trainmap.grid",)),
    ("commands", ("trainmap.jobs", "trainmap.plan", "trainmap.cli", "trainmap.worker",
                  "trainmap.unfinished", "trainmap.dynamics.__main__",
                  "trainmap.dynamics.map_command")),
)  # fmt: skip


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix that names ``module``."""
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            within = module.startswith(prefix + ".") and prefix != "trainmap"  # the package: itself
            if (module == prefix or within) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best < 0:
        raise LookupError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    return best


def upward_imports(graph: Graph) -> list[str]:
    """Every import of a module in a higher layer, as ``a (layer) -> b (layer)``."""
    found = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if layer_of(target) > layer_of(module):
                found.append(f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} "
                             f"({LAYERS[layer_of(target)][0]})")  # fmt: skip
    return found


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_a_layer_crossed_upward_is_found() -> None:
    """Positive control: an import from the ground floor into a command is reported, one the
    other way is not."""
    assert upward_imports({"trainmap.io": {"trainmap.jobs.train"}}) == [
        "trainmap.io (ground) -> trainmap.jobs.train (commands)"
    ]
    assert upward_imports({"trainmap.jobs.train": {"trainmap.io"}}) == []
    with pytest.raises(LookupError, match="trainmap.new_module"):
        layer_of("trainmap.new_module")
    assert (
        layer_of("trainmap.methods")
        < layer_of("trainmap.training")
        < layer_of("trainmap.methods.sparse")
    )


def test_no_import_crosses_a_layer_upward() -> None:
    crossed = upward_imports(import_graph())
    assert not crossed, "imports against the layering (docs/architecture.md, Layers):\n" + (
        "\n".join(crossed)
    )


def test_the_layers_are_the_ones_the_docs_state() -> None:
    """docs/architecture.md's Layers section names each layer, lowest first."""
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layers") :]
    positions = [section.find(f"**{name}**") for name, _ in LAYERS]
    assert -1 not in positions, [name for name, _ in LAYERS if f"**{name}**" not in section]
    assert positions == sorted(positions), "the docs list the layers in another order"


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_refits_worker_processes_import_no_heavy_library() -> None:
    """The bootstrap's and the stability curve's worker processes import
    ``trainmap.dynamics.verdicts.certainty`` and ``.stability`` to unpickle their refit function: without
    torch, matplotlib, scipy.stats or statsmodels (measured: 2.1 s of every worker's start with
    them, 0.3 s without). A module-level import of one of them anywhere on that path fails this."""
    import subprocess
    import sys

    heavy = ("torch", "matplotlib", "scipy.stats", "statsmodels", "mlflow")
    probe = ("import sys, trainmap.dynamics.verdicts.certainty, trainmap.dynamics.verdicts.stability; "
             f"print([m for m in {heavy!r} if m in sys.modules])")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "[]", f"imported by the refits' workers: {loaded}"
