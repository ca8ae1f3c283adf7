"""The architecture registry: small networks, looked up by name, sized from a data set's metadata.

Every builder has the signature ``builder(meta, **options) -> nn.Module``. ``meta`` describes one
example (``input_kind``, ``input_shape``, ``num_classes`` and, for tokens, ``vocab_size``); the
options are the architecture's sizes and switches, starting from :attr:`ArchSpec.defaults`. Models
take ``(batch, *input_shape)`` inputs (tokens: int64 ``(batch, seq_len)``) and return logits
``(batch, num_classes)``. Builders never seed: the caller seeds torch before :func:`build_model`, so
one seed gives one set of parameters.

Families (variants of one family differ only in their default switches):

``mlp``
    Flatten, then Linear + ReLU layers of widths ``hidden``, then a Linear readout.
``transformer`` / ``transformer_ln``
    The one-layer transformer of Nanda et al. (2023), "Progress measures for grokking via
    mechanistic interpretability": token + learned positional embeddings, one attention block
    with separate ``q``/``k``/``v``/``o`` projections, one ReLU MLP block, both residual, readout
    from the last position. ``transformer_ln`` adds pre-LayerNorms.
``vgg`` / ``vgg_bn``
    Simonyan & Zisserman (2015): stages of 3x3 convs + ReLU (+ BatchNorm), 2x2 max-pool per stage,
    then global average pooling and a Linear classifier.
``resnet`` / ``resnet_bn`` / ``resnet_plain``
    He et al. (2016): a 3x3 stem, then stages of basic blocks. ``resnet_plain`` drops both the
    shortcuts and BatchNorm, a plain deep CNN to compare against.

``fixup_resnet``, ``vgg_deep``, ``resnet_deep``
    The GradInit appendix's no-BN networks: FixUp's ResNet with its own init, and deep VGG/ResNet
    without normalisation, sized for small images.
``repvgg``, ``repvgg_idonly``, ``repvgg_1x1only``, ``repvgg_plain``, ``repvgg_a0`` .. ``repvgg_b3g4``
    RepVGG and its ablations (registered by :mod:`trainmap.models.repvgg`, which owns their fusion).

Later work registers more with a single :func:`register_architecture` call.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

INPUT_KINDS = frozenset({"vector", "image", "tokens"})


@dataclass(frozen=True)
class ArchSpec:
    """A registered architecture: how to build it, its default options and the inputs it accepts.

    ``check_options`` (optional) receives the full option dict (defaults updated by the caller's
    options) and raises ValueError for values the builder cannot use, so that a configuration is
    rejected before any model is built. ``deploy_form``: a trained model of this architecture is
    re-parameterised into a plain deploy model after training (RepVGG's ``reparam`` rule).
    """

    name: str
    builder: Callable[..., nn.Module]
    defaults: dict
    input_kinds: frozenset[str]
    description: str
    check_options: Callable[[dict], None] | None = None
    deploy_form: bool = False


ARCHITECTURES: dict[str, ArchSpec] = {}


def register_architecture(spec: ArchSpec) -> ArchSpec:
    """Add an architecture to the registry (a name may be registered once)."""
    if spec.name in ARCHITECTURES:
        raise ValueError(f"architecture {spec.name!r} is already registered")
    unknown_kinds = spec.input_kinds - INPUT_KINDS
    if unknown_kinds:
        raise ValueError(
            f"architecture {spec.name!r} lists unknown input kinds {sorted(unknown_kinds)}; "
            f"known: {', '.join(sorted(INPUT_KINDS))}"
        )
    ARCHITECTURES[spec.name] = spec
    return spec


def arch_names() -> list[str]:
    """The registered architecture names, sorted."""
    return sorted(ARCHITECTURES)


def check_arch(arch: str, input_kind: str | None = None, options: dict | None = None) -> None:
    """Raise a ValueError unless ``arch`` exists, accepts ``input_kind`` and takes ``options``."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; allowed: {', '.join(arch_names())}")
    spec = ARCHITECTURES[arch]
    if input_kind is not None and input_kind not in spec.input_kinds:
        raise ValueError(
            f"architecture {arch!r} does not accept input kind {input_kind!r}; "
            f"it accepts: {', '.join(sorted(spec.input_kinds))}"
        )
    options = options or {}
    unknown_keys = sorted(set(options) - set(spec.defaults))
    if unknown_keys:
        raise ValueError(
            f"architecture {arch!r} has no option(s) {', '.join(map(repr, unknown_keys))}; "
            f"allowed options: {', '.join(sorted(spec.defaults)) or 'none'}"
        )
    if spec.check_options is not None:
        try:
            spec.check_options(_resolve_options(spec, options))
        except ValueError as error:
            raise ValueError(f"architecture {arch!r}: {error}") from None


