"""GradInit's cost as a fraction of one training epoch, measured side by side on the same model and data.

The GradInit paper runs its scale search for at most one epoch of iterations (390 at batch 128 on
CIFAR-10; 2000 on ImageNet, less than half an epoch). Each GradInit iteration costs more than a
training step: two forward passes (S and S~) and a second-order backward pass. This benchmark times,
alternately over a few rounds, on the digits data with a deep no-BN CNN (``vgg_deep``) at batch 128:

* one training epoch of ``trainmap.training.loop``'s SGD step (forward, backward, optimiser step), and
* GradInit (and MetaInit) iterations with the workflow's settings (``params.yaml: gradinit.digits``),

and prints the per-iteration cost ratio (GradInit iteration / training step), the ratio at one epoch
of iterations (the paper's budget: T = steps per epoch) and at the configured number of iterations.

Usage::

    .venv/bin/python bench/gradinit_cost.py            # ~1 minute
    .venv/bin/python bench/gradinit_cost.py --quick

Last line, machine-readable: ``gradinit_cost_ratio per_iteration=... epoch_budget=... configured=...``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    import torch


def time_training_steps(model: torch.nn.Module, data, batch: int, steps: int) -> float:
    """Seconds per plain SGD training step (momentum 0.9), after one warm-up step."""
    import torch
    import torch.nn.functional as F

    from trainmap.methods.gradinit import batch_draws

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    draws = batch_draws(data, batch, torch.Generator().manual_seed(0))
    model.train()

    def step() -> None:
        x, y = next(draws)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def time_iterations(model, data, settings: dict, objective: str, iterations: int) -> float:
    """Seconds per GradInit/MetaInit iteration, after one warm-up iteration."""
    import torch

    from trainmap.methods.gradinit import batch_draws, gradinit

    batch = settings["batch_size"]
    size = batch if objective == "metainit" else 2 * batch - round(settings["overlap"] * batch)
    kwargs = {k: settings[k] for k in ("variant", "eta", "gamma", "tau", "overlap", "min_scale",
                                       "min_bias_scale", "metainit_eps")}  # fmt: skip
    draws = batch_draws(data, size, torch.Generator().manual_seed(0))
    gradinit(copy.deepcopy(model), draws, objective=objective, iterations=1, batch_size=batch,
             **kwargs)  # fmt: skip
    started = time.perf_counter()
    gradinit(model, draws, objective=objective, iterations=iterations, batch_size=batch, **kwargs)
    return (time.perf_counter() - started) / iterations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps and rounds")
    parser.add_argument("--arch", default="vgg_deep", help="architecture (default vgg_deep)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    import torch

    from trainmap.data import make_task_data
    from trainmap.methods.gradinit import check_settings
    from trainmap.training.loop import build_cell_model

    torch.set_num_threads(args.threads)
    params = yaml.safe_load(open("params.yaml"))
    settings = check_settings(params["gradinit"]["digits"])
    data = make_task_data("digits", {})
    batch = settings["batch_size"]
    epoch_steps = len(data.x_train) // batch
    rounds, steps, iterations = (2, 5, 3) if args.quick else (3, 22, 10)
    initial = build_cell_model(args.arch, "gradinit", 0, data.meta)
    timings = {"train_step": [], "gradinit": [], "metainit": []}
    for _ in range(rounds):
        timings["train_step"].append(
            time_training_steps(copy.deepcopy(initial), data, batch, steps)
        )
        for objective in ("gradinit", "metainit"):
            timings[objective].append(
                time_iterations(copy.deepcopy(initial), data, settings, objective, iterations)
            )
    median = {key: statistics.median(values) for key, values in timings.items()}
    epoch = median["train_step"] * epoch_steps
    print(f"{args.arch} on digits, batch {batch}, {args.threads} thread(s), {rounds} rounds")
    print(f"{'':22}{'s/step':>10}{'x step':>9}{'1 epoch':>10}{'configured':>12}")
    print(f"{'training step':22}{median['train_step']:>10.4f}{1:>9.2f}{epoch:>9.2f}s")
    ratios = {}
    for objective in ("gradinit", "metainit"):
        per_iteration = median[objective] / median["train_step"]
        configured = median[objective] * settings["iterations"] / epoch
        ratios[objective] = (per_iteration, per_iteration, configured)
        print(f"{objective + ' iteration':22}{median[objective]:>10.4f}{per_iteration:>9.2f}"
              f"{per_iteration:>9.2f}x{configured:>11.2f}x")  # fmt: skip
    print(
        f"(one epoch = {epoch_steps} steps; 'configured' = {settings['iterations']} iterations "
        "as a multiple of one epoch's training time)"
    )
    gradinit_ratio = ratios["gradinit"]
    print(
        f"gradinit_cost_ratio per_iteration={gradinit_ratio[0]:.2f} "
        f"epoch_budget={gradinit_ratio[1]:.2f} configured={gradinit_ratio[2]:.2f} "
        "(GradInit time / one training epoch; the paper's budget is <= one epoch of iterations)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
