"""Structured logging for the `otela` processes: key=value text or JSON lines, set up only by main()."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field

from opentela.errors import ConfigError

FORMATS = ("text", "json")


@dataclass(frozen=True)
class LogConfig:
    """How an `otela` process logs: read once with the rest of the configuration (`[log]`, OTELA_LOG_*)."""

    level: str = field(
        default="INFO", metadata={"help": "Lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL."}
    )
    format: str = field(
        default="text",
        metadata={"help": "`text`: one key=value line per record; `json`: one JSON object per line."},
    )

    def __post_init__(self) -> None:
        if not isinstance(logging.getLevelName(self.level.upper()), int):
            raise ConfigError(f"log level {self.level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        if self.format not in FORMATS:
            raise ConfigError(f"log format {self.format!r}: use text or json")


_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extra:
            line += f" [{extra}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        obj.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


def setup_logging(config: LogConfig) -> None:
    """Install one stderr handler on the root logger, as `config` says."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if config.format == "json" else _KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
    # aiohttp's access log is ours to format; keep its noisy server internals at WARNING.
    logging.getLogger("aiohttp.server").setLevel(logging.WARNING)
