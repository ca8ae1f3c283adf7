"""``trainmap resolve``: list the Hub's revisions of a study's fetched suites before the workflow.

A hub set with ``fetch: true`` (config key ``external``) is read by no job until its
``results/external/<name>/revisions.json`` exists: this command writes it, from each repository's
refs and each kept revision's safetensors header (never the weights), and prints what the suite
will download, hold on disk at once, and how many jobs measure it. Run it again to take in
revisions published since; a manifest whose content is unchanged is not rewritten, so nothing
reruns. The workflow's check then reads the file alone and refuses one that no longer matches
the config (:func:`trainmap.grid.external_hub.fetched_set_manifest`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """``trainmap resolve [--configfile CONFIG ...] [--set NAME ...] [--hf-endpoint URL]``."""
    parser = argparse.ArgumentParser(
        prog="trainmap resolve",
        description="Resolve the suites a study fetches from the Hugging Face Hub (external sets "
        "with hub.fetch: true) into results/external/<name>/revisions.json: each revision's "
        "commit, files and size from the refs and safetensors headers, no weights. The workflow "
        "reads only that file; run this before `trainmap run` / `make run`, and again to take in "
        "new revisions.",
    )
    parser.add_argument("--configfile", nargs="*", default=[], metavar="CONFIG",
                        help="config files merged over params.yaml and config/config.yaml, as the "
                        "workflow merges them")  # fmt: skip
    parser.add_argument("--set", dest="sets", action="append", default=None, metavar="NAME",
                        help="resolve only this set (repeatable; default: every fetched set)")  # fmt: skip
    parser.add_argument("--hf-endpoint", default=None, metavar="URL",
                        help="the Hub to list (default: huggingface_hub's, HF_ENDPOINT or "
                        "https://huggingface.co); a mirror is fetched from too")  # fmt: skip
    args = parser.parse_args(argv)
    # After the arguments: --help answers without huggingface_hub or the config.
    from trainmap import grid
    from trainmap.dynamics.runs.hub import HubCacheError
    from trainmap.grid.external_hub import (
        fetch_setting,
        resolve_fetched_sets,
        revision_blocks,
        revision_sizes,
    )

    with grid.config_problems_reported():
        config = grid.merged_config("params.yaml", "config/config.yaml", *args.configfile)
        grid.validate_schema(config)
    try:
        resolved = resolve_fetched_sets(config, Path.cwd(), args.sets, args.hf_endpoint)
    except HubCacheError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if not resolved:
        print("no external set has hub.fetch: true; nothing to resolve")
        return 0
    specs = grid.external_sets(config)
    for name, (manifest, written) in resolved.items():
        sizes = [b for run in revision_sizes(manifest, specs[name]).values() for b in run.values()]
        per_job = int(fetch_setting(specs[name], "revisions_per_job"))
        jobs = sum(len(blocks) for blocks in revision_blocks(manifest.runs, per_job).values())
        in_flight = int(fetch_setting(specs[name], "fetch_jobs")) * max(sizes, default=0)
        state = "written" if written else "unchanged"
        print(f"{name}: {len(manifest.runs)} runs, {len(sizes)} revisions, "
              f"{sum(sizes) / 1e9:,.2f} GB to download, at most {in_flight / 1e9:,.2f} GB of "
              f"weights on disk per job, {jobs} jobs of up to {per_job} revisions "
              f"({manifest.fetch_from}); revisions.json {state}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
