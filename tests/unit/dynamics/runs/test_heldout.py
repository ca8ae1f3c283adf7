"""A suite revision's held-out next-token loss (trainmap.dynamics.runs.heldout): a tiny GPT-NeoX
whose output layer is zero predicts every token with probability 1/V, so its loss is log V
exactly; the loss is the mean cross-entropy of each sequence's predicted tokens; ``trainmap map
--fetch --eval-tokens`` writes it per revision as the curve ``test_loss``; bad token files are
refused naming them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hub_server import HubServer

from trainmap.dynamics.runs.layouts import ExternalRunError

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")
from trainmap.dynamics.runs.heldout import heldout_loss, read_tokens  # noqa: E402

VOCAB, CONTEXT = 64, 16


def tiny_model(seed: int, zero_head: bool = False):
    torch.manual_seed(seed)
    config = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=32,
                                        max_position_embeddings=64)  # fmt: skip
    model = transformers.GPTNeoXForCausalLM(config)
    if zero_head:
        with torch.no_grad():
            model.get_output_embeddings().weight.zero_()
    return model


def saved(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, VOCAB, 200))
    return path


def test_a_model_that_predicts_uniformly_has_loss_log_v(tmp_path, tokens):
    folder = saved(tiny_model(0, zero_head=True), tmp_path / "uniform")
    loss = heldout_loss(folder, read_tokens(tokens, 64, CONTEXT), CONTEXT)
    assert loss == pytest.approx(math.log(VOCAB), rel=1e-12)


def test_the_loss_is_the_mean_over_each_sequences_predicted_tokens(tmp_path, tokens):
    model = tiny_model(1)
    folder = saved(model, tmp_path / "random")
    ids = read_tokens(tokens, 70, CONTEXT)  # a whole number of sequences: 64 tokens
    assert len(ids) == 64
    sequences = torch.from_numpy(ids.reshape(-1, CONTEXT))
    with torch.no_grad():
        logits = model(input_ids=sequences).logits.double()
    by_hand = torch.log_softmax(logits[:, :-1], dim=-1).gather(
        -1, sequences[:, 1:, None]).mean()  # fmt: skip
    assert heldout_loss(folder, ids, CONTEXT, batch=3) == pytest.approx(-float(by_hand), rel=1e-9)


def test_bad_token_files_are_refused_naming_them(tmp_path, tokens):
    np.save(tmp_path / "two_d.npy", np.zeros((4, 4), dtype=np.int64))
    np.save(tmp_path / "floats.npy", np.zeros(100))
    (tmp_path / "text.npy").write_text("not an array")
    for name, message in [("two_d.npy", "2-D int64 array"), ("floats.npy", "1-D float64"),
                          ("text.npy", "not a .npy array")]:  # fmt: skip
        with pytest.raises(ExternalRunError, match=message):
            read_tokens(tmp_path / name, 64, CONTEXT)
    with pytest.raises(ExternalRunError, match="shorter than one sequence"):
        read_tokens(tokens, 8, CONTEXT)
    np.save(tmp_path / "big.npy", np.full(64, VOCAB + 5))
    folder = saved(tiny_model(0), tmp_path / "model")
    with pytest.raises(
        ExternalRunError, match=r"token id 69 is past the model's vocabulary \(64\)"
    ):
        heldout_loss(folder, read_tokens(tmp_path / "big.npy", 64, CONTEXT), CONTEXT)


def nano_suite(made: Path, steps=(0, 1), besides: dict[str, bytes] | None = None) -> dict:
    """EleutherAI/pythia-nano-seed1..2 as the fake Hub serves them: a tiny model per step (its
    output layer zero at step 0: loss log V), each saved under ``made/<seed>-<step>``, and
    ``besides`` (e.g. a tokenizer's files) in every revision."""
    repos: dict[str, dict[str, dict[str, bytes]]] = {}
    for seed in (1, 2):
        repo = f"EleutherAI/pythia-nano-seed{seed}"
        repos[repo] = {}
        for step in steps:
            folder = saved(
                tiny_model(10 * seed + step, zero_head=step == 0), made / f"{seed}-{step}"
            )
            repos[repo][f"step{step}"] = {**(besides or {}),
                                          **{p.name: p.read_bytes() for p in folder.iterdir()}}  # fmt: skip
    return repos


def map_fetched(repos: dict, tmp_path: Path, out: Path, *held_out: str) -> None:
    """``trainmap map --fetch --metrics-only`` of the nano suite's seeds 1-2 from a fake Hub
    serving ``repos``, each revision scored on 64 tokens as ``held_out`` gives them."""
    from trainmap.dynamics.__main__ import main

    with HubServer(repos) as server:
        main(["hf://EleutherAI/pythia-nano-seed{seed}", "--seeds", "1-2", "--fetch",
              "--hf-endpoint", server.endpoint, "--hf-cache", str(tmp_path / "hub"), *held_out,
              "--eval-token-budget", "64", "--eval-context", str(CONTEXT), "--out", str(out),
              "--metrics-only"])  # fmt: skip


def test_the_command_line_writes_each_fetched_revisions_loss_as_its_curve(tmp_path, tokens):
    repos = nano_suite(tmp_path / "made")
    out = tmp_path / "out"
    map_fetched(repos, tmp_path, out, "--eval-tokens", str(tokens))
    ids = read_tokens(tokens, 64, CONTEXT)
    for seed in (1, 2):
        table = pd.read_csv(out / "metrics" / f"pythia-nano-seed{seed}" / "metrics.csv")
        assert table["test_loss"][0] == pytest.approx(math.log(VOCAB), rel=1e-12)
        expected = heldout_loss(tmp_path / "made" / f"{seed}-1", ids, CONTEXT)
        assert table["test_loss"][1] == pytest.approx(expected, rel=1e-12)


def word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer of the tiny model's vocabulary: "w<i>" is token i."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0").save_pretrained(
        folder
    )
    return folder


