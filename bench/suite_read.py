"""Reading and measuring public checkpoint suites: Pythia-14m's and Pythia-160m's shapes.

For each shape, a run of ``--revisions`` checkpoints (random weights from the model's config,
built locally with ``transformers``' ``GPTNeoXForCausalLM``, saved as float16 safetensors as the
suites ship them, each revision a perturbed copy) is measured by the path external runs take
(:func:`trainmap.dynamics.runs.external.external_run_metrics`, the paper convention with the heads
split), in a fresh process:

* seconds to read one revision (every entry, :func:`~trainmap.dynamics.runs.layouts.read_entries`)
  and to measure one (the run's wall time over its revisions, reading included; a checkpoint whose
  counted weights exceed the chunk budget, the 160m shape's, is measured entry by entry:
  :mod:`trainmap.dynamics.runs.bounded`);
* peak RSS above the process's RSS after its imports, while measuring (before the read is timed),
  against the checkpoint file's size (goal at the 160m shape: <= 1.5x);
* the projected time of a 14m pass over all 154 revisions and a 160m pass over 20;
* what dominates: the seconds in the spectra (``grouped_singular_values``: ``svdvals``, or a Gram
  product and ``eigvalsh``; a profile of one revision) against the rest.

``--fetch`` measures the fetch path instead (:mod:`trainmap.dynamics.runs.hub_fetch`): a
``--fetch-revisions`` pass (default 20) of the 14m shape served by the tests' local fake of the Hub
(``tests/hub_server.py``, on 127.0.0.1) through the real ``huggingface_hub`` client, with and
without ``--keep-weights``: the seconds per revision split into fetch, read and measure, the cache's
size after each revision (the disk in use over time) and its peak, and the process's peak RSS.

Usage::

    .venv/bin/python bench/suite_read.py            # ~4 min on 2 cores
    .venv/bin/python bench/suite_read.py --quick    # 14m only, ~1 min
    .venv/bin/python bench/suite_read.py --fetch    # the fetch path, ~1 min

Writes ``bench/results/suite_read.md`` (``--fetch``: ``bench/results/suite_fetch.md``) unless
``--no-write``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "suite_read.md"
FETCH_RESULTS = RESULTS.with_name("suite_fetch.md")
#: The two Pythia shapes (EleutherAI's configs: hidden, layers, heads, intermediate, vocab).
SHAPES = {
    "14m": {"hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
            "intermediate_size": 512, "vocab_size": 50304},
    "160m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "vocab_size": 50304},
}  # fmt: skip
PASSES = {"14m": 154, "160m": 20}
RSS_GOAL = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the 14m shape only")
    parser.add_argument("--revisions", type=int, default=3, help="revisions a run (default 3)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--fetch", action="store_true",
                        help="the fetch path against a local fake Hub (see above)")  # fmt: skip
    parser.add_argument("--fetch-revisions", type=int, default=20,
                        help="revisions of the fetch pass (default 20)")  # fmt: skip
    parser.add_argument("--child", nargs=3, metavar=("RUN_DIR", "HEADS", "PATH"),
                        help=argparse.SUPPRESS)  # fmt: skip
    return parser.parse_args(argv)


def write_run(directory: Path, shape: dict, revisions: int) -> int:
    """``revisions`` float16 checkpoints of a GPT-NeoX of ``shape``; the file size in bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = GPTNeoXConfig(**shape, max_position_embeddings=2048, rotary_pct=0.25)
    model = GPTNeoXForCausalLM(config).half()
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    directory.mkdir(parents=True)
    for index in range(revisions):
        step = index * 1000
        noisy = {key: (value + 0.01 * torch.randn_like(value)).contiguous()
                 if value.is_floating_point() else value for key, value in state.items()}  # fmt: skip
        save_file(noisy, str(directory / f"step{step}.safetensors"))
    (directory / "evaluation.csv").write_text(
        "step,test_acc\n" + "".join(f"{i * 1000},0.0\n" for i in range(revisions))
    )
    return (directory / "step0.safetensors").stat().st_size


