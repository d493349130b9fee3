"""Server-sent event splitting, usage extraction and token estimates."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from opentela.frontend.token_counts import (
    SseEvents,
    chunk_text,
    event_data,
    sampling_params,
    usage_from,
)
from opentela.openai_edge import estimate_input_tokens

EVENTS = st.lists(
    st.dictionaries(st.sampled_from(["a", "b", "choices"]), st.text(max_size=20), max_size=3), max_size=8
)


@given(EVENTS, st.lists(st.integers(1, 40), min_size=1, max_size=20))
def test_events_survive_any_chunking(payloads: list[dict], cuts: list[int]) -> None:
    wire = b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    splitter, got, i = SseEvents(), [], 0
    for n in cuts * (len(wire) // max(1, sum(cuts)) + 1):
        if i >= len(wire):
            break
        got += splitter.feed(wire[i : i + n])
        i += n
    got += splitter.feed(wire[i:])
    assert [event_data(e) for e in got] == [*payloads, "[DONE]"]
    assert b"".join(got) == wire and splitter.rest() == b""


def test_usage_and_text_of_chunks() -> None:
    assert usage_from({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == (3, 4)
    assert usage_from({"usage": None}) is None and usage_from("x") is None
    assert chunk_text({"choices": [{"delta": {"content": "Hel"}}, {"delta": {"content": "lo"}}]}) == "Hello"
    assert chunk_text({"choices": [{"text": "abc"}]}) == "abc"
    assert event_data(b"data: not json\n\n") is None and event_data(b": comment\n\n") is None


def test_estimates_and_sampling_params() -> None:
    chat = {
        "messages": [{"role": "user", "content": "a" * 40}],
        "temperature": 0.2,
        "max_tokens": 9,
        "x": "y",
    }
    assert estimate_input_tokens(chat) == 10 + 4
    assert estimate_input_tokens({"prompt": "abcd"}) == 1
    assert estimate_input_tokens({"input": ["ab", "cd"]}) == 2
    assert sampling_params(chat) == {"temperature": 0.2, "max_tokens": 9}
