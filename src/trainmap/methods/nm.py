"""How a weight tensor is cut into N:M groups of M consecutive inputs (shared by masks and packing).

A Linear weight (out, in) has one layout: each output row's inputs in groups of M. A conv kernel
(out, in, kh, kw) has two:

* ``input_channels`` (the default for convs): at every kernel position (kh, kw) of an output
  channel, M consecutive *input channels* form a group. This is the layout of the SR-STE authors'
  sparse conv (NM-sparsity: the kernel is permuted to (out, kh, kw, in) before grouping) and the one
  N:M sparse tensor cores accelerate (an implicit GEMM's reduction axis runs over input channels at
  each kernel position). Needs in_channels (per conv group) divisible by M.
* ``flattened``: M consecutive entries of the (out, in*kh*kw) row, i.e. in (in, kh, kw) order; for a
  3x3 kernel and M = 4, 12 of every 36 groups then span two input channels. trainmap's earlier
  layout; kept as an option (and assumed for sparse checkpoints that do not name a layout).

:func:`nm_groups` gives the (out, groups, M) view of a tensor in either layout and
:func:`from_nm_groups` inverts it. The packed format (:func:`trainmap.methods.packing.pack_nm`) stores
groups in this order and names the layout in its header.
"""

from __future__ import annotations

import torch

GROUP_LAYOUTS = ("input_channels", "flattened")
#: Sparse checkpoints and packed files written before the layout was recorded used this one.
LEGACY_LAYOUT = "flattened"


def check_layout(layout: str) -> str:
    """``layout`` itself, or a ValueError naming the allowed layouts."""
    if layout not in GROUP_LAYOUTS:
        raise ValueError(f"N:M group layout {layout!r} is not one of {GROUP_LAYOUTS}")
    return layout


def _by_input_channel(shape: torch.Size | tuple[int, ...], layout: str) -> bool:
    """Whether a tensor of ``shape`` groups along its input channels at each kernel position."""
    return check_layout(layout) == "input_channels" and len(shape) > 2


def grouped_axis_size(shape: torch.Size | tuple[int, ...], layout: str) -> int:
    """The length of the axis cut into groups of M: in_channels (per conv group) for a kernel in
    the ``input_channels`` layout, else the flattened input size of a row."""
    if _by_input_channel(shape, layout):
        return int(shape[1])
    size = 1
    for dim in shape[1:]:
        size *= int(dim)
    return size


def nm_groups(tensor: torch.Tensor, m: int, layout: str) -> torch.Tensor:
    """The (out, groups, M) view of ``tensor`` (a weight, a mask or scores) in ``layout``.

    Group order: for ``input_channels``, (kh, kw, in // M) within each output channel; for
    ``flattened`` (and every 2-D weight), along the row.
    """
    size = grouped_axis_size(tensor.shape, layout)
    if size % m:
        raise ValueError(
            f"an N:M mask needs the grouped input size ({size}, layout {layout!r}) divisible by "
            f"m={m}"
        )
    if _by_input_channel(tensor.shape, layout):
        tensor = tensor.permute(0, *range(2, tensor.dim()), 1)
    return tensor.reshape(tensor.shape[0], -1, m)


def from_nm_groups(groups: torch.Tensor, shape: torch.Size | tuple[int, ...],
                   layout: str) -> torch.Tensor:  # fmt: skip
    """The tensor of ``shape`` whose :func:`nm_groups` view is ``groups`` (the inverse)."""
    if _by_input_channel(shape, layout):
        permuted = (shape[0], *shape[2:], shape[1])
        rank = len(shape)
        return groups.reshape(permuted).permute(0, rank - 1, *range(1, rank - 1)).contiguous()
    return groups.reshape(shape)