def child(run_dir: str, heads: str, path: str) -> None:
    """Measure one run in this (fresh) process and print a JSON line of timings and RSS;
    ``path``: ``auto`` (the path external runs take) or ``whole`` (every counted matrix in
    float64 at once, the trajectory path, for comparison)."""
    import time

    import torch

    from trainmap.dynamics.runs.external import external_run_metrics, read_external_run
    from trainmap.dynamics.runs.layouts import checkpoint_shapes, read_entries

    torch.set_num_threads(torch.get_num_threads())
    idle_kb = _status_kb()
    run = read_external_run(run_dir)
    first = next(iter(run.checkpoints.values()))
    started = time.perf_counter()
    external_run_metrics(run, "paper", int(heads), bounded=False if path == "whole" else None)
    measure_s = (time.perf_counter() - started) / len(run.checkpoints)
    peak_kb = _status_kb("VmHWM")  # this process's own peak (ru_maxrss keeps the parent's across
    # exec), before the read timed below
    started = time.perf_counter()
    for _, tensor in read_entries(first, list(checkpoint_shapes(first))):
        tensor.clone()  # every page read
    read_s = time.perf_counter() - started
    print(json.dumps({"read_s": read_s, "measure_s": measure_s, "idle_kb": idle_kb,
                      "peak_kb": peak_kb}))  # fmt: skip


def _status_kb(field: str = "VmRSS") -> int:
    """A memory field of /proc/self/status in kB: ``VmRSS`` now, ``VmHWM`` the peak since exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _percent(share: float) -> str:
    return "n/a" if share != share else f"{share:.0%}"


def spectra_share(run_dir: Path, heads: int) -> float:
    """The share of one revision's measuring spent in singular values (cProfile: the cumulative
    time of :func:`trainmap.dynamics.metrics.weights.grouped_singular_values`)."""
    import cProfile
    import pstats

    from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, read_external_run

    run = read_external_run(run_dir)
    step, path = next(iter(run.checkpoints.items()))
    one = ExternalRun(run.directory, {step: path}, run.evaluation.head(1))
    profile = cProfile.Profile()
    profile.runcall(external_run_metrics, one, "paper", heads)
    stats = pstats.Stats(profile)
    total = stats.total_tt
    # every spectrum goes through grouped_singular_values (svdvals, or the Gram product and
    # eigvalsh): its cumulative time
    spectral = sum(row[3] for func, row in stats.stats.items()
                   if func[2] == "grouped_singular_values")  # fmt: skip
    return spectral / total if total else float("nan")


def _folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (symlinks not followed: each blob once)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def publish(lines: list[str], path: Path, print_only: bool) -> int:
    """Print the record's ``lines`` and, unless ``print_only``, write them to ``path``."""
    text = "\n".join(lines) + "\n"
    print(text)
    if not print_only:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


def fetch_pass(scratch: Path, revisions: int, keep_weights: bool) -> dict:
    """One fetched pass of the 14m shape (see the module docstring): per-revision seconds of
    fetch, read and measure, the cache's bytes after each revision, and the peak RSS."""
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hub_server import HubServer

    from trainmap.dynamics.runs import hub_fetch
    from trainmap.dynamics.runs.external import ExternalRun, external_run_metrics, no_curve
    from trainmap.dynamics.runs.hub import parse_hub_source
    from trainmap.dynamics.runs.layouts import checkpoint_shapes, read_entries

    made = scratch / "made"
    if not made.is_dir():
        write_run(made, SHAPES["14m"], revisions)
    repo = "EleutherAI/pythia-14m-seed1"
    files = {f"step{i * 1000}": {"model.safetensors": (made / f"step{i * 1000}.safetensors")
                                 .read_bytes(), "config.json": b'{"model_type": "gpt_neox"}'}
             for i in range(revisions)}  # fmt: skip
    cache = scratch / ("hub-keep" if keep_weights else "hub")
    timings: dict[str, list[float]] = {"fetch": [], "read": [], "measure": []}
    disk: list[int] = []
    fetch = hub_fetch.fetch_checkpoint

    def timed_fetch(*fetch_args, **fetch_kwargs):
        started = time.perf_counter()
        fetched = fetch(*fetch_args, **fetch_kwargs)
        timings["fetch"].append(time.perf_counter() - started)
        return fetched

    def measure(path: Path, step: int):
        started = time.perf_counter()
        for _, tensor in read_entries(path, list(checkpoint_shapes(path))):
            tensor.clone()
        timings["read"].append(time.perf_counter() - started)
        started = time.perf_counter()
        table = external_run_metrics(ExternalRun(path.parent, {step: path}, no_curve([step])),
                                     "paper", SHAPES["14m"]["num_attention_heads"])  # fmt: skip
        timings["measure"].append(time.perf_counter() - started)
        disk.append(_folder_bytes(cache))
        return table

    hub_fetch.fetch_checkpoint = timed_fetch
    try:
        with HubServer({repo: files}) as server:
            spec = parse_hub_source("hf://" + repo, cache_dir=cache)
            started = time.perf_counter()
            manifest = hub_fetch.resolve_online(spec, endpoint=server.endpoint, token=False)
            resolve_s = time.perf_counter() - started
            started = time.perf_counter()
            hub_fetch.suite_run_metrics(manifest, "pythia-14m-seed1", scratch / f"rows-{cache.name}",
                                        measure, keep_weights=keep_weights, token=False)  # fmt: skip
            pass_s = time.perf_counter() - started
    finally:
        hub_fetch.fetch_checkpoint = fetch
    return {"keep": keep_weights, "resolve_s": resolve_s, "pass_s": pass_s,
            "file_mb": len(files["step0"]["model.safetensors"]) / 2**20,
            **{f"{key}_s": sum(values) / len(values) for key, values in timings.items()},
            "disk_mb": [b / 2**20 for b in disk], "end_mb": _folder_bytes(cache) / 2**20,
            "peak_rss_mb": _status_kb("VmHWM") / 1024}  # fmt: skip


