"""The simulator's prefix cache against llama.cpp's prompt cache in the real embedded engine.

The simulator counts a hit as the leading 16-token blocks a prompt shares with a cached one (chained hashes, as the
frontend records them); llama.cpp reuses the longest common token prefix of the prompt it holds in the slot. Both
must agree on how much of a prompt is skipped, to within the block granularity.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from opentela.engines.base import free_port
from opentela.frontend.prefix_hashes import salt_key, token_hashes
from opentela.scheduler.prefix_cache import BLOCK_TOKENS, PrefixCache

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    slots = tmp_path_factory.mktemp("slots")
    cmd = [sys.executable, "-m", "opentela", "engine", "embedded", "--port", str(port), "--parallel", "1"]
    proc = subprocess.Popen(
        [*cmd, "--threads", "2", "--slot-save-path", str(slots)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the embedded engine exited while starting"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the embedded engine did not become ready"
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def tokens(url: str, text: str) -> list[int]:
    return [int(t) for t in post(url, "/tokenize", {"content": text})["tokens"]]


def prefilled(url: str, prompt: str) -> int:
    """Prompt tokens llama.cpp computed (the rest came from its prompt cache)."""
    body = {"prompt": prompt, "n_predict": 1, "cache_prompt": True, "id_slot": 0}
    return int(post(url, "/completion", body)["timings"]["prompt_n"])


def text(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] + str((i + salt) % 13) for i in range(n_words))


KEY = salt_key("test")


@pytest.mark.parametrize(("prefix_words", "tail_words"), [(40, 10), (150, 30)])
def test_a_prefix_hit_skips_what_the_simulator_says(engine: str, prefix_words: int, tail_words: int) -> None:
    prefix, tail = text(prefix_words, prefix_words), text(tail_words, 1000 + tail_words)
    first, second = prefix, prefix + " " + tail
    cache = PrefixCache(capacity_blocks=1024)
    post(engine, "/slots/0?action=erase", {})
    assert prefilled(engine, first) == len(tokens(engine, first))  # a cold slot computes everything
    cache.insert(token_hashes(KEY, tokens(engine, first)))
    ids = tokens(engine, second)
    computed = prefilled(engine, second)
    simulated_cached = cache.match(token_hashes(KEY, ids)) * BLOCK_TOKENS
    reused = len(ids) - computed
    # llama.cpp reuses the whole common prefix (at most one token short: it re-evaluates the last one);
    # the simulator the whole blocks of it.
    assert simulated_cached <= reused + 1 < simulated_cached + BLOCK_TOKENS + 1
    assert simulated_cached > 0 and computed < len(ids)


def test_after_an_erase_or_another_prompt_nothing_is_reused(engine: str) -> None:
    prompt = text(60, 3)
    cache = PrefixCache(capacity_blocks=1024)
    post(engine, "/slots/0?action=erase", {})
    prefilled(engine, prompt)
    cache.insert(token_hashes(KEY, tokens(engine, prompt)))
    other = text(60, 4)  # shares no leading token with `prompt`
    assert cache.match(token_hashes(KEY, tokens(engine, other))) == 0
    assert prefilled(engine, other) == len(tokens(engine, other))
    erased = post(engine, "/slots/0?action=erase", {})
    assert erased["n_erased"] > 0
    assert prefilled(engine, prompt) == len(tokens(engine, prompt))
    assert PrefixCache(0).match(token_hashes(KEY, tokens(engine, prompt))) == 0
