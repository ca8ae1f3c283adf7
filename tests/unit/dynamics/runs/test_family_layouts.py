"""Layouts of the public checkpoint suites' families (trainmap.dynamics.runs.families): on tiny
GPT-NeoX, Llama, OLMo and BERT models built by transformers and saved as safetensors, every
block matrix counts exactly once, embeddings, unembeddings and pre-training heads are left out
with their reasons, NeoX's interleaved q, k, v split into the rows transformers uses per head,
and any other state dict keeps state_dict_layout's layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainmap.dynamics.metrics.columns import CONVENTIONS
from trainmap.dynamics.metrics.weights import WeightLayout, state_dict_layout
from trainmap.dynamics.runs.external import external_run_metrics, read_external_run
from trainmap.dynamics.runs.families import (
    AttentionSlice,
    checkpoint_layout,
    detect_family,
    family_layout,
)
from trainmap.dynamics.runs.layouts import checkpoint_shapes

transformers = pytest.importorskip("transformers")

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 32, 4, 8, 64, 64


def neox(layers: int) -> torch.nn.Module:
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers,
        num_attention_heads=HEADS, intermediate_size=INTERMEDIATE, eos_token_id=0,
        bos_token_id=0,
    )  # fmt: skip
    config._attn_implementation = "eager"  # the path whose attention function a test wraps
    torch.manual_seed(0)
    return transformers.GPTNeoXForCausalLM(config)


def llama(tied: bool, family: str = "Llama") -> torch.nn.Module:
    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=2, intermediate_size=INTERMEDIATE, tie_word_embeddings=tied,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return getattr(transformers, f"{family}ForCausalLM")(config)


def bert() -> torch.nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                                     num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                                     max_position_embeddings=16)  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertForPreTraining(config)


def saved_shapes(
    model: torch.nn.Module, path: Path, rename: dict[str, str] | None = None
) -> dict[str, tuple[int, ...]]:
    """Save ``model``'s state dict as safetensors the way a released checkpoint holds it (a
    tied copy dropped, as ``save_pretrained`` does; entries renamed by ``rename``) and read its
    shapes back from the file, in the file's (alphabetical) key order."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # a tied weight: stored once
            continue
        seen.add(tensor.data_ptr())
        state[(rename or {}).get(name, name)] = tensor.detach().clone().contiguous()
    save_file(state, path)
    return checkpoint_shapes(path)


def assert_partition(layout: WeightLayout, shapes: dict) -> None:
    """Every entry is counted (a matrix, a bias) or left out with a reason, and only one of these;
    a split matrix's slices tile its rows exactly once."""
    counted = {m.name for m in layout.matrices}
    assert counted.isdisjoint(layout.biases) and counted.isdisjoint(layout.ignored)
    assert set(layout.biases).isdisjoint(layout.ignored)
    assert counted | set(layout.biases) | set(layout.ignored) == set(shapes)
    assert len(set(layout.biases)) == len(layout.biases)
    assert all(layout.ignored.values())
    for name in counted:
        rows = [range(shapes[name][0])[m.rows or slice(None)] for m in layout.matrices
                if m.name == name]  # fmt: skip
        assert sorted(r for part in rows for r in part) == list(range(shapes[name][0])), name


def block_matrices(shapes: dict, block: str) -> set[str]:
    """The 2-D weights inside the model's blocks (names holding ``block``)."""
    return {n for n, s in shapes.items() if block in n and len(s) == 2 and n.endswith(".weight")}


@pytest.mark.parametrize("layers", [2, 11])
@pytest.mark.parametrize("unembedding", ["embed_out", "lm_head"])
def test_gpt_neox_counts_every_block_matrix_and_leaves_out_embeddings(
    tmp_path: Path, layers: int, unembedding: str
) -> None:
    """Pythia's files name the unembedding embed_out (transformers >= 5: lm_head); with 11 layers
    the file's alphabetical order puts layers.9 last, whose matrix the generic rule took for the
    unembedding."""
    shapes = saved_shapes(neox(layers), tmp_path / "step0.safetensors",
                          {"lm_head.weight": f"{unembedding}.weight"})  # fmt: skip
    assert detect_family(shapes) == "gpt_neox"
    blocks = block_matrices(shapes, ".layers.")
    assert len(blocks) == 4 * layers
    layout = checkpoint_layout(shapes)
    assert_partition(layout, shapes)
    assert [m.name for m in layout.matrices] == [n for n in shapes if n in blocks]  # each once
    assert layout.ignored["gpt_neox.embed_in.weight"] == "embedding"
    assert layout.ignored[f"{unembedding}.weight"] == f"unembedding ({unembedding})"
    fused = [m for m in layout.matrices if "query_key_value" in m.name]
    assert all(isinstance(m, AttentionSlice) and m.rows is None and m.head is None
               and m.label == "q, k, v fused (whole)" for m in fused)  # fmt: skip
    assert {m.name.removesuffix("weight") + "bias" for m in layout.matrices} == set(layout.biases)
    scales = {n for n, s in shapes.items() if "layernorm" in n.lower() or "layer_norm" in n}
    assert {layout.ignored[n] for n in scales} == {"normalisation scale", "normalisation shift"}
    if unembedding == "embed_out" and layers == 11:  # what the generic rules did
        generic = state_dict_layout(shapes)
        assert blocks - {m.name for m in generic.matrices} == {
            "gpt_neox.layers.9.mlp.dense_h_to_4h.weight"
        }


