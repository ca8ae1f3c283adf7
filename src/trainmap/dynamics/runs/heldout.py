"""A suite revision's held-out next-token loss: the curve a language model's convergence reads.

The Hub's checkpoint suites ship no evaluation curve. Given a token array (``--eval-tokens
tokens.npy``: a 1-D integer array from the suite's own tokenizer, e.g. a slice of the Pile for
Pythia; or ``--eval-text text.txt``, tokenized by the suite's tokenizer: :func:`tokenize_text`),
:func:`heldout_loss` loads one revision's snapshot with ``transformers``
(``AutoModelForCausalLM``, from its ``config.json`` and weights, ``local_files_only``) and returns
its mean next-token cross-entropy over the first ``budget`` tokens, cut into ``context``-token
sequences (a sequence's first token is never predicted), ``batch`` sequences per forward pass, in
float32 on the CPU, the sum in float64. The tokens are read in order from the start, so every
revision of every run is scored on the same text. Its cost per revision is about
``2 x parameters x budget`` FLOPs, plus loading the model.

``transformers`` is part of the ``hub`` extra (``pip install 'trainmap[hub]'``), imported on
first use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from trainmap.dynamics.runs.layouts import ExternalRunError

#: The curve column the loss is written to (``--curve test_loss --direction falling`` reads it).
LOSS_COLUMN = "test_loss"
#: Sequences per forward pass.
DEFAULT_BATCH = 4
#: The files a tokenizer may be saved in (what is fetched for ``--eval-text``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model")  # fmt: skip


def read_tokens(
    path: Path, budget: int, context: int, setting: str = "--eval-tokens"
) -> np.ndarray:
    """The first ``budget`` tokens of ``path`` (a ``.npy`` 1-D array of non-negative integers),
    cut to a whole number of ``context``-token sequences, as int64; a file that cannot give one
    whole sequence, or is no such array, is refused, naming the ``setting``, the file and the
    fix."""
    _check_sizes(budget, context)
    try:
        tokens = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise ExternalRunError(f"{setting} {path}: not a .npy array ({error}); save the "
                               "token ids with numpy.save") from None  # fmt: skip
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ExternalRunError(f"{setting} {path}: a {tokens.ndim}-D {tokens.dtype} array; "
                               "give the token ids as one 1-D integer array")  # fmt: skip
    return _whole_sequences(tokens, f"{setting} {path}", budget, context)


def tokenize_text(path: Path, tokenizer_folder: Path, budget: int, context: int) -> np.ndarray:
    """The text file ``path`` (UTF-8) tokenized by the tokenizer in ``tokenizer_folder`` (the
    suite's own, ``AutoTokenizer``, no special tokens added), then as :func:`read_tokens`: its
    first ``budget`` tokens cut to whole ``context``-token sequences."""
    _check_sizes(budget, context)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ExternalRunError(
            "--eval-text needs transformers: pip install 'trainmap[hub]'"
        ) from None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ExternalRunError(f"--eval-text {path}: not a UTF-8 text file ({error})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ExternalRunError(f"--eval-text: the suite's tokenizer in {tokenizer_folder} could "
                               f"not be read ({str(error).splitlines()[0]}); give the token ids "
                               "with --eval-tokens instead") from None  # fmt: skip
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    return _whole_sequences(ids, f"--eval-text {path}", budget, context)


def _check_sizes(budget: int, context: int) -> None:
    if context < 2:
        raise ExternalRunError(f"--eval-context {context}: a sequence needs at least 2 tokens")
    if budget < context:
        raise ExternalRunError(f"--eval-token-budget {budget} is shorter than one sequence "
                               f"(--eval-context {context}); raise it or shorten the context")  # fmt: skip


def _whole_sequences(tokens: np.ndarray, source: str, budget: int, context: int) -> np.ndarray:
    """The first ``budget`` of ``tokens`` cut to whole ``context``-token sequences, as int64."""
    if len(tokens) < context:
        raise ExternalRunError(f"{source}: {len(tokens)} tokens, fewer than one "
                               f"sequence of {context} (--eval-context)")  # fmt: skip
    whole = min(budget, len(tokens)) // context * context
    kept = np.array(tokens[:whole], dtype=np.int64)  # a copy in memory, not the mapped file
    if kept.min() < 0:
        raise ExternalRunError(f"{source}: negative token ids; give the tokenizer's ids")
    return kept


def heldout_loss(
    snapshot: Path, tokens: np.ndarray, context: int, batch: int = DEFAULT_BATCH
) -> float:
    """The mean next-token cross-entropy (nats) of the causal language model in ``snapshot`` on
    ``tokens`` (:func:`read_tokens`: a whole number of ``context``-token sequences), each sequence
    scored on its own, ``batch`` at a time: the mean over every predicted token of
    ``-log p(token | the tokens before it in its sequence)``."""
    import torch

    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ExternalRunError("the held-out loss needs transformers: pip install "
                               "'trainmap[hub]'") from None  # fmt: skip
    vocab = _vocab_size(snapshot)
    if vocab is not None and int(tokens.max()) >= vocab:
        raise ExternalRunError(f"{snapshot}: token id {int(tokens.max())} is past the model's "
                               f"vocabulary ({vocab}); tokenize the text with this suite's "
                               "tokenizer")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(snapshot, local_files_only=True,
                                                 dtype=torch.float32)  # fmt: skip
    model.eval()
    sequences = torch.from_numpy(tokens.reshape(-1, context))
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(sequences), batch):
            ids = sequences[start : start + batch]
            logits = model(input_ids=ids).logits[:, :-1].to(torch.float64)
            targets = ids[:, 1:]
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
            )
            total += float(losses)
            count += targets.numel()
    return total / count


def _vocab_size(snapshot: Path) -> int | None:
    try:
        return int(json.loads((snapshot / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def with_heldout_loss(
    table: pd.DataFrame, checkpoints: Mapping[int, Path], tokens: np.ndarray | None, context: int
) -> pd.DataFrame:
    """``table`` (a metric table, a ``step`` per row) with each revision's held-out loss on
    ``tokens`` (:func:`heldout_loss`, the model read from the folder of the weights
    ``checkpoints[step]``) as its :data:`LOSS_COLUMN`; unchanged without tokens."""
    if tokens is None:
        return table
    table[LOSS_COLUMN] = [heldout_loss(checkpoints[int(step)].parent, tokens, context)
                          for step in table["step"]]  # fmt: skip
    return table