def build_model(arch: str, meta: dict, **options) -> nn.Module:
    """Build ``arch`` for data described by ``meta``; ``options`` override the defaults."""
    check_arch(arch, meta["input_kind"], options)
    spec = ARCHITECTURES[arch]
    return spec.builder(meta, **_resolve_options(spec, options))


def count_parameters(model: nn.Module) -> int:
    """The number of trainable parameters (elements of tensors with ``requires_grad``)."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


def _resolve_options(spec: ArchSpec, options: dict) -> dict:
    # Deep copy: defaults hold lists, and a builder or caller must never mutate the registry.
    resolved = copy.deepcopy(spec.defaults)
    resolved.update(copy.deepcopy(options))
    return resolved


# --- option and metadata checks ---------------------------------------------------------------


def _check_sizes(name: str, sizes: Sequence[int], allow_empty: bool = False) -> None:
    """Raise unless ``sizes`` is a list of positive ints (non-empty unless ``allow_empty``)."""
    if not isinstance(sizes, list | tuple):
        raise ValueError(f"option {name!r} must be a list of positive ints, got {sizes!r}")
    if not sizes and not allow_empty:
        raise ValueError(f"option {name!r} must not be empty")
    for size in sizes:
        _check_positive(name, size)


def _check_positive(name: str, value: int) -> None:
    # bool is an int subclass; True as a width is a config mistake, not a width of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option {name!r}: {value!r} is not a positive int")


def _check_flag(name: str, value: bool) -> None:
    # A YAML "no" that arrives as a string would otherwise be truthy and silently switch a part on.
    if not isinstance(value, bool):
        raise ValueError(f"option {name!r} must be true or false, got {value!r}")


def _check_same_length(name: str, sizes: Sequence[int], other_name: str, other: Sequence) -> None:
    if len(sizes) != len(other):
        raise ValueError(
            f"options {name!r} ({len(sizes)} entries) and {other_name!r} ({len(other)} entries) "
            "must have the same length, one entry per stage"
        )


def _check_heads(d_model: int, n_heads: int) -> None:
    _check_positive("d_model", d_model)
    _check_positive("n_heads", n_heads)
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; "
            "each head needs d_model / n_heads dimensions"
        )


def _check_mlp_options(options: dict) -> None:
    _check_sizes("hidden", options["hidden"], allow_empty=True)


def _check_transformer_options(options: dict) -> None:
    _check_heads(options["d_model"], options["n_heads"])
    _check_positive("d_mlp", options["d_mlp"])
    _check_flag("layer_norm", options["layer_norm"])


def _check_vgg_options(options: dict) -> None:
    _check_sizes("widths", options["widths"])
    _check_sizes("convs_per_stage", options["convs_per_stage"])
    _check_same_length("widths", options["widths"], "convs_per_stage", options["convs_per_stage"])
    _check_flag("batch_norm", options["batch_norm"])


def _check_resnet_options(options: dict) -> None:
    _check_sizes("widths", options["widths"])
    _check_sizes("blocks_per_stage", options["blocks_per_stage"])
    _check_same_length("widths", options["widths"], "blocks_per_stage", options["blocks_per_stage"])
    _check_flag("batch_norm", options["batch_norm"])
    _check_flag("residual", options["residual"])


def _image_shape(meta: dict) -> tuple[int, int, int]:
    """``(channels, height, width)`` of one image example."""
    shape = list(meta["input_shape"])
    if len(shape) != 3:
        raise ValueError(f"image input_shape must be [channels, height, width], got {shape}")
    channels, height, width = shape
    return channels, height, width


# --- mlp --------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Flatten, ``Linear + ReLU`` per hidden width, a Linear readout; in order in ``layers``."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        modules: list[nn.Module] = [nn.Flatten(start_dim=1)]
        width = in_features
        for hidden_width in hidden:
            modules += [nn.Linear(width, hidden_width), nn.ReLU()]
            width = hidden_width
        modules.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*modules)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)`` for inputs ``(batch, *input_shape)``."""
        return self.layers(inputs)


