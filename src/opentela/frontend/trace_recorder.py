"""What only the trace needs of a request, written after its answer went out: the prompt's prefix hashes
(frontend/prefix_hashes.py) and whether the answer reasoned.

Nothing here is on a request's path. The route hands the request over once its response was sent; one thread
tokenizes and hashes whatever has queued, and the results are written together, at most once a second, in a
transaction of their own beside the usage writer's group commits (a completion never waits for one). The queue is
bounded: under a flood the excess goes unhashed (counted in `dropped`), the requests themselves are unaffected.
Keys that opted out of the trace (`log_content` false) have no hashes computed or stored.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from opentela.errors import ConfigError
from opentela.frontend.db import Database
from opentela.frontend.group_commit import UsageWriter
from opentela.frontend.prefix_hashes import PromptTokenizer, pack, prompt_hashes, salt_key
from opentela.frontend.schema import FrontendSetting, UsageRow
from opentela.frontend.usage import Admission
from opentela.model.locate import SMOLLM2_ID, default_model_path

logger = logging.getLogger(__name__)

PREFIX_MODES = ("auto", "bytes", "off")
SALT_SETTING = "trace_salt"
MAX_QUEUED = 1024
"""Requests waiting to be hashed; more are left unhashed."""
MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Request bodies waiting to be hashed, in bytes; more are left unhashed."""
WRITE_EVERY_S = 1.0


async def trace_salt(db: Database, configured: str = "") -> str:
    """The configured salt, else the one kept in the database (created on first use, once for all replicas)."""
    if configured:
        return configured
    make = pg_insert if db.dialect == "postgresql" else sqlite_insert
    new = make(FrontendSetting).values(name=SALT_SETTING, value=secrets.token_hex(32))
    async with db.session() as s, s.begin():
        # Replicas starting together: one insert wins, every one reads the winner's salt.
        await s.execute(new.on_conflict_do_nothing(index_elements=[FrontendSetting.name]))
        return str(
            (
                await s.execute(select(FrontendSetting.value).where(FrontendSetting.name == SALT_SETTING))
            ).scalar_one()
        )


_loaded: dict[str, PromptTokenizer | None] = {}
_loading = threading.Lock()


