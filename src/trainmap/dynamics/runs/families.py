"""The counted matrices of public language-model checkpoint suites, by the paper's convention.

The paper ignores "embedding matrices and layer norms" (Hu et al., sec. 3) and takes, per block,
W_K, W_Q, W_V per head, W_O, W_in and W_out, never the unembedding W_U (convention (c) of
:mod:`trainmap.dynamics.metrics.weights`). :func:`trainmap.dynamics.metrics.weights.state_dict_layout` finds
these by generic names and takes a token model's last Linear for its unembedding; the suites'
families name their layers otherwise (GPT-NeoX's ``embed_out`` holds ``embed``, its
``query_key_value`` is fused and interleaved per head, BERT's pre-training heads are several
Linears), so :func:`checkpoint_layout` reads them by their own names (:data:`FAMILIES`,
recognised by :func:`detect_family`):

``gpt_neox`` (Pythia, PolyPythias; ``GPTNeoXForCausalLM``)
    ``embed_in`` (embedding) and ``embed_out`` (``lm_head`` as transformers >= 5 names it; the
    unembedding) left out. ``attention.query_key_value`` (3 d x d) holds q, k, v interleaved per
    head, its rows laid out ``[heads, 3, head_dim]`` (transformers' ``GPTNeoXAttention`` views
    the projection's output as ``(..., heads, 3 * head_dim)`` and chunks it into q, k, v): with
    ``heads`` it counts 3 * heads (head_dim, d) matrices, head h's q, k, v at rows
    ``(3 h + p) head_dim`` onwards (p = 0, 1, 2), its bias left out; without ``heads`` the fused
    matrix counts whole, with its bias. ``attention.dense``, ``mlp.dense_h_to_4h`` and
    ``mlp.dense_4h_to_h`` count with their biases.
``llama`` (Llama-style, e.g. Llama, OLMo-hf; ``LlamaForCausalLM``, ``OlmoForCausalLM``)
    ``embed_tokens`` (embedding) and ``lm_head`` (the unembedding; absent when the embeddings
    are tied) left out. ``self_attn.q_proj``/``k_proj``/``v_proj`` split per head with
    ``heads`` (the query heads): head_dim = q_proj's rows / heads, and grouped-query attention's
    k/v (fewer rows) split by that head_dim into their key/value heads. ``o_proj``,
    ``mlp.gate_proj``/``up_proj``/``down_proj`` count whole.
``bert`` (MultiBERTs; ``BertForPreTraining``)
    ``bert.embeddings.*`` and the pre-training heads ``cls.*`` (``cls.predictions.transform``,
    ``cls.predictions.decoder``, ``cls.seq_relationship``) left out. The encoder's
    ``attention.self.query``/``key``/``value`` (split per head with ``heads``),
    ``attention.output.dense``, ``intermediate.dense``, ``output.dense`` and ``bert.pooler.dense``
    count.

In every family 1-D weights are normalisation scales (left out, with their shifts), buffers
(rotary ``inv_freq``, attention masks, position ids) are no matrices, the bias of a matrix counted
whole counts and that of a projection split per head does not (as
:func:`~trainmap.dynamics.metrics.weights.state_dict_layout` and trainmap's own attention do), and an entry
the family's rules do not name reads by the generic ones (a 2-D weight is a Linear). Every entry
of the state dict is either counted (a matrix or a bias) or in the layout's ``ignored`` with its
reason. The unembedding and BERT's ``cls.*`` heads are left out under the paper conventions only;
``extended`` counts them, as ``state_dict_layout`` counts a token model's readout there.

Anything else (trainmap's own models, other external runs) keeps ``state_dict_layout``'s layout
unchanged: :func:`checkpoint_layout` returns it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trainmap.dynamics.metrics.weights import (
    MatrixSlice,
    WeightLayout,
    state_dict_layout,
    statistics_rules,
)

Shapes = Mapping[str, tuple[int, ...]]

#: Buffers a checkpoint may hold beside its parameters (name's last part -> reason left out).
BUFFERS = {"inv_freq": "buffer (rotary inv_freq)", "masked_bias": "buffer (attention mask)",
           "position_ids": "buffer (position ids)"}  # fmt: skip
NORMALISATION = "normalisation scale"
SPLIT_BIAS = "bias of a projection split per head (left out, as for trainmap's attention)"
BERT_HEAD = "BERT pre-training head (cls.*)"


@dataclass(frozen=True)
class AttentionSlice(MatrixSlice):
    """A counted attention projection matrix (a :class:`~trainmap.dynamics.metrics.weights.MatrixSlice`,
    read by the metrics alike), labelled: ``projection`` is ``"q"``, ``"k"``, ``"v"`` or
    ``"qkv"`` (a fused one counted whole), ``head`` the head (None: every head, whole)."""

    projection: str = "qkv"
    head: int | None = None

    @property
    def label(self) -> str:
        """``"head 2 k"``, or ``"q, every head (whole)"`` / ``"q, k, v fused (whole)"``."""
        if self.head is not None:
            return f"head {self.head} {self.projection}"
        if self.projection == "qkv":
            return "q, k, v fused (whole)"
        return f"{self.projection}, every head (whole)"


@dataclass(frozen=True)
class Role:
    """What one state entry is in a family's layout.

    ``kind``: ``"matrix"`` (counted whole), ``"projection"`` (q/k/v, ``detail`` the projection,
    ``query`` the same layer's query entry, whose rows give head_dim), ``"fused_qkv"`` (NeoX's
    interleaved q, k, v), ``"left_out"`` (``detail`` the reason), ``"readout"`` (left out, reason
    ``detail``, under the paper conventions; counted whole otherwise) or ``"bias_of"`` (the bias of
    the weight of module ``detail``: counted when that weight counts whole).
    """

    kind: str
    detail: str = ""
    query: str = ""


#: A family's rule for one entry: (name, shape, every shape, paper rules?) -> its role, or None
#: for the generic rules (:func:`generic_role`).
RoleRule = Callable[[str, tuple[int, ...], Shapes, bool], Role | None]


def generic_role(name: str, shape: tuple[int, ...]) -> Role:
    """An entry a family's rules do not name: a buffer (:data:`BUFFERS`), a bias (of its
    module's weight), a 1-D weight (normalisation scale), a 2-D or 4-D weight (a Linear matrix or
    conv kernel, counted), anything else left out."""
    module, _, leaf = name.rpartition(".")
    if leaf in BUFFERS:
        return Role("left_out", BUFFERS[leaf])
    if leaf == "bias":
        return Role("bias_of", module)
    if leaf == "weight" and len(shape) in (2, 4):
        return Role("matrix")
    if leaf == "weight" and len(shape) == 1:
        return Role("left_out", NORMALISATION)
    return Role("left_out", f"not a weight matrix ({len(shape)}-D {leaf})")


def _neox_role(name: str, shape: tuple[int, ...], shapes: Shapes, paper: bool) -> Role | None:
    module, _, leaf = name.rpartition(".")
    last = module.rpartition(".")[2]
    if last == "embed_in":
        return Role("left_out", "embedding")
    if module in ("embed_out", "lm_head"):  # transformers >= 5 names Pythia's embed_out lm_head
        return Role("readout", f"unembedding ({module})")
    if last == "query_key_value" and leaf == "weight":
        return Role("fused_qkv")
    if last == "attention" and leaf == "bias":  # the causal mask buffer of older checkpoints
        return Role("left_out", "buffer (attention mask)")
    return None


def _llama_role(name: str, shape: tuple[int, ...], shapes: Shapes, paper: bool) -> Role | None:
    module, _, leaf = name.rpartition(".")
    parent, _, last = module.rpartition(".")
    if last == "embed_tokens":
        return Role("left_out", "embedding")
    if module == "lm_head":
        return Role("readout", "unembedding (lm_head)")
    if last in ("q_proj", "k_proj", "v_proj") and leaf == "weight" and len(shape) == 2:
        return Role("projection", last[0], f"{parent}.q_proj.weight")
    return None


def _bert_role(name: str, shape: tuple[int, ...], shapes: Shapes, paper: bool) -> Role | None:
    module, _, leaf = name.rpartition(".")
    parent, _, last = module.rpartition(".")
    if name.startswith("cls."):
        if paper:
            return Role("left_out", BERT_HEAD)
        if name == "cls.predictions.bias":  # the MLM decoder's bias, stored twice when both exist
            if "cls.predictions.decoder.bias" in shapes:
                return Role("left_out", "tied copy of cls.predictions.decoder.bias")
            if "cls.predictions.decoder.weight" not in shapes:
                return Role("left_out", "the MLM decoder's bias; its weight, tied to the word "
                            "embedding, is not stored")  # fmt: skip
            return Role("bias_of", "cls.predictions.decoder")
        return None
    if ".embeddings." in f".{name}" and len(shape) == 2:
        return Role("left_out", "embedding")
    if last in ("query", "key", "value") and parent.endswith("attention.self") and leaf == "weight":
        return Role("projection", last[0], f"{parent}.query.weight")
    return None


@dataclass(frozen=True)
class CheckpointFamily:
    """A checkpoint family: ``title`` for people; ``markers``, patterns that each match some key
    of the family's state dicts (all of them: :func:`detect_family`); ``role``, its rules for one
    entry (:data:`RoleRule`)."""

    title: str
    markers: tuple[re.Pattern[str], ...]
    role: RoleRule


#: The families :func:`checkpoint_layout` recognises (module docstring), by name.
FAMILIES: dict[str, CheckpointFamily] = {
    "gpt_neox": CheckpointFamily(
        "GPT-NeoX (Pythia, PolyPythias)",
        (re.compile(r"(?:^|\.)embed_in\.weight$"),
         re.compile(r"(?:^|\.)layers\.\d+\.attention\.query_key_value\.weight$")),
        _neox_role,
    ),
    "llama": CheckpointFamily(
        "Llama-style (Llama, OLMo-hf)",
        (re.compile(r"(?:^|\.)embed_tokens\.weight$"),
         re.compile(r"(?:^|\.)layers\.\d+\.self_attn\.q_proj\.weight$")),
        _llama_role,
    ),
    "bert": CheckpointFamily(
        "BERT (MultiBERTs)",
        (re.compile(r"(?:^|\.)embeddings\.word_embeddings\.weight$"),
         re.compile(r"(?:^|\.)encoder\.layer\.\d+\.attention\.self\.query\.weight$")),
        _bert_role,
    ),
}  # fmt: skip


def detect_family(names: Iterable[str]) -> str | None:
    """The family (a key of :data:`FAMILIES`) whose every marker matches one of the state dict's
    entry ``names``; None when none does, or when several do (a state dict mixing families reads
    by the generic rules)."""
    names = list(names)
    found = [family for family, spec in FAMILIES.items()
             if all(any(marker.search(name) for name in names) for marker in spec.markers)]  # fmt: skip
    return found[0] if len(found) == 1 else None


def family_layout(
    family: str, shapes: Shapes, convention: str = "paper", heads: int | None = None
) -> WeightLayout:
    """The layout of a state dict of ``family`` (module docstring) from its entries' names and
    ``shapes``, in state-dict order: matrices (:class:`AttentionSlice` for attention projections),
    the biases of the matrices counted whole, and every other entry in ``ignored`` with its reason.
    ``heads``: the (query) attention heads; a projection whose rows they do not split evenly
    raises ValueError naming the entry."""
    if family not in FAMILIES:
        raise ValueError(f"checkpoint family {family!r} is not known; choose one of "
                         f"{', '.join(FAMILIES)}")  # fmt: skip
    if heads is not None and heads < 1:
        raise ValueError(f"heads = {heads}: give the model's number of attention heads (>= 1), "
                         "or none to count attention projections whole")  # fmt: skip
    paper = statistics_rules(convention) == "paper"
    rule = FAMILIES[family].role
    matrices: list[MatrixSlice] = []
    ignored: dict[str, str] = {}
    whole: set[str] = set()  # modules whose weight counts whole: their biases count
    split: set[str] = set()  # modules whose weight is split per head
    left_out: dict[str, str] = {}  # module -> why its weight is left out
    biases_of: dict[str, list[str]] = {}
    for name, shape in shapes.items():
        shape = tuple(shape)
        module = name.rpartition(".")[0]
        role = rule(name, shape, shapes, paper) or generic_role(name, shape)
        if role.kind == "readout" and not paper:
            role = Role("matrix")
        if role.kind == "bias_of":
            biases_of.setdefault(role.detail, []).append(name)
        elif role.kind in ("left_out", "readout"):
            ignored[name] = role.detail
            if name.endswith(".weight"):
                left_out[module] = role.detail
        elif role.kind == "matrix":
            matrices.append(MatrixSlice(name, kind="linear" if len(shape) == 2 else "conv"))
            whole.add(module)
        else:
            found = _attention_slices(name, shape, shapes, role, heads)
            matrices += found
            (whole if found[0].head is None else split).add(module)
    biases: list[str] = []
    for module, names in biases_of.items():
        if module in whole:
            continue
        reason = (SPLIT_BIAS if module in split
                  else "normalisation shift" if left_out.get(module) == NORMALISATION
                  else f"bias of the left-out {left_out[module]}" if module in left_out
                  else "bias without a weight in the state dict")  # fmt: skip
        ignored.update(dict.fromkeys(names, reason))
    for matrix in matrices:  # the counted biases in the order of their matrices
        module = matrix.name.rpartition(".")[0]
        if matrix.rows is None:
            biases += biases_of.pop(module, []) if module in whole else []
    ignored = {name: ignored[name] for name in shapes if name in ignored}  # state-dict order
    return WeightLayout(tuple(matrices), tuple(biases), ignored)


def _attention_slices(
    name: str, shape: tuple[int, ...], shapes: Shapes, role: Role, heads: int | None
) -> list[AttentionSlice]:
    """A q/k/v projection's (``role.kind == "projection"``) or NeoX's fused, interleaved
    projection's (``"fused_qkv"``) counted matrices: whole without ``heads``, else per head."""
    fused = role.kind == "fused_qkv"
    projection = "qkv" if fused else role.detail
    if heads is None:
        return [AttentionSlice(name, projection=projection)]
    rows = shape[0]
    if fused:  # rows [heads, 3, head_dim]: head h's part p at (3 h + p) head_dim
        if rows % (3 * heads) or rows == 0:
            raise ValueError(f"state entry {name} has {rows} rows, which q, k, v of {heads} heads "
                             "cannot split evenly; give the model's number of attention heads "
                             "(config.json num_attention_heads)")  # fmt: skip
        d_head = rows // (3 * heads)
        return [AttentionSlice(name, slice((3 * h + p) * d_head, (3 * h + p + 1) * d_head),
                               projection=part, head=h)
                for h in range(heads) for p, part in enumerate("qkv")]  # fmt: skip
    query_rows = shapes[role.query][0] if role.query in shapes else rows
    if query_rows % heads:
        raise ValueError(f"state entry {role.query if role.query in shapes else name} has "
                         f"{query_rows} rows, which {heads} query heads cannot split evenly; give "
                         "the model's number of attention heads (config.json "
                         "num_attention_heads)")  # fmt: skip
    d_head = query_rows // heads
    if rows % d_head or rows == 0:
        raise ValueError(f"state entry {name} has {rows} rows, not a whole number of heads of "
                         f"{d_head} rows (the query's {query_rows} rows / {heads} heads); check "
                         "the head count")  # fmt: skip
    return [AttentionSlice(name, slice(h * d_head, (h + 1) * d_head), projection=projection,
                           head=h)
            for h in range(rows // d_head)]  # fmt: skip


def checkpoint_layout(
    shapes: Shapes, convention: str = "paper", heads: int | None = None
) -> WeightLayout:
    """The counted matrices of a checkpoint trainmap did not train, from its entries' names and
    ``shapes``: :func:`family_layout` when :func:`detect_family` recognises its family, else
    exactly :func:`~trainmap.dynamics.metrics.weights.state_dict_layout` (trainmap's own models and every
    other state dict). Raises ValueError when ``heads`` does not split a projection evenly."""
    family = detect_family(shapes)
    if family is None:
        return state_dict_layout(shapes, convention, heads)
    return family_layout(family, shapes, convention, heads)


def describe_layout(shapes: Shapes, layout: WeightLayout, source: str) -> list[str]:
    """Lines for people: ``source`` (the family's title, ``"generic rules"`` or an architecture),
    then each counted matrix (name, rows or head label, shape), each counted bias and each entry
    left out with its reason."""
    lines = [f"layout: {source}", f"counted matrices ({len(layout.matrices)}):"]
    for matrix in layout.matrices:
        shape = tuple(shapes[matrix.name])
        where = ""
        if matrix.rows is not None:
            start, stop, _ = matrix.rows.indices(shape[0])
            shape = (stop - start, *shape[1:])
            where = f"rows {start}:{stop}"
        if isinstance(matrix, AttentionSlice):
            where = f"{where}  {matrix.label}".strip()
        lines.append(f"  {matrix.name}  {where + '  ' if where else ''}{shape}")
    lines.append(f"counted biases ({len(layout.biases)}):")
    lines += [f"  {name}  {tuple(shapes[name])}" for name in layout.biases]
    lines.append(f"left out ({len(layout.ignored)}):")
    lines += [f"  {name}  {tuple(shapes[name]) if name in shapes else ''}  {why}"
              for name, why in layout.ignored.items()]  # fmt: skip
    return lines