def test_gpt_neox_heads_are_the_rows_transformers_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """With heads, query_key_value counts 3 * heads slices labelled q, k, v per head, and each
    holds the rows whose outputs GPTNeoXAttention uses as that head's q, k or v (read where the
    attention receives them), i.e. weight.view(heads, 3, head_dim, hidden)[h, p]."""
    from transformers.models.gpt_neox import modeling_gpt_neox

    model = neox(1)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    layout = checkpoint_layout(shapes, heads=HEADS)
    name = "gpt_neox.layers.0.attention.query_key_value.weight"
    slices = [m for m in layout.matrices if m.name == name]
    assert [(m.head, m.projection) for m in slices] == [(h, p) for h in range(HEADS) for p in "qkv"]
    assert all(m.rows.stop - m.rows.start == HEAD_DIM for m in slices)
    assert "gpt_neox.layers.0.attention.query_key_value.bias" in layout.ignored
    seen: dict[str, torch.Tensor] = {}

    def unrotated(q, k, cos, sin, unsqueeze_dim=1):
        seen["q"], seen["k"] = q, k
        return q, k

    attend = modeling_gpt_neox.eager_attention_forward

    def recording(module, query, key, value, *args, **kwargs):
        seen["v"] = value
        return attend(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_gpt_neox, "apply_rotary_pos_emb", unrotated)
    monkeypatch.setattr(modeling_gpt_neox, "eager_attention_forward", recording)
    attention = model.gpt_neox.layers[0].attention
    x = torch.randn(1, 5, HIDDEN)
    with torch.no_grad():
        attention(x, attention_mask=None, position_embeddings=(None, None))
    weight = attention.query_key_value.weight.detach()
    bias = attention.query_key_value.bias.detach()
    by_view = weight.view(HEADS, 3, HEAD_DIM, HIDDEN)
    for m in slices:
        expected = x[0] @ weight[m.rows].T + bias[m.rows]  # [positions, head_dim]
        torch.testing.assert_close(seen[m.projection][0, m.head], expected)
        assert torch.equal(weight[m.rows], by_view[m.head, "qkv".index(m.projection)])


@pytest.mark.parametrize("tied", [True, False])
def test_llama_splits_grouped_query_heads_and_leaves_out_embeddings(
    tmp_path: Path, tied: bool
) -> None:
    """q_proj splits into 4 heads, the 2 key/value heads' k_proj/v_proj by the same head_dim;
    lm_head, absent when tied, is the unembedding."""
    shapes = saved_shapes(llama(tied), tmp_path / "step0.safetensors")
    assert ("lm_head.weight" in shapes) is not tied
    assert detect_family(shapes) == "llama"
    blocks = block_matrices(shapes, ".layers.")
    whole = checkpoint_layout(shapes)
    assert_partition(whole, shapes)
    assert sorted(m.name for m in whole.matrices) == sorted(blocks)
    assert whole.ignored["model.embed_tokens.weight"] == "embedding"
    assert whole.ignored.get("lm_head.weight") == (None if tied else "unembedding (lm_head)")
    assert whole.biases == ()
    split = checkpoint_layout(shapes, heads=HEADS)
    assert_partition(split, shapes)
    heads_of = {}
    for m in split.matrices:
        assert m.rows is None or m.rows.stop - m.rows.start == HEAD_DIM
        heads_of.setdefault(m.name.split(".")[-2], set()).add(getattr(m, "head", None))
    assert heads_of["q_proj"] == set(range(HEADS))
    assert heads_of["k_proj"] == heads_of["v_proj"] == {0, 1}
    assert heads_of["o_proj"] == heads_of["gate_proj"] == heads_of["down_proj"] == {None}
    assert len(split.matrices) == 2 * (HEADS + 2 + 2 + 4)


