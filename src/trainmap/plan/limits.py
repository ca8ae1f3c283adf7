"""One node's limits, the plan's yardstick (:class:`NodeLimits`): plain numbers, no pandas or torch,
so ``python -m trainmap.plan --help`` shows their defaults before the estimates are imported."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLimits:
    """One node: GPU memory, host RAM and disk in GB/TB, and a job's wall-time limit in hours."""

    gpu_gb: float = 80.0
    ram_gb: float = 128.0
    disk_tb: float = 1.0
    job_hours: float = 24.0

    def __str__(self) -> str:
        return (f"{self.gpu_gb:g} GB GPU memory, {self.ram_gb:g} GB RAM, {self.disk_tb:g} TB disk, "
                f"{self.job_hours:g} h a job")  # fmt: skip
