"""Chat and completions for a split model: the chain client runs the request from this ingress."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from opentela import openai_edge as edge
from opentela.errors import InvalidRequestError
from opentela.gateway.chain_client import ChainSession
from opentela.gateway.split_generation import (
    OpenAIShape,
    SplitGeneration,
    parse_request,
    stream_answer,
    whole_answer,
)
from opentela.gateway.state import REQUEST_ID_KEY, state_of
from opentela.gateway.trust import TRUST_HEADER, resolve_allowlist
from opentela.registry.record import NodeRecord

SPLIT_SECONDS_PER_TOKEN = 0.1
"""How long a session is expected to hold its servers' caches per token, until it says it is done."""


async def handle_split(request: web.Request, raw: bytes, model: str) -> web.StreamResponse:
    """Serve one OpenAI request for `model`, whose blocks are spread over block servers."""
    st = state_of(request)
    split = st.split
    kind = edge.INFERENCE_PATHS.get(request.path, "")
    if kind not in ("chat", "completions"):
        raise InvalidRequestError(
            f"{model} is split across block servers: it serves chat and completions only"
        )
    body = edge.parse_body(raw)
    raw_metadata = body.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    trusted = resolve_allowlist(
        request.headers.get(TRUST_HEADER), metadata.get("trusted_providers"), st.config.trusted_providers
    )
    assets = await split.assets(model)
    req = parse_request(kind, body, assets, st.config.max_output_tokens)
    max_length = len(req.prompt_ids) + req.max_tokens
    kv = assets.config.kv_bytes_per_token(1)
    request_id = request[REQUEST_ID_KEY]
    blocks: dict[str, int] = {}

    def choose(lo: int, hi: int, exclude: frozenset[str]) -> list[tuple[NodeRecord, int, int]]:
        links = split.choose(
            model,
            lo,
            hi,
            exclude,
            max_length=max_length,
            output_len=req.max_tokens,
            kv_bytes_per_token_block=kv,
            trusted=trusted,
        )
        blocks.update({r.session_id: end - first for r, first, end in links})
        return links

    session = ChainSession(
        model=model,
        n_blocks=assets.config.n_blocks,
        max_length=max_length,
        choose=choose,
        open_stream=st.mesh.open_block_stream,
        observe=lambda record, rt, compute: split.observe(
            record, rt, compute, blocks.get(record.session_id, 0)
        ),
        server_forwarding=st.config.split_forwarding == "server",
        connect_timeout=st.config.connect_timeout,
        step_timeout=st.config.split_step_timeout,
        max_failovers=st.config.split_max_failovers,
        request_id=request_id,
    )
    await session.open()
    hold = split.hold(
        ((h.record, h.first, h.end) for h in session.hops), max_length * SPLIT_SECONDS_PER_TOKEN
    )
    try:
        gen = SplitGeneration(split, model, assets, req, session)
        shape = OpenAIShape(model, req.chat)
        headers = dict.fromkeys(edge.ANSWER_ID_HEADERS, request_id) | {"X-Otela-Chain": session.describe()}
        if not req.stream:
            answer = await whole_answer(gen, shape)
            headers["X-Otela-Chain"] = session.describe()
            headers["Server-Timing"] = gen.server_timing()
            return web.Response(body=answer, headers=headers, content_type="application/json")
        headers.update({"Content-Type": edge.SSE_CONTENT_TYPE, "Cache-Control": "no-cache"})
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(request)
        try:
            await stream_answer(gen, shape, response.write)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; closing the session below frees the servers' caches
        return response
    finally:
        split.release(hold)
        await session.aclose()