def test_olmo_reads_as_llama_style(tmp_path: Path) -> None:
    """OLMo-hf (non-parametric layer norms: no scales at all) has the Llama-style layout."""
    if not hasattr(transformers, "OlmoForCausalLM"):
        pytest.skip("this transformers has no OlmoForCausalLM")
    shapes = saved_shapes(llama(False, "Olmo"), tmp_path / "step0.safetensors")
    assert detect_family(shapes) == "llama"
    layout = checkpoint_layout(shapes, heads=HEADS)
    assert_partition(layout, shapes)
    assert {m.name for m in layout.matrices} == block_matrices(shapes, ".layers.")
    assert layout.ignored == {"lm_head.weight": "unembedding (lm_head)",
                              "model.embed_tokens.weight": "embedding"}  # fmt: skip


def test_bert_leaves_out_embeddings_and_pretraining_heads(tmp_path: Path) -> None:
    """MultiBERTs' BertForPreTraining: the encoder and pooler count; bert.embeddings.* and every
    cls.* entry (MLM transform and decoder, NSP classifier) are left out."""
    shapes = saved_shapes(bert(), tmp_path / "step0.safetensors")
    assert detect_family(shapes) == "bert"
    layout = checkpoint_layout(shapes)
    assert_partition(layout, shapes)
    counted = {m.name for m in layout.matrices}
    assert counted == block_matrices(shapes, ".encoder.layer.") | {"bert.pooler.dense.weight"}
    assert len(counted) == 2 * 6 + 1
    heads = {n: why for n, why in layout.ignored.items() if n.startswith("cls.")}
    assert {"cls.predictions.transform.dense.weight", "cls.seq_relationship.weight"} <= set(heads)
    assert set(heads.values()) == {"BERT pre-training head (cls.*)"}
    embeddings = {n for n in shapes if n.startswith("bert.embeddings.")}
    assert embeddings <= set(layout.ignored)
    assert {layout.ignored[n] for n in embeddings if len(shapes[n]) == 2} == {"embedding"}
    assert len(layout.biases) == len(counted)  # q, k, v whole: their biases count
    split = checkpoint_layout(shapes, heads=HEADS)
    assert_partition(split, shapes)
    per_head = [m for m in split.matrices if isinstance(m, AttentionSlice)]
    assert len(per_head) == 2 * 3 * HEADS and all(m.head is not None for m in per_head)
    assert not any(b.split(".")[-2] in ("query", "key", "value") for b in split.biases)


def test_extended_counts_the_readouts_paper_leaves_out(tmp_path: Path) -> None:
    """As state_dict_layout counts a token model's readout under ``extended``: the unembedding
    and BERT's cls.* Linears count there (the MLM decoder where its weight is stored, not tied
    away); paper_shortcuts leaves them out like paper."""
    neox_shapes = saved_shapes(neox(2), tmp_path / "neox.safetensors",
                               {"lm_head.weight": "embed_out.weight"})  # fmt: skip
    llama_shapes = saved_shapes(llama(False), tmp_path / "llama.safetensors")
    model = bert()
    saved = saved_shapes(model, tmp_path / "bert.safetensors")  # the decoder tied away
    every = {k: tuple(v.shape) for k, v in model.state_dict().items()}  # the tied copies too
    heads = {"cls.predictions.transform.dense.weight", "cls.seq_relationship.weight"}
    for shapes, readouts in ((neox_shapes, {"embed_out.weight"}),
                             (llama_shapes, {"lm_head.weight"}), (saved, heads),
                             (every, heads | {"cls.predictions.decoder.weight"})):  # fmt: skip
        paper = checkpoint_layout(shapes, "paper")
        assert checkpoint_layout(shapes, "paper_shortcuts") == paper
        extended = checkpoint_layout(shapes, "extended")
        assert_partition(extended, shapes)
        assert {m.name for m in extended.matrices} - {m.name for m in paper.matrices} == readouts
    assert "cls.predictions.decoder.weight" not in saved
    assert "decoder" in checkpoint_layout(saved, "extended").ignored["cls.predictions.bias"]
    both = checkpoint_layout(every, "extended")
    assert "cls.predictions.decoder.bias" in both.biases
    assert both.ignored["cls.predictions.bias"].startswith("tied copy")


