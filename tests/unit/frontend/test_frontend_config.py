"""The frontend's data directory and database URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.config import data_home, load_config
from opentela.errors import ConfigError
from opentela.frontend.db import async_url


def test_data_home_follows_xdg() -> None:
    assert data_home({"XDG_DATA_HOME": "/srv/data"}) == Path("/srv/data/opentela")
    assert data_home({}) == Path.home() / ".local" / "share" / "opentela"


def test_database_urls_get_async_drivers() -> None:
    assert async_url("sqlite:////tmp/f.db") == "sqlite+aiosqlite:////tmp/f.db"
    assert async_url("postgresql://u:p@h:5/d") == "postgresql+asyncpg://u:p@h:5/d"
    assert async_url("postgres://u@h/d") == "postgresql+asyncpg://u@h/d"
    for bad, needle in (("mysql://x/y", "unsupported database"), ("not a url", "not a database URL")):
        with pytest.raises(ConfigError, match=needle):
            async_url(bad)


def test_frontend_settings_from_environment() -> None:
    config = load_config(
        None, env={"OTELA_FRONTEND_DB": "postgresql://u@h/d", "OTELA_FRONTEND_ENABLED": "yes"}
    )
    assert config.frontend.db == "postgresql://u@h/d" and config.frontend.enabled
