"""LiteLLM's proxy as a plain pass-through to one engine, installed into its own venv, for side-by-side figures.

LiteLLM and its dependencies go into `.bench-venv/` (gitignored) so they never mix with ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".bench-venv"
LITELLM = VENV / "bin" / "litellm"


def ensure_litellm() -> Path:
    """Install litellm[proxy] from PyPI into .bench-venv on first use; returns the `litellm` executable."""
    if LITELLM.exists():
        return LITELLM
    print("installing litellm[proxy] into .bench-venv (first run only)...", file=sys.stderr)
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "litellm[proxy]",
        ],
        check=True,
    )
    return LITELLM


def litellm_version() -> str:
    """The installed litellm version."""
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


@contextlib.asynccontextmanager
async def litellm_proxy(
    engine_base: str, model: str, port: int, workdir: Path
) -> AsyncIterator[tuple[str, str]]:
    """Run the proxy routing `model` to the OpenAI-compatible `engine_base` (…/v1); yields (base URL, key)."""
    exe = ensure_litellm()
    key = "sk-bench-" + secrets.token_hex(16)
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {engine_base}\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "general_settings:\n"
        f"  master_key: {key}\n"
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    log = open(workdir / "litellm.log", "wb")  # closed below
    proc = await asyncio.create_subprocess_exec(
        str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        stdout=log, stderr=log, env=env, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"litellm did not start; see {workdir / 'litellm.log'}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/health/liveliness") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.5)
        yield base + "/v1", key
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
