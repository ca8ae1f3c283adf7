"""A block of seeds: S networks of one architecture trained as one vectorised model.

A tiny network trains at the speed of its per-operation overhead, not of its arithmetic: one step of
a 40-128-2 MLP costs about as much as the same step for 32 seeds at once. :class:`SeedBlock` holds the
S models' parameters and buffers stacked along a leading *seed* dimension and runs their forward pass
with ``torch.func.vmap`` over ``torch.func.functional_call`` of one template module, so every seed keeps
its own weights, its own BatchNorm batch statistics and running statistics, and its own gradients;
any optimiser whose update is elementwise (SGD with momentum and weight decay, Adam, AdamW) updates
the stacked tensors exactly as it would update each seed's tensors alone.

A block of one seed runs the module itself (no vmap: the plain loop's speed and arithmetic), and
:meth:`SeedBlock.seed_view` gives every tensor with a leading seed dimension of size 1, so the training
loop and the method hooks are written once, against stacked tensors, for both.

Not every model can be vectorised: vmap refuses data-dependent Python control flow, ``.item()``,
random numbers (dropout), and a model may hold state vmap does not see (a tensor in a plain
attribute), which would silently give every seed the same numbers. :func:`vectorisation_problem`
finds out with one trial step of the block, compared with each seed's own module; the training
loop then trains such a block's seeds one at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call, vmap


class SeedBlock:
    """S models of one architecture, their state stacked along a leading seed dimension.

    ``models`` must share architecture and options (the seeds differ only in their values). The
    block owns the stacked tensors; :meth:`write_back` copies each seed's final state into its model.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        if not models:
            raise ValueError("a seed block needs at least one model")
        self.models = list(models)
        self.size = len(models)
        first = models[0]
        self.state_keys = list(first.state_dict())
        self._aliases = _state_aliases(first)
        if self.size == 1:
            self.module = first
            self.tensors = {**dict(first.named_parameters()), **dict(first.named_buffers())}
            self.parameters = dict(first.named_parameters())
        else:
            self.module = copy.deepcopy(first).to("meta")
            self.parameters = {
                name: torch.stack([dict(m.named_parameters())[name].detach() for m in models])
                .clone()
                .requires_grad_(parameter.requires_grad)
                for name, parameter in first.named_parameters()
            }
            buffers = {
                name: torch.stack([dict(m.named_buffers())[name] for m in models]).clone()
                for name, _ in first.named_buffers()
            }
            self.tensors = {**self.parameters, **buffers}
            self._forward = vmap(self._call)
            self._forward_shared = vmap(self._call, in_dims=(0, None))

    # --- the vectorised model ------------------------------------------------------------------

    def _call(self, tensors: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, tensors, (inputs,))

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(S, B, ...)`` of per-seed inputs ``(S, B, ...)``."""
        if self.size == 1:
            return self.module(inputs[0]).unsqueeze(0)
        return self._forward(self.tensors, inputs)

    def forward_shared(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``(S, B, ...)`` of every seed on the same inputs ``(B, ...)`` (e.g. the test set)."""
        if self.size == 1:
            return self.module(inputs).unsqueeze(0)
        return self._forward_shared(self.tensors, inputs)

    def train(self, mode: bool = True) -> SeedBlock:
        """Training mode (BatchNorm on batch statistics, updating every seed's running stats)."""
        self.module.train(mode)
        return self

    def eval(self) -> SeedBlock:
        """Evaluation mode (BatchNorm on each seed's running statistics)."""
        return self.train(False)

    @property
    def training(self) -> bool:
        return self.module.training

    def to(self, device: torch.device | str) -> SeedBlock:
        """Move every seed's state to ``device`` (the stacked tensors stay leaves)."""
        if self.size == 1:
            self.module.to(device)
            self.tensors = {**dict(self.module.named_parameters()),
                            **dict(self.module.named_buffers())}  # fmt: skip
            self.parameters = dict(self.module.named_parameters())
            return self
        moved = {}
        for name, tensor in self.tensors.items():
            value = tensor.detach().to(device)
            moved[name] = (
                value.requires_grad_(tensor.requires_grad) if name in self.parameters else value
            )
        self.tensors = moved
        self.parameters = {name: moved[name] for name in self.parameters}
        return self

    # --- per-seed access ---------------------------------------------------------------------------

    def seed_view(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (a parameter, buffer or gradient of the block) with its leading seed dim."""
        return tensor.unsqueeze(0) if self.size == 1 else tensor

    def tensor(self, name: str) -> torch.Tensor:
        """The block's parameter or buffer ``name`` (a state-dict key), seed dimension first."""
        return self.seed_view(self.tensors[self._aliases.get(name, name)])

    def grad(self, name: str) -> torch.Tensor | None:
        """The gradient of parameter ``name``, seed dimension first (None before backward)."""
        grad = self.parameters[self._aliases.get(name, name)].grad
        return None if grad is None else self.seed_view(grad)

    def state(self) -> dict[str, torch.Tensor]:
        """Every state-dict entry, seed dimension first (the block's own tensors, not copies)."""
        return {key: self.tensor(key) for key in self.state_keys}

    def state_of(
        self, index: int, device: torch.device | str | None = "cpu"
    ) -> dict[str, torch.Tensor]:
        """Seed ``index``'s state dict: copies on ``device`` (None: where the block holds it)."""
        return {
            key: value[index].detach().to(device or value.device, copy=True)
            for key, value in self.state().items()
        }

    @torch.no_grad()
    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Set every seed's state from stacked tensors (the inverse of :meth:`state`)."""
        for key, value in state.items():
            self.tensor(key).copy_(value)

    @torch.no_grad()
    def set_seed_state(self, index: int, state: dict[str, torch.Tensor]) -> None:
        """Overwrite seed ``index``'s state with ``state`` (a state dict of one seed)."""
        for key, value in state.items():
            self.tensor(key)[index].copy_(value)

    def model_of(self, index: int) -> nn.Module:
        """Seed ``index`` as a module of its own (its model, holding the block's current state)."""
        model = self.models[index]
        if self.size > 1:
            model.load_state_dict(self.state_of(index))
        return model

    def write_back(self) -> None:
        """Copy each seed's state into its model (after training, the models hold the result)."""
        if self.size > 1:
            for index in range(self.size):
                self.model_of(index)


def _state_aliases(model: nn.Module) -> dict[str, str]:
    """State-dict keys that name a tensor registered under another name (tied weights)."""
    names = {id(tensor): name for name, tensor in model.named_parameters()}
    names.update({id(tensor): name for name, tensor in model.named_buffers()})
    aliases = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        owner = names.get(id(tensor), key)
        if owner != key:
            aliases[key] = owner
    return aliases


# --- can the block be vectorised? --------------------------------------------------------------


class UnvectorisableWarning(UserWarning):
    """A block whose model vmap cannot run, or runs with other numbers: its seeds train one at a
    time instead (the same results, without the block's speed-up)."""


def vectorisation_problem(block: SeedBlock, inputs: torch.Tensor) -> str | None:
    """Why ``block`` cannot train as a vectorised model, or None when it can (a block of one: None).

    One trial step on ``inputs`` (``(S, B, ...)``: a real training batch per seed): the block's
    evaluation pass (every seed on ``inputs[0]``) and its training forward and backward pass. An
    exception (vmap refusing data-dependent control flow, ``.item()``, random numbers, ...) gives
    its type and the first line of its message. Each seed's logits of both passes and its state
    after the training pass (BatchNorm statistics) are compared with the seed's own module's on
    the same inputs; numbers that differ beyond batching noise (:func:`_difference`) name the seed
    and the tensor. Gradients are not compared: in float32 a BatchNorm network's gradient of one
    seed may differ by a few per cent (of the tensor's largest entry) between the block and the
    seed alone where float64 agrees to 1e-14, so no tolerance tells a fault from rounding. The trial leaves nothing
    behind: the block's parameters, buffers, gradients, module (and its Python attributes) and
    mode, and the torch RNG are as before.
    """
    if block.size == 1:
        return None
    try:
        with _untouched(block) as initial:
            return _trial_step(block, inputs, initial)
    except Exception as error:  # any failure means: do not vectorise
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


@contextmanager
def _untouched(block: SeedBlock) -> Iterator[dict[str, torch.Tensor]]:
    """Run the trial on a copy of the block's module; restore its tensors, gradients and the RNG.
    Yields copies of the block's tensors as they were (on the CPU: no device memory)."""
    tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in block.tensors.items()}
    grads = {name: parameter.grad for name, parameter in block.parameters.items()}
    module = block.module
    block.module = copy.deepcopy(module)  # Python-side state the trial changes stays in the copy
    cuda = {_cuda_index(t.device) for t in block.tensors.values() if t.device.type == "cuda"}
    try:
        with torch.random.fork_rng(devices=sorted(cuda)):
            yield tensors
    finally:
        block.module = module
        with torch.no_grad():
            for name, tensor in block.tensors.items():
                tensor.copy_(tensors[name])
        for name, parameter in block.parameters.items():
            parameter.grad = grads[name]