def fetch_main(args: argparse.Namespace) -> int:
    import torch

    from trainmap.portable import cpu_model_and_flags

    with tempfile.TemporaryDirectory() as scratch:
        passes = [fetch_pass(Path(scratch), args.fetch_revisions, keep)
                  for keep in (False, True)]  # fmt: skip
    lines = [
        "# Fetching checkpoint suites a revision at a time",
        "",
        f"`bench/suite_read.py --fetch` on {cpu_model_and_flags()[0]}, {torch.get_num_threads()} "
        f"threads: {args.fetch_revisions} revisions of the 14m shape (float16 safetensors, random "
        "weights) served by the local fake Hub (tests/hub_server.py, 127.0.0.1) through "
        "huggingface_hub, `trainmap.dynamics.runs.hub_fetch.suite_run_metrics` with one fetch job.",
        "",
        "| pass | file MB | resolve s | fetch s / revision | read s | measure s | whole pass s | "
        "cache MB after each revision (max) | cache MB at the end | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {'--keep-weights' if r['keep'] else 'default (each revision deleted)'} | "
          f"{r['file_mb']:.0f} | {r['resolve_s']:.2f} | {r['fetch_s']:.3f} | {r['read_s']:.3f} | "
          f"{r['measure_s']:.3f} | {r['pass_s']:.1f} | {max(r['disk_mb']):.0f} | "
          f"{r['end_mb']:.0f} | {r['peak_rss_mb']:.0f} |" for r in passes],
        "",
        "Cache MB after each revision, in order: "
        + "; ".join(f"{'keep' if r['keep'] else 'default'}: "
                    + ", ".join(f"{mb:.0f}" for mb in r["disk_mb"]) for r in passes),
        "",
        "The fetch seconds are those of a local server (no network): a real pass adds the "
        "download time of each file at the link's speed. Peak RSS is the process's, the fake "
        "server's copy of the suite included.",
        "",
        *projected_suites(passes[0]),
    ]  # fmt: skip
    return publish(lines, FETCH_RESULTS, args.no_write)


def two_core_hours(seconds: list[float]) -> float:
    """Hours for jobs of ``seconds`` on 2 cores, a job a core, longest first (Snakemake's
    order does not matter to the total within a job's length)."""
    cores = [0.0, 0.0]
    for job in sorted(seconds, reverse=True):
        cores[cores.index(min(cores))] += job
    return max(cores) / 3600