def build_mlp(meta: dict, hidden: Sequence[int] = (128,)) -> MLP:
    """An MLP over the flattened example (vectors, or images read pixel by pixel)."""
    _check_sizes("hidden", hidden, allow_empty=True)
    return MLP(math.prod(meta["input_shape"]), hidden, meta["num_classes"])


# --- transformer ------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Bidirectional multi-head self-attention with separate ``q``, ``k``, ``v``, ``o`` projections.

    Head ``h`` owns rows ``h * d_head:(h + 1) * d_head`` of ``q.weight``, ``k.weight`` and
    ``v.weight`` and the same columns of ``o.weight``, so per-head circuits can be sliced out.
    As in Nanda et al. the projections have no bias. There is no causal mask: the readout only
    looks at the last position, which may then attend to every token (the grokking tasks are
    sequence-to-label, so nothing leaks from the future).
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        _check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)

    def _split_heads(self, projected: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = projected.shape
        return projected.view(batch, seq_len, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, stream: torch.Tensor) -> torch.Tensor:
        """Attention output ``(batch, seq_len, d_model)`` for a residual stream of that shape."""
        batch, seq_len, d_model = stream.shape
        queries = self._split_heads(self.q(stream))
        keys = self._split_heads(self.k(stream))
        values = self._split_heads(self.v(stream))
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(self.d_head)
        mixed = scores.softmax(dim=-1) @ values
        merged = mixed.transpose(1, 2).reshape(batch, seq_len, d_model)
        return self.o(merged)


class Transformer(nn.Module):
    """A one-layer transformer classifier (Nanda et al. 2023), optionally with pre-LayerNorms.

    ``stream = embed(tokens) + pos_embed(positions)``, then
    ``stream += attention(ln_attn(stream))``, ``stream += mlp(ln_mlp(stream))`` and
    ``logits = readout(ln_final(stream[:, -1]))``. Without
    ``layer_norm`` the ``ln_*`` modules are identities, so the model holds no LayerNorm at all.
    No dropout: training dynamics should come from the optimiser, not from sampled masks.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        num_classes: int,
        d_model: int,
        n_heads: int,
        d_mlp: int,
        layer_norm: bool,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(seq_len, d_model)
        self.ln_attn = _layer_norm_or_identity(d_model, layer_norm)
        self.attention = MultiHeadAttention(d_model, n_heads)
        self.ln_mlp = _layer_norm_or_identity(d_model, layer_norm)
        self.mlp = nn.Sequential(
            OrderedDict(
                up=nn.Linear(d_model, d_mlp), relu=nn.ReLU(), down=nn.Linear(d_mlp, d_model)
            )
        )
        self.ln_final = _layer_norm_or_identity(d_model, layer_norm)
        self.readout = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)`` for int64 tokens ``(batch, seq_len)``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        stream = self.embed(tokens) + self.pos_embed(positions)
        stream = stream + self.attention(self.ln_attn(stream))
        stream = stream + self.mlp(self.ln_mlp(stream))
        return self.readout(self.ln_final(stream[:, -1]))


def _layer_norm_or_identity(d_model: int, layer_norm: bool) -> nn.Module:
    return nn.LayerNorm(d_model) if layer_norm else nn.Identity()


def build_transformer(
    meta: dict, d_model: int = 128, n_heads: int = 4, d_mlp: int = 512, layer_norm: bool = False
) -> Transformer:
    """A one-layer transformer over ``input_shape[0]`` tokens from a ``vocab_size`` vocabulary."""
    _check_transformer_options(
        {"d_model": d_model, "n_heads": n_heads, "d_mlp": d_mlp, "layer_norm": layer_norm}
    )
    if "vocab_size" not in meta:
        raise ValueError("token data metadata must give 'vocab_size'")
    seq_len = meta["input_shape"][0]
    return Transformer(
        meta["vocab_size"], seq_len, meta["num_classes"], d_model, n_heads, d_mlp, layer_norm
    )


# --- vgg --------------------------------------------------------------------------------------


def _conv3x3(in_channels: int, out_channels: int, batch_norm: bool, stride: int = 1) -> nn.Conv2d:
    # BatchNorm's shift makes a conv bias redundant, so convs carry one only without BN.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=not batch_norm)


def _vgg_stage(
    in_channels: int, width: int, num_convs: int, batch_norm: bool, pool: bool
) -> nn.Sequential:
    """``num_convs`` x (conv3x3 [+ BN] + ReLU), then a 2x2 max-pool if ``pool``."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    channels = in_channels
    for index in range(1, num_convs + 1):
        layers[f"conv{index}"] = _conv3x3(channels, width, batch_norm)
        if batch_norm:
            layers[f"bn{index}"] = nn.BatchNorm2d(width)
        layers[f"relu{index}"] = nn.ReLU()
        channels = width
    if pool:
        layers["pool"] = nn.MaxPool2d(2)
    return nn.Sequential(layers)


def build_vgg(
    meta: dict,
    widths: Sequence[int] = (16, 32, 64),
    convs_per_stage: Sequence[int] = (2, 2, 2),
    batch_norm: bool = False,
) -> nn.Sequential:
    """Stages ``stage1..stageN``, ``pool`` (global average), ``flatten``, ``classifier``."""
    _check_vgg_options(
        {"widths": widths, "convs_per_stage": convs_per_stage, "batch_norm": batch_norm}
    )
    channels, height, width = _image_shape(meta)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for index, (stage_width, num_convs) in enumerate(zip(widths, convs_per_stage, strict=True), 1):
        # Pooling a map smaller than 2x2 would leave nothing, so small inputs stop shrinking.
        pool = min(height, width) >= 2
        layers[f"stage{index}"] = _vgg_stage(channels, stage_width, num_convs, batch_norm, pool)
        if pool:
            height, width = height // 2, width // 2
        channels = stage_width
    return _with_classifier_head(layers, channels, meta["num_classes"])


def _with_classifier_head(
    layers: OrderedDict[str, nn.Module], channels: int, num_classes: int
) -> nn.Sequential:
    layers["pool"] = nn.AdaptiveAvgPool2d(1)
    layers["flatten"] = nn.Flatten(start_dim=1)
    layers["classifier"] = nn.Linear(channels, num_classes)
    return nn.Sequential(layers)


# --- resnet -----------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convs (+ BN each): ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    With ``residual`` the shortcut is the identity, or a 1x1 conv (+ BN) projection when
    the channels or the stride change. Without ``residual`` ``shortcut`` is None and nothing is
    added, which turns the network into a plain deep CNN of the same depth.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, batch_norm: bool, residual: bool
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, batch_norm, stride)
        self.bn1 = _batch_norm_or_identity(out_channels, batch_norm)
        self.conv2 = _conv3x3(out_channels, out_channels, batch_norm)
        self.bn2 = _batch_norm_or_identity(out_channels, batch_norm)
        self.relu = nn.ReLU()
        self.shortcut = (
            _shortcut(in_channels, out_channels, stride, batch_norm) if residual else None
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The block output; same spatial size as the input unless the block strides."""
        out = self.relu(self.bn1(self.conv1(inputs)))
        out = self.bn2(self.conv2(out))
        if self.shortcut is not None:
            out = out + self.shortcut(inputs)
        return self.relu(out)


def _batch_norm_or_identity(channels: int, batch_norm: bool) -> nn.Module:
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


def _shortcut(in_channels: int, out_channels: int, stride: int, batch_norm: bool) -> nn.Module:
    """Identity when shapes match, else a 1x1 projection (+ BN) to the block's output shape."""
    if in_channels == out_channels and stride == 1:
        return nn.Identity()
    projection: OrderedDict[str, nn.Module] = OrderedDict(
        conv=nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=not batch_norm)
    )
    if batch_norm:
        projection["bn"] = nn.BatchNorm2d(out_channels)
    return nn.Sequential(projection)


