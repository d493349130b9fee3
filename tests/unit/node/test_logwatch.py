"""The fatal log watch: follows an engine log file and finds the lines that mean the engine is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opentela.errors import ConfigError
from opentela.node._config import DEFAULT_FATAL_LOG_PATTERNS
from opentela.node.logwatch import FatalLogWatch

FATAL = [
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600046 milliseconds before timing out.",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    "NCCL WARN Net : Connection to 10.0.0.2 timed out",
]
BENIGN = [
    "INFO 01-01 12:00:00 [api_server.py:1] vLLM API server version 0.9.0",
    "NCCL INFO NCCL_TIMEOUT set by environment to 1800",  # an env var name, not a timeout
    "NCCL INFO Channel 00/02 : 0 1",
    'INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as out:
        out.write(data)


@pytest.mark.parametrize("line", FATAL)
def test_default_patterns_catch_fatal_engine_lines(tmp_path: Path, line: str) -> None:
    watch = FatalLogWatch(tmp_path / "engine.log", DEFAULT_FATAL_LOG_PATTERNS)
    assert watch.match(line) is not None


@pytest.mark.parametrize("line", BENIGN)
def test_default_patterns_leave_ordinary_lines_alone(tmp_path: Path, line: str) -> None:
    watch = FatalLogWatch(tmp_path / "engine.log", DEFAULT_FATAL_LOG_PATTERNS)
    assert watch.match(line) is None


def test_scan_reads_only_new_complete_lines_from_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    header = b"=== otela starting engine x: x --log-line 'NCCL timeout'\n"
    log.write_bytes(header)
    watch = FatalLogWatch(log, DEFAULT_FATAL_LOG_PATTERNS, offset=len(header))
    assert watch.scan() is None  # the header (our own line, quoting the command) is never matched
    append(log, b"loading weights\nRuntimeError: CUDA err")
    assert watch.scan() is None  # an unfinished line waits for its end
    append(log, b"or: unspecified launch failure\nmore\n")
    assert watch.scan() == "RuntimeError: CUDA error: unspecified launch failure"
    assert watch.scan() is None


def test_final_scan_matches_an_unended_last_line(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"ok\nCUDA out of memory")
    watch = FatalLogWatch(log, DEFAULT_FATAL_LOG_PATTERNS)
    assert watch.scan() is None
    assert watch.scan(final=True) == "CUDA out of memory"


def test_truncated_log_is_read_again_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 100 + b"\n")
    watch = FatalLogWatch(log, ["boom"])
    assert watch.scan() is None
    log.write_bytes(b"BOOM\n")
    assert watch.scan() == "BOOM"  # case-insensitive, and the shorter file restarted the offset


def test_no_patterns_and_missing_file_find_nothing(tmp_path: Path) -> None:
    assert FatalLogWatch(tmp_path / "engine.log", []).scan() is None
    assert FatalLogWatch(tmp_path / "missing.log", ["x"]).scan() is None


def test_bad_pattern_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fatal log pattern '\(unclosed'"):
        FatalLogWatch(tmp_path / "engine.log", ["(unclosed"])


async def test_watch_returns_when_the_line_is_written(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    watch = FatalLogWatch(log, DEFAULT_FATAL_LOG_PATTERNS)
    task = asyncio.create_task(watch.watch(interval=0.01))
    await asyncio.sleep(0.05)
    assert not task.done()
    append(log, b"uncorrectable ECC error encountered\n")
    assert await asyncio.wait_for(task, 10) == "uncorrectable ECC error encountered"