def test_text_is_tokenized_by_the_suites_own_tokenizer_fetched_alone(tmp_path):
    """``--eval-text``: the text tokenized by the first revision's tokenizer (fetched alone and
    deleted again), every revision scored on those ids, the ids kept in eval_tokens.npy."""
    ids = np.random.default_rng(1).integers(0, VOCAB, 120)
    text = tmp_path / "held_out.txt"
    text.write_text(" ".join(f"w{i}" for i in ids), encoding="utf-8")
    tokenizer = {p.name: p.read_bytes() for p in word_tokenizer(tmp_path / "tok").iterdir()}
    repos = nano_suite(tmp_path / "made", besides=tokenizer)
    out = tmp_path / "out"
    map_fetched(repos, tmp_path, out, "--eval-text", str(text))
    scored = np.load(out / "eval_tokens.npy")
    assert scored.tolist() == ids[:64].tolist()
    for seed in (1, 2):
        table = pd.read_csv(out / "metrics" / f"pythia-nano-seed{seed}" / "metrics.csv")
        for step in (0, 1):
            expected = heldout_loss(tmp_path / "made" / f"{seed}-{step}", scored, CONTEXT)
            assert table["test_loss"][step] == pytest.approx(expected, rel=1e-12)
    assert not list((tmp_path / "hub").glob("models--*/snapshots/*")), "files left in the cache"
    from trainmap.dynamics.__main__ import main

    with pytest.raises(SystemExit, match="--eval-tokens/--eval-text and --curves both"):
        main(["hf://EleutherAI/pythia-nano-seed{seed}", "--seeds", "1-2", "--eval-text", str(text),
              "--curves", str(tmp_path), "--out", str(out)])  # fmt: skip


