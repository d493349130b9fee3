"""The client's ends of a split model: token embedding in, final norm and LM head out."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from opentela.model.backend import NumpyBackend
from opentela.model.config import ModelConfig
from opentela.model.weights import GGUFWeights


class ClientHead:
    """Embedding, final RMSNorm and LM head of a GGUF model, in float32 NumPy.

    With tied embeddings (no ``output.weight`` in the file) the LM head is the embedding matrix itself, used
    through a transposed view rather than a second copy.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.config = ModelConfig.from_gguf(path)
        weights = GGUFWeights(path)
        self._embedding = weights.tensor("token_embd.weight")  # [vocab, hidden]
        if self._embedding.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"token_embd.weight is {self._embedding.shape}, the config says otherwise")
        self._norm = weights.tensor("output_norm.weight")
        out = self._embedding if self.config.tied_embeddings else weights.tensor("output.weight")
        self._lm_head = out.T  # [hidden, vocab] view; BLAS reads it transposed without a copy
        self._math = NumpyBackend()

    def __repr__(self) -> str:
        return f"<ClientHead {self.config.name} vocab={self.config.vocab_size}>"

    def embed(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The hidden states ``[T, hidden]`` float32 that start the blocks for these tokens."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("no tokens to embed")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        return self._embedding[ids]  # fancy indexing copies: callers may keep or modify the rows

    def logits(self, hidden_rows: np.ndarray) -> np.ndarray:
        """Next-token logits ``[..., vocab]`` float32 for hidden states ``[..., hidden]`` from the last block."""
        rows = np.asarray(hidden_rows, dtype=np.float32)
        if rows.shape[-1:] != (self.config.hidden_size,):
            raise ValueError(f"hidden rows must end in {self.config.hidden_size}, not {rows.shape}")
        normed = self._math.rms_norm(rows, self._norm, self.config.rms_norm_eps)
        return np.matmul(normed, self._lm_head)
