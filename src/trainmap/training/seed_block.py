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
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

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

    def state_of(self, index: int) -> dict[str, torch.Tensor]:
        """Seed ``index``'s state dict (copies on the CPU)."""
        return {
            key: value[index].detach().to("cpu", copy=True) for key, value in self.state().items()
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
