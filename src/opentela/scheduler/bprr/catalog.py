"""BPRR inputs from the simulator's catalogs: a model's block and cache sizes, a device's per-block times."""

from __future__ import annotations

from opentela.scheduler import models
from opentela.scheduler.bprr.problem import ModelSpec, ServerSpec
from opentela.scheduler.hardware import Device
from opentela.scheduler.models import BYTES_PER_ELEMENT
from opentela.scheduler.roofline import Precision, layer_operators


def block_model(
    spec: models.ModelSpec, precision: Precision | None = None, *, input_len: int = 20, output_len: int = 128
) -> ModelSpec:
    """The BPRR view of a catalog model: L decoder blocks, s_m from the weight format, s_c from the KV format."""
    precision = precision or Precision()
    per_block = spec.attention_params + spec.mlp_params + 2 * spec.hidden_size  # two norms
    return ModelSpec(
        name=spec.name,
        n_blocks=spec.num_layers,
        block_bytes=round(per_block * BYTES_PER_ELEMENT[precision.weights]),
        cache_bytes_per_token=round(spec.kv_bytes_per_token(precision.kv_cache) / spec.num_layers),
        input_len=input_len,
        output_len=output_len,
        token_bytes=round(spec.hidden_size * BYTES_PER_ELEMENT[precision.activations]),
    )


def block_times(
    spec: models.ModelSpec, device: Device, precision: Precision, input_len: int, output_len: int
) -> tuple[float, float]:
    """Roofline seconds of one block: (decoding one token at a mid-session context, prefilling the input)."""
    context = input_len + output_len // 2
    decode = sum(op.time(device) for op in layer_operators(spec, decode=[context], precision=precision))
    prefill = sum(op.time(device) for op in layer_operators(spec, prefill=[input_len], precision=precision))
    return decode, prefill


def server_from_device(
    name: str,
    device: Device,
    spec: models.ModelSpec,
    model: ModelSpec,
    precision: Precision | None = None,
    mem_util: float = 0.9,
) -> ServerSpec:
    """A server on `device`: `mem_util` of its memory for blocks and caches, roofline per-block times."""
    decode, prefill = block_times(spec, device, precision or Precision(), model.input_len, model.output_len)
    return ServerSpec(name, int(device.memory_bytes * mem_util), decode, prefill, gpu=device.name)
