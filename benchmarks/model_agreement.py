"""How closely our NumPy forward of SmolLM2 follows llama.cpp's: next-token agreement under teacher forcing.

For each fixed chat prompt, the embedded llama.cpp engine generates `--tokens` tokens greedily; we then run the
prompt plus those tokens through `opentela.model` in one chunk and count the positions where our argmax is the
token llama.cpp chose. llama.cpp is asked to ignore end-of-generation tokens (so every prompt yields the same
number of positions); it does that by banning them, so our argmax bans the same tokens. llama.cpp multiplies
Q4_1 weights with activations rounded to 8 bits and we use float32 throughout, so near-ties may break the
other way; the margins of the disagreements show how near. Also checks that our tokenizer encodes every
prompt exactly as llama.cpp's /tokenize does.

Prints JSON; with --out DIR also writes DIR/model_agreement.{json,md}.

    python benchmarks/model_agreement.py [--tokens 64] [--threads 2] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from opentela.engines.base import EngineSpec, free_port
from opentela.model.local import LocalPipeline
from opentela.model.locate import default_model_path
from opentela.model.tokenizer import GGUFTokenizer
from opentela.node.supervisor import EngineSupervisor

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers greater than 100.",
    "How do I reverse a list in Python?",
    "What is 17 times 23?",
    "Tell me a short story about a robot.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "Give me a recipe for pancakes.",
    "What are the planets of the solar system?",
    "Describe the water cycle.",
    "Who wrote Romeo and Juliet?",
    "Summarize the plot of Cinderella.",
    "What is machine learning?",
    "Name five fruits that are red.",
    "How does a bicycle work?",
    "Write a limerick about a cat.",
    "What is the boiling point of water in Fahrenheit?",
    "Suggest a name for a coffee shop.",
]
ENGINE = "import sys; from opentela.engines.embedded import main; main(sys.argv[1:])"


@contextlib.asynccontextmanager
async def llamacpp_server(threads: int, workdir: Path) -> AsyncIterator[str]:
    """The embedded llama.cpp engine in its own process, serving on a free port; yields its base URL."""
    port = free_port()
    argv = [sys.executable, "-c", ENGINE, "--port", str(port), "--threads", str(threads), "--parallel", "1"]
    spec = EngineSpec("embedded", argv, port=port, ready_timeout=60)
    async with EngineSupervisor(spec, workdir / "llamacpp.log", poll_interval=0.1) as sup:
        await sup.wait_ready()
        yield spec.base_url
        await sup.stop(timeout=10)


async def llamacpp_tokenize(http: aiohttp.ClientSession, url: str, text: str) -> list[int]:
    """llama.cpp's token ids for `text` (special tokens parsed, no bos added, as for a prompt)."""
    async with http.post(f"{url}/tokenize", json={"content": text}) as resp:
        resp.raise_for_status()
        tokens: list[int] = (await resp.json())["tokens"]
        return tokens


async def llamacpp_reference(
    texts: list[str], tokens: int, threads: int, workdir: Path
) -> tuple[list[list[int]], list[list[int]]]:
    """llama.cpp's tokens for each prompt text and its greedy continuation of `tokens` tokens."""
    prompt_ids, generated = [], []
    async with (
        llamacpp_server(threads, workdir) as url,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
    ):
        for text in texts:
            prompt_ids.append(await llamacpp_tokenize(http, url, text))
            body = {
                "prompt": text,
                "n_predict": tokens,
                "temperature": 0,
                "ignore_eos": True,
                "return_tokens": True,
                "cache_prompt": False,
            }
            async with http.post(f"{url}/completion", json=body) as resp:
                resp.raise_for_status()
                generated.append((await resp.json())["tokens"])
    return prompt_ids, generated


def teacher_forced(
    pipe: LocalPipeline, prompt: list[int], continuation: list[int], banned: list[int]
) -> tuple[int, list[float]]:
    """Positions of `continuation` where our argmax (with `banned` tokens excluded) agrees; margins of misses."""
    hidden = pipe.last_hidden(prompt + continuation[:-1])
    logits = pipe.head.logits(hidden[len(prompt) - 1 :])
    logits[:, banned] = -np.inf
    ours = logits.argmax(axis=-1)
    theirs = np.asarray(continuation)
    misses = np.nonzero(ours != theirs)[0]
    margins = [float(logits[i, ours[i]] - logits[i, theirs[i]]) for i in misses]
    return len(continuation) - len(misses), margins


async def measure(tokens: int = 64, threads: int = 2, prompts: list[str] | None = None) -> dict[str, Any]:
    """Run llama.cpp and our pipeline on the prompts; the agreement figures as a dict."""
    path = default_model_path()
    tok = GGUFTokenizer(path)
    texts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in prompts or PROMPTS]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="otela-agreement-") as tmp:
        theirs_prompts, continuations = await llamacpp_reference(texts, tokens, threads, Path(tmp))
    llama_s = time.perf_counter() - began
    pipe = LocalPipeline(path, splits=[(0, 30)])
    ours_prompts = [tok.encode(t) for t in texts]
    agree, positions, margins, per_prompt = 0, 0, [], []
    began = time.perf_counter()
    for prompt, continuation in zip(ours_prompts, continuations, strict=True):
        hits, missed = teacher_forced(pipe, prompt, continuation, list(tok.stop_token_ids))
        agree, positions = agree + hits, positions + len(continuation)
        margins += missed
        per_prompt.append(hits / len(continuation))
    ours_s = time.perf_counter() - began
    return {
        "benchmark": "model_agreement",
        "model": path.name,
        "prompts": len(texts),
        "tokens_per_prompt": tokens,
        "positions": positions,
        "agreeing": agree,
        "agreement": agree / positions,
        "worst_prompt_agreement": min(per_prompt),
        "tokenizer_matches": sum(a == b for a, b in zip(ours_prompts, theirs_prompts, strict=True)),
        "miss_margin_logits_median": statistics.median(margins) if margins else 0.0,
        "miss_margin_logits_max": max(margins, default=0.0),
        "llamacpp_s": round(llama_s, 2),
        "numpy_s": round(ours_s, 2),
        "threads": threads,
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}",
    }


def write(result: dict[str, Any], out: Path) -> None:
    """DIR/model_agreement.json and a short Markdown summary beside it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "model_agreement.md").write_text(
        "# NumPy blocks vs llama.cpp: next-token agreement\n\n"
        f"`benchmarks/model_agreement.py`: {result['prompts']} chat prompts, {result['tokens_per_prompt']} greedy "
        f"llama.cpp tokens each, teacher-forced through `opentela.model`.\n\n"
        f"- argmax agreement: **{result['agreement']:.1%}** ({result['agreeing']}/{result['positions']}), "
        f"worst prompt {result['worst_prompt_agreement']:.1%}\n"
        f"- disagreements are near-ties: median margin {result['miss_margin_logits_median']:.3f} logits\n"
        f"- tokenizer: {result['tokenizer_matches']}/{result['prompts']} prompts encode exactly as llama.cpp's\n"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse flags, measure, print JSON (and write files with --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--out", type=Path, help="folder for model_agreement.{json,md} (default: print only)")
    args = parser.parse_args(argv)
    print(
        f"generating {len(PROMPTS)} x {args.tokens} tokens with llama.cpp, then teacher forcing",
        file=sys.stderr,
    )
    result = asyncio.run(measure(args.tokens, args.threads))
    print(json.dumps(result, indent=2))
    if args.out:
        write(result, args.out)


if __name__ == "__main__":
    main()
