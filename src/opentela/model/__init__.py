"""NumPy forward of LLaMA-family decoder blocks from GGUF weights, for split (pipeline-parallel) serving."""

from opentela.model.backend import Backend, NumpyBackend, get_backend
from opentela.model.blocks import BlockStack
from opentela.model.config import ModelConfig
from opentela.model.head import ClientHead
from opentela.model.kv_cache import CacheFull, CacheLayout, CacheStore, SessionCache, UnknownSession
from opentela.model.local import LocalPipeline
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.model.sampling import GREEDY, SamplingParams, greedy, sample
from opentela.model.tokenizer import GGUFTokenizer, StreamDecoder

__all__ = [
    "GREEDY",
    "SMOLLM2_ID",
    "Backend",
    "BlockStack",
    "CacheFull",
    "CacheLayout",
    "CacheStore",
    "ClientHead",
    "GGUFTokenizer",
    "LocalPipeline",
    "ModelConfig",
    "NumpyBackend",
    "SamplingParams",
    "SessionCache",
    "StreamDecoder",
    "UnknownSession",
    "default_model_path",
    "get_backend",
    "greedy",
    "sample",
]