def test_buffers_of_older_checkpoints_are_no_matrices() -> None:
    """Older Pythia and Llama files hold rotary inv_freq and attention-mask buffers."""
    buffers = {"gpt_neox.layers.0.attention.rotary_emb.inv_freq": (4,),
               "gpt_neox.layers.0.attention.masked_bias": (),
               "gpt_neox.layers.0.attention.bias": (1, 1, 16, 16)}  # fmt: skip
    shapes = {k: tuple(v.shape) for k, v in neox(1).state_dict().items()} | buffers
    layout = checkpoint_layout(shapes, heads=HEADS)
    assert_partition(layout, shapes)
    assert {n: layout.ignored[n] for n in buffers} == {
        "gpt_neox.layers.0.attention.rotary_emb.inv_freq": "buffer (rotary inv_freq)",
        "gpt_neox.layers.0.attention.masked_bias": "buffer (attention mask)",
        "gpt_neox.layers.0.attention.bias": "buffer (attention mask)",
    }
    rotary = "model.layers.0.self_attn.rotary_emb.inv_freq"
    shapes = {k: tuple(v.shape) for k, v in llama(False).state_dict().items()} | {rotary: (4,)}
    assert checkpoint_layout(shapes).ignored[rotary] == "buffer (rotary inv_freq)"


def test_wrong_head_counts_are_refused_naming_the_entry() -> None:
    shapes = {k: tuple(v.shape) for k, v in neox(1).state_dict().items()}
    with pytest.raises(ValueError, match=r"query_key_value\.weight has 96 rows.*5 heads"):
        checkpoint_layout(shapes, heads=5)
    with pytest.raises(ValueError, match=r"heads = 0"):
        checkpoint_layout(shapes, heads=0)
    with pytest.raises(ValueError, match=r"'gpt_j' is not known"):
        family_layout("gpt_j", shapes)


@pytest.mark.parametrize("arch", ["transformer", "transformer_ln", "mlp", "resnet_bn"])
def test_other_state_dicts_keep_the_generic_layout(arch: str) -> None:
    """trainmap's own models (and anything not of a family) get exactly state_dict_layout's."""
    from trainmap.data import model_meta
    from trainmap.models import build_model

    task = ("modular_addition", {}) if arch.startswith("transformer") else ("digits", {})
    model = build_model(arch, model_meta(*task))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if v.is_floating_point()}
    assert detect_family(shapes) is None
    heads = getattr(getattr(model, "attention", None), "n_heads", None)
    for convention in CONVENTIONS:
        for given in {None, heads}:
            assert checkpoint_layout(shapes, convention, given) == state_dict_layout(
                shapes, convention, given
            )


def neox_run(directory: Path) -> Path:
    """A plain external run of a tiny NeoX: two checkpoints named by step, its evaluation curve."""
    directory.mkdir(parents=True)
    model = neox(2)
    rename = {"lm_head.weight": "embed_out.weight"}
    for step in (0, 10):
        saved_shapes(model, directory / f"step{step}.safetensors", rename)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01 * torch.randn_like(parameter))
    (directory / "evaluation.csv").write_text("step,test_acc\n0,0.1\n10,0.2\n")
    return directory


def test_external_runs_read_with_the_family_layout(tmp_path: Path) -> None:
    """external_run_metrics (its run_layout) counts NeoX's per-head matrices: 2 layers of
    12 q/k/v heads plus dense, dense_h_to_4h, dense_4h_to_h."""
    run = read_external_run(neox_run(tmp_path / "neox"))
    table = external_run_metrics(run, heads=HEADS)
    assert table["n_matrices"].tolist() == [2 * (3 * HEADS + 3)] * 2
    assert table["skipped_matrices"].tolist() == [0, 0]
    assert external_run_metrics(run)["n_matrices"].iloc[0] == 2 * 4


def test_show_layout_prints_the_layout_and_fits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainmap.dynamics.__main__ import main

    run = neox_run(tmp_path / "runs" / "neox")
    before = sorted(tmp_path.rglob("*"))
    assert main(["--show-layout", str(run), "--heads", str(HEADS)]) == 0
    out = capsys.readouterr().out
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert "first checkpoint step0.safetensors (step 0)" in out
    assert "layout: GPT-NeoX (Pythia, PolyPythias)" in out
    assert "counted matrices (30):" in out
    assert ("gpt_neox.layers.0.attention.query_key_value.weight  rows 8:16  head 0 k  (8, 32)"
            in out)  # fmt: skip
    assert "embed_out.weight  (64, 32)  unembedding (embed_out)" in out
    assert "gpt_neox.embed_in.weight  (64, 32)  embedding" in out
    assert "normalisation scale" in out
    (run.parent / "other").mkdir()
    torch.save({"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2)},
               run.parent / "other" / "step_0.pt")  # fmt: skip
    (run.parent / "other" / "evaluation.csv").write_text("step,test_acc\n0,0.5\n")
    assert main(["--show-layout", str(run.parent / "other")]) == 0
    out = capsys.readouterr().out
    assert "layout: generic rules" in out and "fc.weight  (2, 3)" in out
    with pytest.raises(SystemExit, match="--out is required"):
        main([str(run), "--threshold", "0.5"])
