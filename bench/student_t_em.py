"""What the Student-t emission's EM costs: the Gaussian model, the Student-t model with Peel &
McLachlan's ECM step (the default) and with the PX-EM step (``StudentTHMM(expanded=True)``), side
by side on the same runs.

Data: :func:`trainmap.dynamics.maps.synthetic.sample_runs` (40 runs x 200 checkpoints of 14
metrics, true K 3 and 5, the known-answer tests' sampler), one selection per sampler seed with
the default settings (:class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM`), in this process.
Per selection: the K chosen, its work in state-iterations (the E-steps' states summed over EM
iterations, every K and restart) and its seconds. The PX-EM rows swap the model the factory builds
for ``expanded=True``; nothing else differs.

Usage::

    .venv/bin/python bench/student_t_em.py                # seeds 0-2 (~2 min on an idle core)
    .venv/bin/python bench/student_t_em.py --seeds 0 1 2 3 4 --out bench/results/student_t_em.md
    .venv/bin/python bench/student_t_em.py --quick        # seed 0, true K 3

Last line: ``student_t_em plain_s=... ecm_s=... px_s=... px_over_ecm=...``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from datetime import date
from pathlib import Path

#: The rows: name -> (the estimator's emission, whether the Student-t step is PX-EM's).
EM_FORMS = {"plain (Gaussian)": ("plain", False), "student_t, ECM (default)": ("student_t", False),
            "student_t, PX-EM": ("student_t", True)}  # fmt: skip


def measure(emission: str, expanded: bool, n_states: int, seed: int) -> dict:
    """One default selection of the sampler's runs: K, state-iterations, seconds."""
    from functools import partial
    from unittest import mock

    from trainmap.dynamics.maps.hmm import gaussian
    from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
    from trainmap.dynamics.maps.hmm.student_t import StudentTHMM
    from trainmap.dynamics.maps.synthetic import sample_runs

    runs, _, _ = sample_runs(n_states, seed=seed)
    work = {"states": 0}
    estep = gaussian.estep_together

    def counted(models, *args, **kwargs):
        work["states"] += sum(model.n_components for model in models)
        return estep(models, *args, **kwargs)

    model = partial(StudentTHMM, expanded=expanded)
    with mock.patch.object(gaussian, "estep_together", counted), \
            mock.patch("trainmap.dynamics.maps.hmm.student_t.StudentTHMM", model), \
            warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        hmm = TrainingHMM(emission=emission).fit(runs)
        seconds = time.perf_counter() - start
    return {"k": hmm.n_states_, "state_iterations": work["states"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="sampler seeds (default: 0 1 2)")  # fmt: skip
    parser.add_argument("--true-k", type=int, nargs="+", default=[3, 5],
                        help="the sampler's numbers of states (default: 3 5)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="seed 0, true K 3 only")
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    seeds, true_ks = ([0], [3]) if args.quick else (args.seeds, args.true_k)

    from tqdm import tqdm

    from trainmap.portable import cpu_model_and_flags

    cells = [(name, k, seed) for k in true_ks for seed in seeds for name in EM_FORMS]
    results = {}
    for name, k, seed in tqdm(cells, desc="selections", unit="fit"):
        results[name, k, seed] = measure(*EM_FORMS[name], k, seed)
    lines = [f"Default selections (K = 1-8, 5 restarts, folds) of the sampler's 40 runs x 200 "
             f"checkpoints, one process; `python bench/student_t_em.py`, {date.today()}, "
             f"{cpu_model_and_flags()[0]}. Work: E-step states summed over EM "
             "iterations of every K and restart.", "",
             "| EM | true K | K per seed | state-iterations per seed | seconds per seed | seconds in all |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    totals = dict.fromkeys(EM_FORMS, 0.0)
    for k in true_ks:
        for name in EM_FORMS:
            rows = [results[name, k, seed] for seed in seeds]
            total = sum(row["seconds"] for row in rows)
            totals[name] += total
            chosen = " ".join(str(row["k"]) for row in rows)
            work = ", ".join(format(row["state_iterations"], ",") for row in rows)
            seconds = ", ".join(format(row["seconds"], ".1f") for row in rows)
            lines.append(f"| {name} | {k} | {chosen} | {work} | {seconds} | {total:.1f} |")
    plain, ecm, px = (totals[name] for name in EM_FORMS)
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.write_text(table)
    print(
        f"student_t_em plain_s={plain:.1f} ecm_s={ecm:.1f} px_s={px:.1f} px_over_ecm={px / ecm:.2f}"
    )


if __name__ == "__main__":
    main()
