"""The real SmolLM2 GGUF, loaded once per test session (dequantizing 30 blocks takes a few seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.model.blocks import BlockStack
from opentela.model.head import ClientHead
from opentela.model.local import LocalPipeline
from opentela.model.locate import default_model_path
from opentela.model.tokenizer import GGUFTokenizer


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def pipeline(model_path: Path) -> LocalPipeline:
    """All 30 blocks in one stack."""
    return LocalPipeline(model_path, splits=[(0, 30)])


@pytest.fixture(scope="session")
def head(pipeline: LocalPipeline) -> ClientHead:
    return pipeline.head


@pytest.fixture(scope="session")
def stack(pipeline: LocalPipeline) -> BlockStack:
    return pipeline.stacks[0]


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> GGUFTokenizer:
    return GGUFTokenizer(model_path)
