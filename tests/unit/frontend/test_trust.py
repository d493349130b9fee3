"""The trust allowlist a key sends to the gateway: the key's default, narrowed but never widened by the client."""

from __future__ import annotations

import pytest

from opentela.errors import InvalidRequestError
from opentela.frontend.routes.openai import trusted_providers
from opentela.frontend.schema import ApiKey


def test_key_default_client_narrowing_and_refusal() -> None:
    open_key, lab_key = ApiKey(trusted_providers=None), ApiKey(trusted_providers=["lab-a", "lab-b"])
    assert trusted_providers(open_key, None) is None
    assert trusted_providers(open_key, "x, y") == ["x", "y"]
    assert trusted_providers(lab_key, None) == ["lab-a", "lab-b"]
    assert trusted_providers(lab_key, "lab-b,elsewhere") == ["lab-b"]
    with pytest.raises(InvalidRequestError, match="none of the providers"):
        trusted_providers(lab_key, "elsewhere")