def projected_suites(measured: dict) -> list[str]:
    """The shipped suite studies' projected times (config/suites/*.yaml, trainmap.plan.suites),
    and the 14m study's from this run's own seconds per revision."""
    from trainmap.plan import load_plan_config
    from trainmap.plan.assumptions import HUB_BYTES_PER_S
    from trainmap.plan.suites import fetched_suite_jobs

    rows = []
    for path in sorted((REPO / "config" / "suites").glob("*.yaml")):
        with contextlib.chdir(REPO):  # the config is merged over the project's params.yaml
            config = load_plan_config([str(path.relative_to(REPO))])
        jobs = [j for j in fetched_suite_jobs(config, REPO) if j.rule == "external_revisions"]
        download = sum(j.download for j in jobs)
        rows.append(f"| `{path.relative_to(REPO)}` | {len(jobs)} | {download / 1e9:,.1f} | "
                    f"{download / HUB_BYTES_PER_S / 3600:.2f} | "
                    f"{sum(j.seconds for j in jobs) / 3600:.2f} | "
                    f"{two_core_hours([j.seconds for j in jobs]):.2f} |")  # fmt: skip
    per_revision = measured["fetch_s"] + measured["read_s"] + measured["measure_s"]
    revisions_14m = 9 * 154
    return [
        "## The shipped suite studies, projected",
        "",
        "From `trainmap.plan.suites` (what `make plan` prints), offline: the download at an assumed "
        f"{HUB_BYTES_PER_S / 1e6:g} MB/s, reading and measuring from the shapes measured on the "
        "2-core EPYC (bench/results/suite_read.md), 15 s start-up a job.",
        "",
        "| config | revision jobs | download GB | of it, downloading h | all jobs one after "
        "another h | on 2 cores h |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Measured here for the 14m shape, no network: {per_revision:.3f} s a revision (fetch "
        f"from the local server + read + measure), {revisions_14m * per_revision / 3600:.2f} h for "
        f"all {revisions_14m:,} revisions of polypythias-14m one after another; the link's "
        "download time comes on top.",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.fetch:
        return fetch_main(args)
    import torch

    from trainmap.portable import cpu_model_and_flags

    shapes = ["14m"] if args.quick else ["14m", "160m"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in shapes:
            run_dir = Path(scratch) / name
            size = write_run(run_dir, SHAPES[name], args.revisions)
            heads = SHAPES[name]["num_attention_heads"]
            share = spectra_share(run_dir, heads)
            # the 160m shape by both paths, side by side: entry by entry, and all in float64
            for path in ("auto", "whole") if name == "160m" else ("auto",):
                out = subprocess.run([sys.executable, __file__, "--child", str(run_dir),
                                      str(heads), path], capture_output=True, text=True,
                                     check=True)  # fmt: skip
                measured = json.loads(out.stdout.strip().splitlines()[-1])
                above = (measured["peak_kb"] - measured["idle_kb"]) * 1024
                label = name if path == "auto" else f"{name}, all in float64"
                rows.append({"shape": label, "passes": PASSES[name], "file_mb": size / 2**20,
                             **measured, "rss_ratio": above / size,
                             "spectra_share": share if path == "auto" else float("nan"),
                             "pass_s": measured["measure_s"] * PASSES[name]})  # fmt: skip
    lines = [
        "# Reading and measuring checkpoint suites",
        "",
        f"`bench/suite_read.py{' --quick' if args.quick else ''}` on {cpu_model_and_flags()[0]}, "
        f"{torch.get_num_threads()} threads; GPT-NeoX checkpoints of Pythia's shapes (float16 "
        f"safetensors, random weights), {args.revisions} revisions a run, heads split.",
        "",
        "| shape | file MB | read s | measure s / revision | peak RSS above idle / file | "
        "spectra's share | projected pass |",
        "|---|---:|---:|---:|---:|---:|---|",
        *[f"| {r['shape']} | {r['file_mb']:.0f} | {r['read_s']:.2f} | {r['measure_s']:.2f} | "
          f"{r['rss_ratio']:.2f} | {_percent(r['spectra_share'])} | {r['passes']} revisions: "
          f"{r['pass_s'] / 60:.1f} min |" for r in rows],
        "",
        f"Goal: peak RSS above idle <= {RSS_GOAL}x the checkpoint at the 160m shape. The 160m "
        "shape's counted weights exceed the chunk budget (trainmap.dynamics.runs.external.CHUNK_BYTES), "
        "so it is measured entry by entry (trainmap.dynamics.runs.bounded); the row 'all in float64' "
        "is the trajectory path on the same files, for comparison.",
    ]  # fmt: skip
    return publish(lines, RESULTS, args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
