"""A request with `tools` goes only to replicas whose engine turns them into tool calls."""

from __future__ import annotations

import json

from meshkit import MODEL, chat, gateway_kit

from opentela.engines.advertised import TOOL_CALLS
from opentela.engines.llamacpp import PROPS, props_settings
from opentela.engines.simulated import SimulatedConfig

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_llama_cpp_says_when_its_chat_template_has_no_tools() -> None:
    caps = {"chat_template_caps": {"supports_tool_calls": False, "supports_tools": False}}
    assert props_settings({PROPS: caps})[TOOL_CALLS] is False
    assert props_settings({PROPS: {"chat_template_caps": {"supports_tool_calls": True}}})[TOOL_CALLS] is True
    assert TOOL_CALLS not in props_settings({PROPS: {"chat_template_caps": {"supports_tool_calls": "yes"}}})
    assert TOOL_CALLS not in props_settings({PROPS: {}})


async def test_tools_for_a_model_no_engine_can_call_are_a_400_naming_tools() -> None:
    async with gateway_kit() as kit:
        await kit.replica("plain", settings={TOOL_CALLS: False})
        status, _, raw = await kit.post(chat(tools=[WEATHER]))
        err = json.loads(raw)["error"]
        assert (status, err["type"], err["param"]) == (400, "invalid_request_error", "tools")
        assert "tool" in err["message"] and kit.requests_seen("plain") == 0
        # Without tools, or with tool_choice "none", the same replica serves as before.
        assert (await kit.post(chat()))[0] == 200
        assert (await kit.post(chat(tools=[WEATHER], tool_choice="none")))[0] == 200
        assert kit.requests_seen("plain") == 2


async def test_tools_go_to_the_replicas_that_take_them() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("plain", settings={TOOL_CALLS: False})
        await kit.replica("unknown")  # says nothing: trusted to handle tools
        for _ in range(4):
            status, headers, _ = await kit.post(chat(tools=[WEATHER]))
            assert status == 200 and headers["X-Otela-Session"] == "s-unknown"
        assert kit.requests_seen("plain") == 0


async def test_a_broken_stream_with_tools_never_resumes_on_a_replica_without_them() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0))
        await kit.replica("plain", settings={TOOL_CALLS: False})
        assert kit.http is not None
        body = chat(max_tokens=5, stream=True, tools=[WEATHER])
        async with kit.http.post(kit.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            events = [line async for line in resp.content if line.startswith(b"data: ")]
        assert b"error" in events[-1]  # a's stream broke and no replica that takes tools was left
        assert kit.requests_seen("a") == 1 and kit.requests_seen("plain") == 0