def shipped_tokenizer(model: str) -> PromptTokenizer | None:
    """The tokenizer of `model` where the frontend has one: SmolLM2's, read from its GGUF once per process (a few
    seconds); None for every other model, or when the GGUF is not installed."""
    if model.rsplit("/", 1)[-1] != SMOLLM2_ID:
        return None
    with _loading:
        if SMOLLM2_ID not in _loaded:
            # Imported here: the tokenizer's libraries load only in a frontend that meets the model.
            from opentela.model.tokenizer import GGUFTokenizer

            try:
                _loaded[SMOLLM2_ID] = GGUFTokenizer(default_model_path())
            except (ConfigError, OSError, ValueError) as exc:
                logger.warning("no tokenizer for %s (%s); its prefix hashes cut bytes instead", model, exc)
                _loaded[SMOLLM2_ID] = None
        return _loaded[SMOLLM2_ID]


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One answered request: its row, and its body when its key lets it into the trace."""

    row_id: str
    model: str
    endpoint: str
    body: dict[str, Any] | None
    """None: the key opted out; only `reasoning` is written."""
    size: int
    """Bytes of the body this job holds on to (its request's size)."""
    reasoning: bool | None


_SET_DETAILS = (
    update(UsageRow)
    .where(UsageRow.id == bindparam("b_row_id"))
    .values(prefix_hashes=bindparam("b_prefix_hashes"), reasoning=bindparam("b_reasoning"))
)


def _write_details(conn: Connection, rows: list[dict[str, Any]]) -> None:
    conn.execute(_SET_DETAILS, rows)


class TraceRecorder:
    """Hashes answered requests' prompts in a thread of its own and writes the trace details to their rows."""

    def __init__(
        self,
        writer: UsageWriter,
        salt: str,
        mode: str = "auto",
        *,
        tokenizer_for: Callable[[str], PromptTokenizer | None] = shipped_tokenizer,
        write_every_s: float = WRITE_EVERY_S,
    ) -> None:
        if mode not in PREFIX_MODES:
            raise ConfigError(
                f"frontend.prefix_hashes must be one of {', '.join(PREFIX_MODES)}, not {mode!r}"
            )
        self.writer, self.mode = writer, mode
        self._key = salt_key(salt)
        self._tokenizer_for = tokenizer_for
        self.write_every_s = write_every_s
        self._jobs: list[TraceJob] = []
        self._queued_bytes = 0
        self._ready: list[dict[str, Any]] = []
        self._worker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._hurry = 0
        """Callers of flush() waiting: write without waiting for the next write time."""
        self._written_at = 0.0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="trace-hasher")
        self.dropped = 0
        """Requests left unhashed because the queue was full."""
        self.written = 0
        """Rows given their trace details."""

    def __repr__(self) -> str:
        return f"<TraceRecorder {self.mode} queued={len(self._jobs)} written={self.written} dropped={self.dropped}>"

    async def after_response(
        self, admission: Admission, endpoint: str, body: dict[str, Any] | None, size: int
    ) -> None:
        """Queue an answered request (run as the response's background task, once its last byte went out)."""
        held = size if body is not None else 0
        self.submit(TraceJob(admission.row_id, admission.model, endpoint, body, held, admission.reasoning))

    def submit(self, job: TraceJob) -> bool:
        """Queue `job`; False when the queue is full and it is dropped."""
        if job.body is None and job.reasoning is None:
            return True  # nothing to write
        if len(self._jobs) >= MAX_QUEUED or self._queued_bytes + job.size > MAX_QUEUED_BYTES:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                logger.warning(
                    "trace hashing is behind: %d requests left without prefix hashes", self.dropped
                )
            return False
        self._jobs.append(job)
        self._queued_bytes += job.size
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain(), name="trace-recorder")
        return True

    async def flush(self) -> None:
        """Hash and write everything queued so far, without waiting for the next write time."""
        self._hurry += 1
        self._wake.set()
        try:
            while self._worker is not None and not self._worker.done():
                await asyncio.shield(self._worker)
        finally:
            self._hurry -= 1

    async def aclose(self) -> None:
        """Flush, then stop the hashing thread."""
        await self.flush()
        self._thread.shutdown(wait=True)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._jobs or self._ready:
            jobs, self._jobs, self._queued_bytes = self._jobs, [], 0
            if jobs:
                self._ready.extend(await loop.run_in_executor(self._thread, self._details, jobs))
            wait = self._written_at + self.write_every_s - time.monotonic()
            if wait > 0 and not self._hurry:
                # Let what arrives meanwhile share the write; flush() cuts the wait short.
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass
                if self._jobs:
                    continue
            rows, self._ready = self._ready, []
            self._written_at = time.monotonic()
            if rows:
                await self._write(rows)

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        try:
            await self.writer.transaction(_write_details, rows)
        except Exception as exc:  # trace details are best effort: the rows and their counts are already there
            logger.warning("could not write the trace details of %d requests: %s", len(rows), exc)
            return
        self.written += len(rows)

    def _details(self, jobs: list[TraceJob]) -> list[dict[str, Any]]:
        """In the hashing thread: each job's column values."""
        out = []
        for job in jobs:
            hashes = None
            if job.body is not None and self.mode != "off":
                try:
                    tokenizer = self._tokenizer_for(job.model) if self.mode == "auto" else None
                    hashes = prompt_hashes(job.endpoint, job.body, self._key, tokenizer)
                except Exception:  # a bug here must not stop the hashing of the requests after it
                    logger.exception("could not hash the prompt of usage row %s", job.row_id)
            if hashes is None and job.reasoning is None:
                continue
            out.append(
                {
                    "b_row_id": job.row_id,
                    "b_prefix_hashes": pack(hashes) if hashes else None,
                    "b_reasoning": job.reasoning,
                }
            )
        return out
