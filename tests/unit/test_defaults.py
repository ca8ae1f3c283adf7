"""One declaration per default: each setting's default is the config schema's
(``workflow/schemas/config.schema.yaml``), and what repeats it is held to it here.

params.yaml is the named exception: it writes values out (DVC sets only keys that are written), so
every key it sets that has a schema default holds that default, or is listed below as a task's own
choice, with the reason. In the code, a literal default for a section's setting where that section
is received (a keyword parameter or class field named like the setting, ``.get("key", value)``,
a command-line option) is a second declaration: :func:`code_literal_defaults` finds them, and
every one left is allowed below with its reason. :class:`TrainingHMM`'s keyword defaults, the HMM
modules' ``DEFAULT_*`` constants, ``TrainConfig``'s fields and the options of ``python -m
trainmap.dynamics`` read the schema; these tests keep anyone from writing a literal back in.
config/config.yaml is the default study's own choices, not defaults: it is not held to the schema.
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

# At module level: the first import of torch (which trainmap.grid and the CLI's modules load)
# starts ldconfig, which a test outside the integration tier may not.
from trainmap import grid, schema
from trainmap.dynamics.__main__ import parse_args
from trainmap.dynamics.maps.hmm import (
    DEFAULT_FOLDS,
    DEFAULT_HALF_SIZE,
    DEFAULT_REPRODUCE_ARI,
    DEFAULT_REPRODUCE_SHARE,
    TrainingHMM,
)
from trainmap.dynamics.maps.settings import ANALYSIS_DEFAULTS
from trainmap.grid import seed_block
from trainmap.jobs.common import settings_hash
from trainmap.schema import check_section, config_schema, section_defaults, section_schema
from trainmap.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def each(prefix: str, keys: str, reason: str) -> dict[str, str]:
    """``{prefix.key: reason}`` for each of the space-separated ``keys``."""
    return {f"{prefix}.{key}": reason for key in keys.split()}


#: A task's own GradInit recipe: the schema's defaults are the paper's CIFAR-10 setting (SGD
#: variant, eta 0.1, gamma 1, batch 128, 390 iterations); each task sets the variant, eta and
#: gamma for its optimiser and the iterations and batch size for its data (params.yaml gradinit:).
GRADINIT_RECIPE = "the task's own GradInit recipe (params.yaml gradinit:)"
SEED_BLOCK = (
    "the block bench/seed_batch.py chose for the task's model on 2 CPU cores (params.yaml "
    "train:); a block never changes a run's result"
)
SEED_BLOCK_TASKS = ("sparse_parity", "digits", "mnist_5k", "mnist1d")
LARGE_MODEL_PROBE = (
    "a CIFAR network's CPU latency probe at half the batch and half the passes, so that the probe "
    "does not outweigh the rest of its evaluation job"
)
#: Keys params.yaml sets to another value than the schema's default, each with the reason. The
#: default is what a task that omits the key takes; these are per-task choices.
DELIBERATE: dict[str, str] = {
    **each("gradinit.sparse_parity", "iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.modular_addition", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.digits", "eta tau iterations", GRADINIT_RECIPE),
    **each("gradinit.mnist_5k", "eta tau iterations", GRADINIT_RECIPE),
    **each("gradinit.mnist1d", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.mnist", "variant eta gamma iterations batch_size", GRADINIT_RECIPE),
    **each("gradinit.cifar100", "gamma", GRADINIT_RECIPE),
    "sparse.sparse_parity.dense_layers": "the one-hidden-layer MLP has no middle layer to keep "
    "dense: both of its layers are made 2:4 sparse",
    "sparse.modular_addition.srste_lambda": "the transformer retrains with AdamW: the LLM value "
    "(1e-4 with Adam), not the SGD default (the schema's comment on srste_lambda)",
    **{f"train.{task}.seed_block": SEED_BLOCK for task in SEED_BLOCK_TASKS},
    **each("evaluate.cifar10", "latency_batch latency_repeats", LARGE_MODEL_PROBE),
    **each("evaluate.cifar100", "latency_batch latency_repeats", LARGE_MODEL_PROBE),
    **each("evaluate.cifar100_destabilised", "latency_batch latency_repeats", LARGE_MODEL_PROBE),
}
#: The hyperparameters a task chooses for its model and data: ``train.<task>`` and a stage's
#: retraining (``sparse.<task>.train``). Their schema defaults are what a retraining that leaves
#: one out takes, not a recommendation, so a task's recipe differs from them without a reason;
#: the other training settings (seed_block, device, precision, archive, ...) are held to the schema
#: as every other key is.
TRAINING_RECIPE = frozenset(
    "optimizer lr momentum betas weight_decay batch_size steps schedule warmup_steps grad_clip "
    "checkpoint_every resume_every".split()
)


def is_recipe(path: str) -> bool:
    """Whether config key ``path`` is a setting of a task's training recipe."""
    parts = path.split(".")
    recipe = (parts[0] == "train" and len(parts) == 3) or (
        parts[0] == "sparse" and len(parts) == 4 and parts[2] == "train"
    )
    return recipe and parts[-1] in TRAINING_RECIPE


