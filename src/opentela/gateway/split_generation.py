"""OpenAI chat and completions for a split model: the ingress tokenizes, embeds, drives the chain and samples.

The request parsing, the token loop and the OpenAI shapes are shared with every engine that runs a model token by
token (engines/openai_text.py); what is the split model's own is the chain behind each step and where its time went.
"""

from __future__ import annotations

from typing import Any

from opentela.engines.openai_text import (
    OpenAIShape,
    TextGeneration,
    TextRequest,
    stream_answer,
    whole_answer,
)
from opentela.engines.openai_text import parse_request as parse_text_request
from opentela.gateway.chain_client import ChainSession
from opentela.gateway.split_models import SplitAssets, SplitModels

SplitRequest = TextRequest

__all__ = [
    "OpenAIShape",
    "SplitGeneration",
    "SplitRequest",
    "parse_request",
    "stream_answer",
    "whole_answer",
]


def parse_request(kind: str, body: dict[str, Any], assets: SplitAssets, cap: int) -> TextRequest:
    """Check `body` and tokenize its prompt with the split model's tokenizer."""
    return parse_text_request(kind, body, assets.tokenizer, assets.config, cap)


class SplitGeneration(TextGeneration):
    """One request's generation over a chain of block servers."""

    def __init__(
        self, models: SplitModels, model: str, assets: SplitAssets, req: TextRequest, session: ChainSession
    ) -> None:
        super().__init__(assets.head, assets.tokenizer, req, session.step)
        self.models, self.model, self.assets, self.session = models, model, assets, session

    def server_timing(self) -> str:
        """Where the time went: the ingress's head, the servers' blocks, and the rest of the chain (fabric)."""
        s = self.session
        fabric = max(s.chain_s - s.compute_s, 0.0)
        return f"head;dur={self.head_s * 1e3:.2f}, blocks;dur={s.compute_s * 1e3:.2f}, fabric;dur={fabric * 1e3:.2f}"