def _cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device`` (``cuda`` alone: the current device)."""
    return torch.cuda.current_device() if device.index is None else device.index


def _trial_step(
    block: SeedBlock, inputs: torch.Tensor, initial: dict[str, torch.Tensor]
) -> str | None:
    """The block's step on ``inputs`` against each seed's own module, started from ``initial``
    (the block's tensors before the step; see :func:`vectorisation_problem`); the first
    difference found, or None."""
    block.eval()
    with torch.no_grad():
        shared = block.forward_shared(inputs[0].clone())
    block.train()
    logits = block(inputs.clone())
    _trial_loss(logits).sum().backward()
    for index in range(block.size):
        reference = _seed_module(block, index, initial)
        pairs = _against_seed_alone(block, index, reference, inputs, (shared, logits.detach()))
        for what, (vectorised, alone) in pairs.items():
            difference = _difference(vectorised, alone)
            if difference is not None:
                return (f"{what} of seed {index}: the vectorised block's differ from the seed's "
                        f"own module's {difference} (vmap does not see part of the model's "
                        "state, e.g. a tensor held in a plain attribute instead of a buffer)")  # fmt: skip
    return None


def _against_seed_alone(block: SeedBlock, index: int, reference: nn.Module, inputs: torch.Tensor,
                        block_logits: tuple[torch.Tensor, torch.Tensor]) -> dict[str, tuple]:  # fmt: skip
    """Seed ``index``'s trial results, (the block's, its own module's) by name: evaluation and
    training logits (``block_logits``: the block's) and the state after the training pass
    (BatchNorm statistics). ``reference``: the seed's own module, as the block was before."""
    shared, logits = block_logits
    with torch.no_grad():
        pairs = {"evaluation logits": (shared[index], reference.eval()(inputs[0].clone()))}
    own = reference.train()(inputs[index].clone())  # with autograd on, as the block's pass
    pairs["training logits"] = (logits[index], own.detach())
    for name, value in reference.state_dict().items():
        pairs[f"state {name}"] = (block.tensor(name)[index], value)
    return pairs


def _seed_module(block: SeedBlock, index: int, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of seed ``index``'s module on the block's device, holding its state in ``tensors``
    (stacked as the block's)."""
    device = next(iter(block.tensors.values())).device
    module = copy.deepcopy(block.models[index]).to(device)
    module.load_state_dict(
        {key: tensors[block._aliases.get(key, key)][index] for key in block.state_keys}
    )
    return module


def _trial_loss(logits: torch.Tensor) -> torch.Tensor:
    """Each seed's mean squared logit ``(S,)`` (any output shape): a loss every output feeds."""
    return logits.flatten(1).square().mean(dim=1)


def _difference(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """How ``actual`` (the vectorised result) differs from ``expected`` (the seed's own), or None
    within batching noise: ``max |a - e| <= atol + rtol * max |e|``, relative to the tensor's
    scale (a value near zero is no more exact than the others). float32 sums in another
    order agree to rtol 1e-4; TF32 (CUDA's default for convolutions) and half precision round
    every product to 10 bits (1e-2)."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} instead of {tuple(expected.shape)}"
    if not expected.is_floating_point():
        return None if torch.equal(actual, expected) else "different values"
    rtol, atol = _tolerance(expected)
    actual, expected = actual.double(), expected.double()
    if not torch.equal(_non_finite(actual), _non_finite(expected)):  # a diverged seed: NaN in both
        return "NaN or infinity in other places"
    finite = expected.isfinite()
    actual, expected = actual[finite], expected[finite]
    if not expected.numel():
        return None
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    if error <= atol + rtol * scale:
        return None
    return f"by up to {error:.3g} where the values reach {scale:.3g}"


def _tolerance(expected: torch.Tensor) -> tuple[float, float]:
    """(rtol, atol) for a result of ``expected``'s dtype and device."""
    low_precision = expected.dtype in (torch.float16, torch.bfloat16) or (
        expected.is_cuda
        and (torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
    )
    return (1e-2, 1e-3) if low_precision else (1e-4, 1e-5)


def _non_finite(tensor: torch.Tensor) -> torch.Tensor:
    """Where ``tensor`` is NaN, +inf and -inf (three masks)."""
    return torch.stack([tensor.isnan(), tensor.isposinf(), tensor.isneginf()])