def test_a_fetched_set_in_the_workflow_scores_each_revision_on_eval_tokens(tmp_path, tokens):
    """hub.fetch with eval_tokens: each external_revisions job scores its revisions before it
    deletes them (the loss in each row), and external_metrics converges on it falling."""
    from trainmap.grid.external import check_external, external_set
    from trainmap.grid.external_hub import resolve_fetched_sets
    from trainmap.jobs.external import external_metrics_job, external_revisions_job

    made = tmp_path / "made"
    repos = nano_suite(made, steps=(0, 1, 2))
    spec = {"name": "nano", "hub": {"repo": "EleutherAI/pythia-nano-seed{seed}", "seeds": "1-2",
                                    "fetch": True, "revisions_per_job": 2, "cache": "hub"},
            "eval_tokens": str(tokens), "eval_token_budget": 64, "eval_context": CONTEXT,
            "threshold": math.log(VOCAB) - 1e-9, "curve": "test_loss", "direction": "falling"}  # fmt: skip
    config = {"external": [spec]}
    tracking = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "nano"}
    with HubServer(repos) as server:
        resolve_fetched_sets(config, tmp_path, endpoint=server.endpoint)
        check_external(config, tmp_path)
        suite = external_set(config, spec, tmp_path)
        assert suite.inputs()["tokens"] == str(tokens)
        blocks = []
        for run, steps in suite.blocks.items():
            for index, block in enumerate(steps):
                blocks.append(tmp_path / "blocks" / run / f"{index}.csv")
                external_revisions_job("nano", run, block, suite.manifest_path, tmp_path / "rows" / run,
                                       blocks[-1], tracking, eval_tokens=tokens,
                                       eval_token_budget=64, eval_context=CONTEXT)  # fmt: skip
    out = tmp_path / "job"
    external_metrics_job("nano", suite.runs, out, out / "metrics.json", tracking,
                         hub=suite.manifest_path, blocks=blocks, threshold=spec["threshold"],
                         curve="test_loss", direction="falling", eval_tokens=tokens,
                         eval_token_budget=64, eval_context=CONTEXT)  # fmt: skip
    ids = read_tokens(tokens, 64, CONTEXT)
    for seed in (1, 2):
        run = f"pythia-nano-seed{seed}"
        table = pd.read_csv(out / "runs" / run / "metrics.csv")
        assert table["test_loss"][0] == pytest.approx(math.log(VOCAB), rel=1e-12)
        for step in (1, 2):
            expected = heldout_loss(made / f"{seed}-{step}", ids, CONTEXT)
            assert table["test_loss"][step] == pytest.approx(expected, rel=1e-12)
        record = json.loads((out / "runs" / run / "evaluation.json").read_text())
        assert record["convergence_step"] == 1  # the first revision below log V
    assert not list((tmp_path / "hub").glob("models--*/snapshots/*"))


@pytest.mark.parametrize(("change", "message"), [
    ({"curves": "curves"}, r"external\[0\]\.eval_tokens: eval_tokens and curves both give"),
    ({"threshold": 0.5}, r"external\[0\]\.curve: test_acc, but eval_tokens gives the curve test_loss"),
    ({"eval_tokens": "missing.npy"}, r"external\[0\]\.eval_tokens: eval_tokens .*missing\.npy: not a "
                                     r"\.npy array"),
    ({"hub": None, "runs": ["runs/*"]}, r"external\[0\]\.eval_tokens: only a hub set takes eval_tokens"),
])  # fmt: skip
def test_bad_eval_tokens_settings_are_refused_naming_the_key(tmp_path, tokens, change, message):
    from trainmap.grid import ConfigError
    from trainmap.grid.external import check_external

    spec = {"name": "nano", "hub": {"repo": "EleutherAI/pythia-nano-seed{seed}", "seeds": "1-2",
                                    "fetch": True}, "eval_tokens": str(tokens), **change}  # fmt: skip
    spec = {key: value for key, value in spec.items() if value is not None}
    with pytest.raises(ConfigError, match=message):
        check_external({"external": [spec]}, tmp_path)