def _resnet_stem(in_channels: int, width: int, batch_norm: bool) -> nn.Sequential:
    """The 3x3 conv (+ BN) + ReLU that lifts the image to the first stage's width."""
    stem: OrderedDict[str, nn.Module] = OrderedDict(conv=_conv3x3(in_channels, width, batch_norm))
    if batch_norm:
        stem["bn"] = nn.BatchNorm2d(width)
    stem["relu"] = nn.ReLU()
    return nn.Sequential(stem)


def _resnet_stage(
    in_channels: int, width: int, num_blocks: int, stride: int, batch_norm: bool, residual: bool
) -> nn.Sequential:
    """``num_blocks`` basic blocks; only the first changes channels or strides."""
    blocks = [BasicBlock(in_channels, width, stride, batch_norm, residual)]
    blocks += [BasicBlock(width, width, 1, batch_norm, residual) for _ in range(num_blocks - 1)]
    return nn.Sequential(*blocks)


def build_resnet(
    meta: dict,
    widths: Sequence[int] = (16, 32, 64),
    blocks_per_stage: Sequence[int] = (1, 1, 1),
    batch_norm: bool = False,
    residual: bool = True,
) -> nn.Sequential:
    """``stem``, ``stage1..stageN`` of basic blocks, ``pool``, ``flatten``, ``classifier``."""
    _check_resnet_options(
        {
            "widths": widths,
            "blocks_per_stage": blocks_per_stage,
            "batch_norm": batch_norm,
            "residual": residual,
        }
    )
    channels, height, width = _image_shape(meta)
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        stem=_resnet_stem(channels, widths[0], batch_norm)
    )
    channels = widths[0]
    for index, (stage_width, num_blocks) in enumerate(
        zip(widths, blocks_per_stage, strict=True), 1
    ):
        # Downsample entering every stage but the first, unless the map is already tiny
        # (8x8 digits: 8 -> 4 -> 2 keeps a real final map instead of collapsing to 1x1).
        stride = 2 if index > 1 and min(height, width) >= 4 else 1
        layers[f"stage{index}"] = _resnet_stage(
            channels, stage_width, num_blocks, stride, batch_norm, residual
        )
        if stride == 2:
            # A padded 3x3 conv with stride 2 maps n to ceil(n / 2).
            height, width = (height + 1) // 2, (width + 1) // 2
        channels = stage_width
    return _with_classifier_head(layers, channels, meta["num_classes"])


