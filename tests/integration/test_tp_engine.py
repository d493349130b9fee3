"""The tensor-parallel engine as a user runs it: `otela engine tp` processes, the OpenAI SDK, SIGKILLed ranks.

The reference is the same NumPy code with every unit in this process (`TensorParallelReference`): the prompt in one
chunk, then one token per step. At TP1, TP2 (non-uniform: SmolLM2's 3 KV heads over 2 ranks, one head replicated
with hybrid attention) and TP3 the engine must produce its tokens exactly; after ranks are killed mid-stream, the
streams must finish with exactly those tokens too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from opentela.engines.base import free_port
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.model.tensor_parallel import TensorParallelReference
from opentela.model.tokenizer import GGUFTokenizer

pytestmark = pytest.mark.integration

PROMPTS = [
    "The tallest mountain on Earth is",
    "def quicksort(items):",
    "Long ago, beyond the northern hills,",
    "The chemical symbol for gold is",
    "A balanced breakfast includes",
    "for i in range(10):\n",
    "The Pacific Ocean is",
    "Albert Einstein was born in",
    "Roses are red,",
    "The capital of Japan is",
    "To change a flat tyre, you",
    "CREATE TABLE orders (",
    "The German word for dog is",
    "Plants need sunlight because",
    "2, 4, 8, 16,",
    "The best way to learn a language is",
    "Sound travels at",
    "Dear customer, we regret",
    "Go and Java differ in",
    "The human heart has",
]
NEW_TOKENS = 8
LONG_TOKENS = 24
LONG = 4
"""The first prompts run to LONG_TOKENS in the failure test (their first NEW_TOKENS are the short answer too)."""


def reference_tokens() -> dict[str, list[int]]:
    """Prompt -> the reference's tokens (LONG_TOKENS for the first LONG prompts, NEW_TOKENS for the others)."""
    reference = TensorParallelReference(default_model_path())
    tok = tokenizer()
    return {
        prompt: reference.generate(tok.encode(prompt), LONG_TOKENS if i < LONG else NEW_TOKENS)
        for i, prompt in enumerate(PROMPTS)
    }


@pytest.fixture(scope="module")
def expected() -> Iterator[Future[dict[str, list[int]]]]:
    """The reference, computed in a thread (NumPy lets go of the GIL) while the first engine starts and serves."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(reference_tokens)


def tokenizer() -> GGUFTokenizer:
    return GGUFTokenizer(default_model_path())


def text_of(tokens: list[int], n: int) -> str:
    """What the API answers for the first `n` of `tokens`: text up to the first stop token."""
    tok = tokenizer()
    stops = set(tok.stop_token_ids)
    cut = next((j for j, t in enumerate(tokens[:n]) if t in stops), min(n, len(tokens)))
    return tok.decode(tokens[:cut])


class TPEngine:
    """An `otela engine tp` process on a free loopback port."""

    def __init__(self, ranks: int, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "opentela",
            "engine",
            "tp",
            "--ranks",
            str(ranks),
            "--port",
            str(self.port),
        ]
        self._out = log.open("wb")
        self.process = subprocess.Popen([*argv, *extra], stdout=self._out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                self.get("/v1/models")
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the tp engine did not start:\n{log.read_text()}") from None
                time.sleep(0.3)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=300)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def complete(self, prompt: str, max_tokens: int) -> str:
        answer = self.client.completions.create(
            model=SMOLLM2_ID, prompt=prompt, max_tokens=max_tokens, temperature=0
        )
        return answer.choices[0].text

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()


class Engines:
    """The module's engines by degree, started on first use: the failure tests go on with the exactness tests'
    engines instead of paying for another start."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[int, TPEngine] = {}

    def get(self, ranks: int) -> TPEngine:
        if ranks not in self.running:
            self.running[ranks] = TPEngine(ranks, self.logs / f"tp{ranks}.log")
        return self.running[ranks]

    def stop(self, ranks: int) -> None:
        engine = self.running.pop(ranks, None)
        if engine is not None:
            engine.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    started = Engines(tmp_path_factory.mktemp("tp-engines"))
    yield started
    for ranks in list(started.running):
        started.stop(ranks)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_greedy_tokens_equal_the_one_process_reference(
    ranks: int, expected: Future[dict[str, list[int]]], engines: Engines
) -> None:
    engine = engines.get(ranks)
    models = engine.get("/v1/models")["data"][0]
    assert models["otela"]["tp_degree"] == ranks
    assert models["otela"]["replica_state"] == "serving"
    placement = engine.get("/v1/tp")["placement"]
    if ranks == 2:
        assert "replicated heads [2]" in placement  # 3 KV heads on 2 ranks: hybrid attention
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda p: engine.complete(p, NEW_TOKENS), PROMPTS))
    want = [text_of(expected.result()[p], NEW_TOKENS) for p in PROMPTS]
    if ranks == 1:
        engines.stop(1)
    assert answers == want