def resolved(node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` followed (the referring node's own keys kept)."""
    node = dict(node)
    while "$ref" in node:
        target: Any = config_schema()
        for part in node.pop("$ref").removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **node}
    return node


def child(node: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of ``key`` inside ``node``: a declared property (an ``if``/``then`` branch's too,
    as a data kind's options), else ``additionalProperties`` (a section keyed by task); None where
    the schema says nothing of it (a model builder's options)."""
    properties = dict(node.get("properties", {}))
    for branch in node.get("allOf", []):
        properties.update(branch.get("then", {}).get("properties", {}))
    spec = properties.get(key, node.get("additionalProperties"))
    return resolved(spec) if isinstance(spec, Mapping) else None


def compare_with_defaults(value: Any, node: Mapping[str, Any] | None, path: str = "") -> tuple:
    """``(compared, differ)``: the key paths of ``value`` (a config) whose schema node has a
    default, and those among them whose value is not that default (path -> (value, default)).
    Mappings are entered key by key; a value equals a default only with the same type too
    (``1`` is not ``1.0``)."""
    compared: list[str] = []
    differ: dict[str, tuple[Any, Any]] = {}
    if node is None:
        return compared, differ
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = compare_with_defaults(item, child(node, key), f"{path}.{key}".lstrip("."))
            compared += inner[0]
            differ |= inner[1]
    elif "default" in node:
        compared.append(path)
        if (type(value), value) != (type(node["default"]), node["default"]):
            differ[path] = (value, node["default"])
    return compared, differ


def test_the_comparison_finds_a_value_that_is_not_the_default() -> None:
    """Positive control, on the smallest configs that show it."""
    schema = resolved(config_schema())
    assert compare_with_defaults({"analysis": {"k_max": 9}}, schema)[1] == {
        "analysis.k_max": (9, 8)
    }
    assert compare_with_defaults({"analysis": {"holdout": 1}}, schema)[1] == {
        "analysis.holdout": (1, 0.2)
    }
    assert compare_with_defaults({"train": {"any": {"seed_block": 1}}}, schema) == (
        ["train.any.seed_block"],
        {},
    )
    assert compare_with_defaults({"sparse": {"any": {"train": {"seed_block": 2}}}}, schema)[1]


def test_params_yaml_sets_each_key_to_the_schemas_default_or_says_why() -> None:
    """Every key params.yaml sets that has a schema default holds it, except the listed per-task
    choices; the list is exact, so a new difference, or a listed one that is gone, fails here."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    compared, differ = compare_with_defaults(params, resolved(config_schema()))
    assert len(compared) > 100, compared
    assert "train.sparse_parity.seed_block" in compared
    assert {path for path in compared if path.startswith("analysis.")} == {
        f"analysis.{key}" for key in section_defaults("analysis")
    }
    assert not is_recipe("train.sparse_parity.seed_block") and is_recipe("train.digits.lr")
    assert is_recipe("sparse.digits.train.steps") and not is_recipe("sparse.digits.n")
    unexplained = {path: differ[path] for path in sorted(set(differ) - set(DELIBERATE))
                   if not is_recipe(path)}  # fmt: skip
    assert not unexplained, f"params.yaml (value, schema default): {unexplained}"
    assert set(DELIBERATE) <= set(differ), sorted(set(DELIBERATE) - set(differ))


def test_training_hmm_keyword_defaults_are_the_schemas() -> None:
    """TrainingHMM() fits as the workflow does, its selection rule included: one rule everywhere
    (the schema, params.yaml, TrainingHMM, the CLI and the default study)."""
    assert ANALYSIS_DEFAULTS == section_defaults("analysis")
    hmm = {name: p.default for name, p in inspect.signature(TrainingHMM).parameters.items()}
    hmm["seed"] = hmm.pop("random_state")
    shared = set(hmm) & set(ANALYSIS_DEFAULTS)
    assert len(shared) == 22, sorted(shared)
    differ = {key: (hmm[key], ANALYSIS_DEFAULTS[key]) for key in shared
              if (type(hmm[key]), hmm[key]) != (type(ANALYSIS_DEFAULTS[key]), ANALYSIS_DEFAULTS[key])}  # fmt: skip
    assert differ == {}, differ
    # The rest have no schema default (params.yaml does not write them either).
    assert set(hmm) - shared == {"min_covar", "n_jobs", "features"}
    # The default study does not set a rule of its own, in analysis or in a comparison.
    study = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["analysis"]
    assert "selection" not in study
    assert all("selection" not in entry.get("analysis", {}) for entry in study["joint"])


def test_the_hmm_modules_default_constants_are_the_schemas() -> None:
    defaults = section_defaults("analysis")
    assert (DEFAULT_FOLDS, DEFAULT_HALF_SIZE, DEFAULT_REPRODUCE_ARI, DEFAULT_REPRODUCE_SHARE) == (
        defaults["folds"],
        defaults["half_size"],
        defaults["reproduce_ari"],
        defaults["reproduce_share"],
    )


def test_the_analysis_cli_defaults_are_the_schemas() -> None:
    """Every ``python -m trainmap.dynamics`` option named like an analysis setting defaults to the
    schema's value, and ``--convention`` to ``analysis.metrics``."""
    options = vars(parse_args(["runs", "--out", "out"]))
    shared = set(options) & set(ANALYSIS_DEFAULTS)
    assert len(shared) >= 12, sorted(shared)
    assert {key: options[key] for key in shared} == {key: ANALYSIS_DEFAULTS[key] for key in shared}
    assert options["convention"] == ANALYSIS_DEFAULTS["metrics"]


#: ``asdict(TrainConfig())`` as the dataclass wrote its defaults before they moved to the schema
#: (values and types): train.json, :func:`trainmap.grid.with_train_defaults` and a retraining that
#: leaves a key out read these.
TRAIN_CONFIG_DEFAULTS = (
    "{'optimizer': 'sgd', 'lr': 0.1, 'momentum': 0.0, 'betas': (0.9, 0.999), 'weight_decay': 0.0, "
    "'batch_size': 32, 'steps': 1000, 'schedule': 'constant', 'warmup_steps': 0, 'grad_clip': None, "
    "'checkpoint_every': 25, 'resume_every': 1000, 'device': 'cpu', 'archive': {'schedule': 'all', "
    "'dtype': 'float32'}, 'precision': 'fp32', 'deterministic': False, 'augment': None, "
    "'param_groups': 'single'}"
)


def test_training_defaults_are_the_schemas_and_serialise_as_before() -> None:
    """Every TrainConfig field (the archive's too) defaults to the schema's value, and those
    values are the ones the dataclass held, with their types."""
    defaults = section_defaults("train")
    config = asdict(TrainConfig())
    assert repr(config) == TRAIN_CONFIG_DEFAULTS
    assert config.pop("archive") == section_defaults("train", "archive")
    assert {**config, "betas": list(config["betas"])} == {
        key: value for key, value in defaults.items() if key != "seed_block"
    }
    # train.<task> requires a recipe's five settings; their defaults are for a stage's retraining.
    required = set(config_schema()["properties"]["train"]["additionalProperties"]["required"])
    assert required == {"optimizer", "lr", "batch_size", "steps", "checkpoint_every"}
    assert required <= set(defaults)
    check_section("train", defaults, what="train")
    check_section("evaluate", {"threshold": 0.9, **section_defaults("evaluate")}, what="evaluate")


def test_the_latency_probe_defaults_are_the_schemas() -> None:
    from trainmap.evaluation import EVALUATE_DEFAULTS, evaluate_form, evaluate_run, latency_probe

    assert EVALUATE_DEFAULTS == section_defaults("evaluate")
    assert latency_probe({"threshold": 0.9}) == (256, 20) == (
        EVALUATE_DEFAULTS["latency_batch"], EVALUATE_DEFAULTS["latency_repeats"])  # fmt: skip
    assert latency_probe({"latency_batch": 8, "latency_repeats": 3}) == (8, 3)
    for function in (evaluate_form, evaluate_run):
        keywords = inspect.signature(function).parameters
        assert {key: keywords[key].default for key in EVALUATE_DEFAULTS} == EVALUATE_DEFAULTS


# --- what a schema default must not change: the hashes and the params of the default study --------

#: The default study's (params.yaml + config/config.yaml) 192 cell hashes, and the per-task
#: settings its training, method-stage and evaluation rules are given (Snakemake params), hashed;
#: a schema default never enters either, so declaring one reruns no job. A deliberate change to
#: the default study's settings changes them: then update these.
DEFAULT_STUDY_CELL_HASHES = "29a5306a28b9"
DEFAULT_STUDY_RULE_PARAMS = "32e5e96ee512"


def study_hashes(config: dict) -> tuple[int, str, str]:
    """``(cells, hash of the cell hashes, hash of the per-task rule params)`` of ``config``."""
    cells = grid.expand_grid(config)
    hashes = {cell.id: grid.cell_hash(config, cell) for cell in cells}
    params = {task: {"train": grid.train_settings(config, task),
                     "evaluate": grid.evaluate_settings(config, task),
                     "gradinit": grid.stage_job_settings(config, "gradinit", task),
                     "sparse": grid.stage_job_settings(config, "sparse", task),
                     "device": grid.training_device(config, task)}
              for task in grid.grid_tasks(config)}  # fmt: skip
    return len(hashes), settings_hash(hashes), settings_hash(params)


def test_the_default_studys_hashes_and_params_are_unchanged(base_config: dict) -> None:
    assert study_hashes(base_config) == (192, DEFAULT_STUDY_CELL_HASHES, DEFAULT_STUDY_RULE_PARAMS)


def test_no_hash_or_rule_param_reads_a_schema_default(
    base_config: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every default taken out of the schema, the cell hashes and the rules' params are the
    same: they are made of what the config files write, never completed from the schema."""
    stated = study_hashes(base_config)

    def without_defaults(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: without_defaults(value) for key, value in node.items() if key != "default"}
        return [without_defaults(item) for item in node] if isinstance(node, list) else node

    stripped = without_defaults(json.loads(json.dumps(config_schema())))
    monkeypatch.setattr(schema, "config_schema", lambda: stripped)
    assert section_defaults("evaluate") == {}  # the schema the code reads has no default now
    assert study_hashes(base_config) == stated


def test_seed_block_takes_the_schemas_default_and_range() -> None:
    """A task without ``seed_block`` trains one seed per job, the schema's default; the schema
    allows what the block code takes, a whole number >= 1."""
    assert section_defaults("train")["seed_block"] == 1
    assert seed_block({"train": {"task": {}}}, "task") == 1
    assert seed_block({"train": {"task": {"seed_block": 8}}}, "task") == 8
    check_section("train", {"seed_block": 1}, what="train")
    for refused in (0, 2.0, True):
        with pytest.raises(ValueError, match="seed_block"):
            check_section("train", {"seed_block": refused}, what="train")


# --- literal defaults in the code ------------------------------------------------------------------

SOURCE = ROOT / "src" / "trainmap"

#: Per schema section, the modules (globs under src/trainmap) whose functions receive its settings:
#: the jobs that read the section, the modules they hand it to, the plan that sizes its jobs and
#: the grid code that completes it. A literal default for one of the section's keys there is a
#: second declaration of a setting the schema declares.
RECEIVERS: dict[str, tuple[str, ...]] = {
    "train": ("training/*.py", "jobs/train.py", "jobs/sparse.py", "methods/sparse.py",
              "grid/cells.py", "grid/section_checks.py", "plan/estimates.py"),
    "evaluate": ("evaluation/*.py", "jobs/evaluate.py", "grid/cells.py", "plan/estimates.py"),
    "gradinit": ("methods/gradinit.py", "methods/gradinit_report.py", "jobs/gradinit.py",
                 "grid/section_checks.py", "plan/estimates.py"),
    "sparse": ("methods/sparse.py", "methods/sparse_layers.py", "methods/nm.py", "jobs/sparse.py",
               "grid/section_checks.py", "plan/estimates.py"),
    "quantize": ("methods/quantize.py", "jobs/quantize.py", "grid/cells.py", "plan/estimates.py"),
    "analysis": ("dynamics/**/*.py", "jobs/analysis.py", "jobs/paper.py", "jobs/external.py",
                 "jobs/metrics.py", "grid/cells.py", "grid/analysis_checks.py", "seed_groups.py",
                 "findings.py", "plan/estimates.py"),
    "external": ("dynamics/runs/*.py", "grid/external.py", "grid/external_hub.py",
                 "jobs/external.py"),
}  # fmt: skip


def section_keys(section: str) -> frozenset[str]:
    """The setting names of ``section``: its own, and those of the mappings nested in it that the
    same code reads (a task's ``archive`` and ``augment``; a comparison's ``adaptive`` targets; a
    set's ``hub``)."""
    if section == "external":
        node = config_schema()["properties"]["external"]["items"]["properties"]
        return frozenset(node) | frozenset(node["hub"]["properties"])
    properties = section_schema(section)["properties"]
    keys = set(properties)
    for nested in ("archive", "augment"):
        keys |= set(properties.get(nested, {}).get("properties", {}))
    if section == "analysis":
        keys |= {"ari", "share"}  # analysis.joint[].adaptive's targets
    return frozenset(keys)


@dataclass(frozen=True)
class LiteralDefault:
    """A literal default for setting ``key`` in ``path`` (relative to src/trainmap), inside
    ``scope`` (a function or class, dotted; ``<module>`` at the top): a keyword ``parameter``, a
    class ``field``, a ``get`` (``.get(key, value)``, ``.setdefault``, ``.pop``) or a command-line
    ``option`` (``add_argument("--key", default=value)``)."""

    path: str
    scope: str
    key: str
    value: Any
    kind: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.scope}: {self.key} = {self.value!r} ({self.kind})"


def _literal(node: ast.AST | None) -> tuple[bool, Any]:
    """Whether ``node`` is a literal value, and the value. None and empty values (``()``, ``{}``,
    ``""``) are "not given", not a default, and do not count."""
    if node is None:
        return False, None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    empty = isinstance(value, str | tuple | list | dict | set | frozenset) and not value
    return value is not None and not empty, value


class _LiteralDefaults(ast.NodeVisitor):
    def __init__(self, keys: Collection[str], path: str, constants: Mapping[str, ast.AST]) -> None:
        self.keys, self.path, self.constants = keys, path, constants
        self.scope: list[str] = []
        self.found: list[LiteralDefault] = []

    def add(self, key: str, value_node: ast.AST | None, kind: str, line: int) -> None:
        if isinstance(value_node, ast.Name):  # a module constant: CONFIDENCE = 0.95
            value_node = self.constants.get(value_node.id, value_node)
        is_literal, value = _literal(value_node)
        if is_literal and key in self.keys:
            scope = ".".join(self.scope) or "<module>"
            self.found.append(LiteralDefault(self.path, scope, key, value, kind, line))

    def visit_arguments(self, args: ast.arguments) -> None:
        positional = [*args.posonlyargs, *args.args]
        defaulted = positional[len(positional) - len(args.defaults) :]
        for arg, default in [
            *zip(defaulted, args.defaults, strict=True),
            *zip(args.kwonlyargs, args.kw_defaults, strict=True),
        ]:
            self.add(arg.arg, default, "parameter", arg.lineno)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.scope.append(node.name)
        self.visit_arguments(node.args)
        for statement in node.body:
            self.visit(statement)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                value = statement.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                    value = next((k.value for k in value.keywords if k.arg == "default"), None)
                self.add(statement.target.id, value, "field", statement.lineno)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node: ast.Call) -> None:
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        if (
            method in ("get", "setdefault", "pop")
            and len(node.args) == 2
            and isinstance(first, str)
        ):
            self.add(first, node.args[1], "get", node.lineno)
        if method == "add_argument" and isinstance(first, str) and first.startswith("--"):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    self.add(first[2:].replace("-", "_"), keyword.value, "option", node.lineno)
        self.generic_visit(node)


def literal_defaults(
    source: str, keys: Collection[str], path: str = "<source>"
) -> list[LiteralDefault]:
    """Every literal default for one of ``keys`` in the Python ``source``, written in place or
    through a constant of the module (``DEFAULT_ALPHA = 0.05``, then ``alpha=DEFAULT_ALPHA``)."""
    tree = ast.parse(source)
    constants = {target.id: statement.value for statement in tree.body
                 if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value
                 for target in (statement.targets if isinstance(statement, ast.Assign)
                                else [statement.target])
                 if isinstance(target, ast.Name)}  # fmt: skip
    finder = _LiteralDefaults(frozenset(keys), path, constants)
    finder.visit(tree)
    return finder.found


def receivers(section: str) -> list[Path]:
    """The source files of :data:`RECEIVERS` ``[section]``, each once."""
    return sorted({path for pattern in RECEIVERS[section] for path in SOURCE.glob(pattern)})


def code_literal_defaults(
    read: Callable[[Path], str] = Path.read_text,
) -> dict[str, list[LiteralDefault]]:
    """Per section, the literal defaults for its keys in the modules that receive it."""
    return {
        section: [found for path in receivers(section)
                  for found in literal_defaults(read(path), section_keys(section),
                                                path.relative_to(SOURCE).as_posix())]
        for section in RECEIVERS
    }  # fmt: skip


def unique(found: Mapping[str, list[LiteralDefault]]) -> list[LiteralDefault]:
    """Each literal default once (a module that receives two sections, a key of both), in
    order."""
    return list({(item.path, item.line, item.key): item for items in found.values()
                 for item in items}.values())  # fmt: skip


def where(item: LiteralDefault) -> tuple[str, str, str]:
    return item.path, item.scope, item.key


#: Literal defaults that are not a second declaration of a setting, each with the reason: a
#: parameter that shares a setting's name and means something else.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("training/seed_block.py", "SeedBlock.state_of", "device"):
        "where a seed's state dict is copied to (the host), not train.<task>.device",
    **{("dynamics/maps/synthetic.py", function, "seed"):
       "the seed of a synthetic data set (tests and benchmarks), not analysis.seed"
       for function in ("left_to_right_hmm", "sample_runs", "sample_methods")},
    ("dynamics/maps/hmm/estimator.py", "TrainingHMM.__init__", "min_covar"):
        "hmmlearn's own floor, which analysis.min_covar left out keeps (held equal to "
        "GaussianHMM's default below); hmmlearn.hmm is not imported there to read it",
    **{(path, scope, "n_jobs"):
       "the processes a fit runs in, not a setting of the study: analysis.n_jobs has no schema "
       "default (a job passes its threads) and a fit is the same for any count "
       "(test_parallel_selection_equals_serial); 1 is serial"
       for path, scope in (("dynamics/maps/hmm/estimator.py", "TrainingHMM.__init__"),
                           ("dynamics/maps/hmm/selection.py", "select_model"),
                           ("dynamics/pipeline.py", "fit_group"),
                           ("dynamics/pipeline.py", "map_runs"),
                           ("dynamics/pipeline.py", "joint_group"),
                           ("dynamics/verdicts/certainty.py", "bootstrap_map"),
                           ("dynamics/verdicts/certainty.py", "run_refits"),
                           ("dynamics/verdicts/stability.py", "stability_curve"),
                           ("dynamics/verdicts/stability.py", "map_stability"))},
    ("dynamics/verdicts/certainty.py", "collapsed_to_one_state", "share"):
        "the share of bootstrap resamples at K = 1 that makes a collapsed bootstrap, not an "
        "adaptive comparison's target share",
}  # fmt: skip

#: Literal defaults still to move to the schema: each says where its value should be read from.
#: Exact, like the allow-list: one moved is taken off.
NOT_YET_MOVED: dict[tuple[str, str, str], str] = {}


def test_the_scanner_finds_each_kind_of_literal_default() -> None:
    """Positive control, on a snippet: each kind is found with its scope, and what is not a
    literal default (None, an empty value, a name, another key) is not."""
    source = """
import argparse
from dataclasses import dataclass, field

CONFIDENCE = 0.95
K_MAX = section_defaults("analysis")["k_max"]

def fit(runs, alpha: float = 0.05, *, confidence=CONFIDENCE, seed=None, features=(), k_max=K_MAX):
    settings = {}
    return settings.get("stability_ari", 0.9), settings.get("joint", []), settings.get("x", 1)

@dataclass
class Targets:
    ari: float = 0.9
    share: float = field(default=-0.5)
    other: int = 3

parser = argparse.ArgumentParser()
parser.add_argument("--k-max", type=int, default=8)
"""
    found = {(item.scope, item.key, item.value, item.kind)
             for item in literal_defaults(source, section_keys("analysis"))}  # fmt: skip
    assert found == {
        ("fit", "alpha", 0.05, "parameter"),
        ("fit", "confidence", 0.95, "parameter"),
        ("fit", "stability_ari", 0.9, "get"),
        ("Targets", "ari", 0.9, "field"),
        ("Targets", "share", -0.5, "field"),
        ("<module>", "k_max", 8, "option"),
    }
    assert SOURCE / "dynamics" / "maps" / "hmm" / "selection.py" in receivers("analysis")
    assert SOURCE / "plan" / "estimates.py" in receivers("evaluate")


def test_no_literal_default_repeats_a_schema_setting_where_its_section_is_received() -> None:
    """A setting's default is the schema's; the code that receives a section reads it from there
    (``section_defaults``, a module's ``*_DEFAULTS``) and writes no literal of its own."""
    found = unique(code_literal_defaults())
    assert len(found) >= len(ALLOWED) + len(NOT_YET_MOVED)
    left = [str(item) for item in found if where(item) not in ALLOWED | NOT_YET_MOVED]
    assert not left, "literal defaults outside the schema:\n" + "\n".join(left)


def test_the_allowed_and_the_not_yet_moved_literal_defaults_are_still_there() -> None:
    """Both lists are exact: an entry whose literal is gone is taken off."""
    found = {where(item) for item in unique(code_literal_defaults())}
    assert not set(ALLOWED) & set(NOT_YET_MOVED)
    stale = sorted(set(ALLOWED) - found) + sorted(set(NOT_YET_MOVED) - found)
    assert not stale, stale


def test_the_covariance_floor_left_out_is_hmmlearns() -> None:
    import inspect

    from hmmlearn.hmm import GaussianHMM

    from trainmap.dynamics.maps.hmm.estimator import HMMLEARN_MIN_COVAR

    assert HMMLEARN_MIN_COVAR == inspect.signature(GaussianHMM).parameters["min_covar"].default