# --- the registry -----------------------------------------------------------------------------

_VECTOR_OR_IMAGE = frozenset({"vector", "image"})
_IMAGE = frozenset({"image"})
_TOKENS = frozenset({"tokens"})
_TRANSFORMER_SIZES = {"d_model": 128, "n_heads": 4, "d_mlp": 512}
_VGG_SIZES = {"widths": [16, 32, 64], "convs_per_stage": [2, 2, 2]}
_RESNET_SIZES = {"widths": [16, 32, 64], "blocks_per_stage": [1, 1, 1]}

register_architecture(
    ArchSpec(
        name="mlp",
        builder=build_mlp,
        defaults={"hidden": [128]},
        input_kinds=_VECTOR_OR_IMAGE,
        description="flatten, Linear + ReLU per hidden width, Linear readout",
        check_options=_check_mlp_options,
    )
)
register_architecture(
    ArchSpec(
        name="transformer",
        builder=build_transformer,
        defaults={**_TRANSFORMER_SIZES, "layer_norm": False},
        input_kinds=_TOKENS,
        description="one-layer transformer (Nanda et al. 2023), no LayerNorm",
        check_options=_check_transformer_options,
    )
)
register_architecture(
    ArchSpec(
        name="transformer_ln",
        builder=build_transformer,
        defaults={**_TRANSFORMER_SIZES, "layer_norm": True},
        input_kinds=_TOKENS,
        description="one-layer transformer (Nanda et al. 2023) with pre-LayerNorms",
        check_options=_check_transformer_options,
    )
)
register_architecture(
    ArchSpec(
        name="vgg",
        builder=build_vgg,
        defaults={**_VGG_SIZES, "batch_norm": False},
        input_kinds=_IMAGE,
        description="VGG-style 3x3 conv stages with max-pooling, no BatchNorm",
        check_options=_check_vgg_options,
    )
)
register_architecture(
    ArchSpec(
        name="vgg_bn",
        builder=build_vgg,
        defaults={**_VGG_SIZES, "batch_norm": True},
        input_kinds=_IMAGE,
        description="VGG-style 3x3 conv stages with max-pooling and BatchNorm",
        check_options=_check_vgg_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": False, "residual": True},
        input_kinds=_IMAGE,
        description="ResNet of basic blocks with shortcuts, no BatchNorm",
        check_options=_check_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet_bn",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": True, "residual": True},
        input_kinds=_IMAGE,
        description="ResNet of basic blocks with shortcuts and BatchNorm",
        check_options=_check_resnet_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet_plain",
        builder=build_resnet,
        defaults={**_RESNET_SIZES, "batch_norm": False, "residual": False},
        input_kinds=_IMAGE,
        description="the ResNet's layers without shortcuts or BatchNorm: a plain deep CNN",
        check_options=_check_resnet_options,
    )
)


