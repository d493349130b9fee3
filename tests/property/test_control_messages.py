"""Any map arriving on /otela/control/1 becomes an assignment or a refusal with a known code, nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opentela.fabric.identity import Identity
from opentela.node.control import Refusal, parse_assignment

CONTROLLER = Identity.generate().peer_id


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["op", "model", "command", "engine", "options", "tp", "gpus", "device"]),
        st.one_of(
            st.none(),
            st.integers(-3, 9),
            st.text(max_size=20),
            st.lists(st.one_of(st.integers(-2, 9), st.text(max_size=12)), max_size=4),
            st.dictionaries(st.text(max_size=8), st.integers(), max_size=2),
        ),
    )
)
def test_any_message_is_an_assignment_or_a_refusal(message: dict[str, Any]) -> None:
    try:
        parse_assignment(message, CONTROLLER)
    except Refusal as refusal:
        assert refusal.code in ("bad_request", "bad_template")
