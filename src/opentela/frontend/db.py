"""The database: an async SQLAlchemy engine on SQLite or PostgreSQL, migrated to the newest schema on open."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from opentela.errors import ConfigError
from opentela.frontend.pg_calls import PostgresCalls
from opentela.frontend.schema import FrontendSetting

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_MIGRATION_LOCK = 0x07E1A  # PostgreSQL advisory lock: replicas starting together migrate one at a time


def async_url(url: str) -> str:
    """The URL with an async driver: sqlite -> sqlite+aiosqlite, postgresql -> postgresql+asyncpg."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL: {url!r} ({exc})") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ConfigError(f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://...")
    return parsed.render_as_string(hide_password=False)


def sqlite_url(path: Path) -> str:
    """A SQLite URL for a file path."""
    return f"sqlite:///{path}"


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """Set the pragmas every connection to the frontend's SQLite file uses."""
    # WAL with synchronous=NORMAL keeps every committed transaction across a process crash (kill -9); only a
    # power loss may drop the last few. busy_timeout lets a second process wait for the write lock.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def drop_closed_connection(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """Refuse a pooled PostgreSQL connection the server has closed (a restart, an idle timeout), so the pool opens
    a new one instead of failing the request.

    The driver learns of a close as soon as the server sends it, so asking the driver costs nothing; a ping per
    checkout (SQLAlchemy's pool_pre_ping) cost a round trip on every request's two database calls.
    """
    driver = getattr(dbapi_conn, "driver_connection", None)
    if driver is not None and driver.is_closed():
        raise DisconnectionError("the server closed this connection")


_SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def _private_sqlite_file(path: str) -> None:
    """Create the database file 0600 (in a 0700 directory when we create that too) before SQLite opens it.

    SQLite creates its -wal and -shm files with the mode of the database file, so they follow. A file an older
    version left readable by others is tightened, with a warning.
    """
    db = Path(path).expanduser()
    if not db.parent.exists():
        db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    for file in (db, *(db.with_name(db.name + s) for s in _SQLITE_COMPANIONS)):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:
                file.chmod(mode & 0o700)
                logger.warning(
                    "%s was readable by other users (mode %o); it is now %o", file, mode, mode & 0o700
                )
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            logger.warning("%s is readable by other users and cannot be tightened: %s", file, exc)


def _upgrade(connection: Connection) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "head")


class Database:
    """One engine and session factory; `await Database.open(url)` applies pending migrations first."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.postgres = PostgresCalls(engine) if engine.dialect.name == "postgresql" else None
        """On PostgreSQL, the hot path's calls (frontend/pg_calls.py), on connections of their own."""

    def __repr__(self) -> str:
        return f"<Database {self.engine.url.render_as_string(hide_password=True)}>"

    @property
    def dialect(self) -> str:
        """sqlite or postgresql."""
        return self.engine.dialect.name

    @classmethod
    async def open(cls, url: str, *, migrate: bool = True) -> Database:
        """Connect (creating a SQLite file's directory) and bring the schema to the newest revision."""
        full = async_url(url)
        parsed = make_url(full)
        kwargs: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                _private_sqlite_file(parsed.database)
        engine = create_async_engine(full, **kwargs)
        if engine.dialect.name == "sqlite":
            event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        else:
            event.listen(engine.sync_engine, "checkout", drop_closed_connection)
        db = cls(engine)
        if migrate:
            try:
                await db.migrate()
            except BaseException:
                await engine.dispose()
                raise
        return db

    async def migrate(self) -> None:
        """Apply every Alembic migration not yet applied (idempotent; safe for replicas starting together)."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
            await conn.run_sync(_upgrade)

    def session(self) -> AsyncSession:
        """A new session (use as `async with db.session() as s`)."""
        return self.sessions()

    async def aclose(self) -> None:
        """Close every pooled connection."""
        if self.postgres is not None:
            await self.postgres.aclose()
        await self.engine.dispose()


async def kept_setting(db: Database, name: str, fresh: Callable[[], str]) -> str:
    """The value of setting `name` kept in the database, created with `fresh()` on first use: replicas starting
    together race to insert, one wins, and every one reads the winner's value."""
    make = pg_insert if db.dialect == "postgresql" else sqlite_insert
    async with db.session() as s, s.begin():
        await s.execute(
            make(FrontendSetting)
            .values(name=name, value=fresh())
            .on_conflict_do_nothing(index_elements=[FrontendSetting.name])
        )
        value = await s.scalar(select(FrontendSetting.value).where(FrontendSetting.name == name))
    return str(value)