# --- fixup_resnet and the deep no-BN variants (GradInit appendix A.1) ---------------------------


class FixupBlock(nn.Module):
    """A FixUp basic block (Zhang et al. 2019; GradInit appendix A.1): no normalisation, scalar
    biases before each conv and activation, and a scalar multiplier after the second conv:

    ``relu(scale * conv2(relu(conv1(x + b1a) + b1b) + b2a) + b2b + shortcut(x + b1a))``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.bias1a = nn.Parameter(torch.zeros(1))
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bias1b = nn.Parameter(torch.zeros(1))
        self.bias2a = nn.Parameter(torch.zeros(1))
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.bias2b = nn.Parameter(torch.zeros(1))
        self.relu = nn.ReLU()
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False)
            if in_channels != out_channels or stride != 1
            else None
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The block output; a residual branch whose output is zero at FixUp's init."""
        shifted = inputs + self.bias1a
        out = self.relu(self.conv1(shifted) + self.bias1b)
        out = self.conv2(out + self.bias2a) * self.scale + self.bias2b
        identity = shifted if self.shortcut is None else self.shortcut(shifted)
        return self.relu(out + identity)


class FixupResNet(nn.Module):
    """A ResNet without normalisation, initialised by FixUp (``standard_init``)."""

    def __init__(self, in_channels: int, widths: Sequence[int], blocks_per_stage: Sequence[int],
                 num_classes: int, strides: Sequence[int]) -> None:  # fmt: skip
        super().__init__()
        self.stem = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.stem_bias = nn.Parameter(torch.zeros(1))
        self.relu = nn.ReLU()
        blocks, channels = [], widths[0]
        for width, count, stride in zip(widths, blocks_per_stage, strides, strict=True):
            for index in range(count):
                blocks.append(FixupBlock(channels, width, stride if index == 0 else 1))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head_bias = nn.Parameter(torch.zeros(1))
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)``."""
        out = self.relu(self.stem(inputs) + self.stem_bias)
        out = self.pool(self.blocks(out)).flatten(1)
        return self.classifier(out + self.head_bias)

    def standard_init(self, generator: torch.Generator) -> None:
        """FixUp's rule: He init (fan-out, as in FixUp's code) everywhere, the first conv of each of
        the L residual branches scaled by L^(-1/2) (two layers per branch: L^(-1/(2m-2)), m = 2),
        the second conv of each branch and the classifier zero, scalar biases 0 and scales 1."""
        branches = len(self.blocks)
        nn.init.kaiming_normal_(self.stem.weight, mode="fan_out", nonlinearity="relu",
                                generator=generator)  # fmt: skip
        for block in self.blocks:
            nn.init.kaiming_normal_(block.conv1.weight, mode="fan_out", nonlinearity="relu",
                                    generator=generator)  # fmt: skip
            with torch.no_grad():
                block.conv1.weight.mul_(branches**-0.5)
            nn.init.zeros_(block.conv2.weight)
            if block.shortcut is not None:
                nn.init.kaiming_normal_(block.shortcut.weight, mode="fan_out",
                                        nonlinearity="relu", generator=generator)  # fmt: skip
            for name in ("bias1a", "bias1b", "bias2a", "bias2b"):
                nn.init.zeros_(getattr(block, name))
            nn.init.ones_(block.scale)
        nn.init.zeros_(self.stem_bias)
        nn.init.zeros_(self.head_bias)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)


def _check_fixup_options(options: dict) -> None:
    _check_sizes("widths", options["widths"])
    _check_sizes("blocks_per_stage", options["blocks_per_stage"])
    _check_same_length("widths", options["widths"], "blocks_per_stage", options["blocks_per_stage"])


def build_fixup_resnet(
    meta: dict, widths: Sequence[int] = (16, 32, 64), blocks_per_stage: Sequence[int] = (3, 3, 3)
) -> FixupResNet:
    """A FixUp ResNet for ``meta``'s images: stride 2 entering each later stage while the map is
    at least 4 pixels (so 8x8 inputs keep a 2x2 final map)."""
    _check_fixup_options({"widths": widths, "blocks_per_stage": blocks_per_stage})
    channels, height, width = _image_shape(meta)
    strides = []
    for index in range(len(widths)):
        stride = 2 if index > 0 and min(height, width) >= 4 else 1
        strides.append(stride)
        if stride == 2:
            height, width = (height + 1) // 2, (width + 1) // 2
    return FixupResNet(channels, widths, blocks_per_stage, meta["num_classes"], strides)


register_architecture(
    ArchSpec(
        name="fixup_resnet",
        builder=build_fixup_resnet,
        defaults={"widths": [16, 32, 64], "blocks_per_stage": [3, 3, 3]},
        input_kinds=_IMAGE,
        description="FixUp ResNet: no normalisation, scalar biases and scales, FixUp's init",
        check_options=_check_fixup_options,
    )
)
# Deep enough without BN that plain Kaiming init struggles (GradInit appendix, VGG/ResNet w/o BN).
register_architecture(
    ArchSpec(
        name="vgg_deep",
        builder=build_vgg,
        defaults={"widths": [16, 32, 64], "convs_per_stage": [4, 4, 4], "batch_norm": False},
        input_kinds=_IMAGE,
        description="12-conv VGG without BatchNorm (GradInit's no-BN VGG, sized for small images)",
        check_options=_check_vgg_options,
    )
)
register_architecture(
    ArchSpec(
        name="resnet_deep",
        builder=build_resnet,
        defaults={
            "widths": [16, 32, 64],
            "blocks_per_stage": [3, 3, 3],
            "batch_norm": False,
            "residual": True,
        },  # fmt: skip
        input_kinds=_IMAGE,
        description="19-conv ResNet without BatchNorm (GradInit's no-BN ResNet, small images)",
        check_options=_check_resnet_options,
    )
)


# RepVGG's architectures live with their fusion in trainmap.models.repvgg; importing it registers them.
from trainmap.models import repvgg as _reparam  # noqa: E402, F401


@torch.no_grad()
def eval_forward_with_hooks(model: nn.Module, inputs: torch.Tensor, handles: list) -> None:
    """One eval-mode forward pass of ``inputs`` for the hooks behind ``handles`` (e.g. forward
    pre-hooks capturing layer inputs); the hooks are removed and the model's mode is restored,
    also when the pass fails."""
    was_training = model.training
    model.eval()
    try:
        model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