def _stream(engine: TPEngine, prompt: str, progress: list[int], index: int) -> str:
    pieces = []
    stream = engine.client.completions.create(
        model=SMOLLM2_ID, prompt=prompt, max_tokens=LONG_TOKENS, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            pieces.append(chunk.choices[0].text)
            progress[index] += 1
    return "".join(pieces)


def test_killed_ranks_mid_stream_lose_no_token(
    expected: Future[dict[str, list[int]]], engines: Engines
) -> None:
    engine = engines.get(3)
    pids = {int(k): v for k, v in engine.get("/v1/tp")["rank_pids"].items()}
    prompts = PROMPTS[:LONG]
    progress = [0] * LONG
    with ThreadPoolExecutor(LONG) as pool:
        futures = [pool.submit(_stream, engine, p, progress, i) for i, p in enumerate(prompts)]
        # First loss: TP3 -> TP2 (non-uniform, hybrid attention) after a few tokens of every stream.
        while min(progress) < 3 and not all(f.done() for f in futures):
            time.sleep(0.02)
        os.kill(pids[1], signal.SIGKILL)
        # Second loss: TP2 -> TP1, later in the same streams.
        while min(progress) < 10 and not all(f.done() for f in futures):
            time.sleep(0.02)
        os.kill(pids[0], signal.SIGKILL)
        texts = [f.result(timeout=300) for f in futures]
    assert texts == [text_of(expected.result()[p], LONG_TOKENS) for p in prompts]
    status = engine.get("/v1/tp")
    assert [(r["degree_before"], r["degree_after"]) for r in status["recoveries"]] == [(3, 2), (2, 1)]
    assert all(r["mode"] == "backup" and r["kv_tokens"] > 0 for r in status["recoveries"])
    entry = engine.get("/v1/models")["data"][0]["otela"]
    assert (entry["tp_degree"], entry["tp_ranks"], entry["replica_state"]) == (1, "2", "serving")
    # The replica still serves new requests on its last rank.
    assert engine.complete(PROMPTS[5], NEW_TOKENS) == text_of(expected.result()[PROMPTS[5]], NEW_TOKENS)


def test_bad_requests_get_openai_errors_and_last_rank_loss_ends_the_engine(engines: Engines) -> None:
    engine = engines.get(2)
    with pytest.raises(openai.BadRequestError) as bad:
        engine.client.completions.create(model=SMOLLM2_ID, prompt="hi", max_tokens=-3)
    assert "max_tokens" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        engine.client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        engine.client.chat.completions.create(model=SMOLLM2_ID, messages=[], max_tokens=2)
    for pid in engine.get("/v1/tp")["rank_pids"].values():
        os.kill(pid, signal.SIGKILL)
    # With no rank left the engine exits non-zero, so the node supervising it fails over.
    assert engine.process.wait(timeout=30) != 0
