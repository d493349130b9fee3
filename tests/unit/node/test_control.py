"""The node's side of /otela/control/1: who may assign, what a valid assignment is, the answers on the wire."""

from __future__ import annotations

from typing import Any

import pytest

from opentela._types import PROTO_CONTROL
from opentela.fabric.identity import Identity
from opentela.fabric.memory import memory_stream_pair
from opentela.fabric.messages import read_msg, write_msg
from opentela.node.control import ControlService, EngineAssignment, Refusal, parse_assignment, render_template
from sim_engine_process import SIMULATED_TEMPLATE

CONTROLLER = Identity.generate().peer_id
STRANGER = Identity.generate().peer_id
SIMULATED = SIMULATED_TEMPLATE


def assign(**fields: Any) -> dict[str, Any]:
    return {"op": "assign", "model": "m", "command": SIMULATED, **fields}


def test_placeholders_fill_each_argument_and_never_add_arguments() -> None:
    argv = render_template(
        "serve {model} --tp {tp} --devices={gpus}", {"model": "a b; rm -rf /", "tp": "2", "gpus": "0,1"}
    )
    assert argv == ["serve", "a b; rm -rf /", "--tp", "2", "--devices=0,1"]
    with pytest.raises(Refusal) as refusal:
        render_template("serve {modle}", {"model": "m"})
    assert refusal.value.code == "bad_template" and "{modle}" in str(refusal.value)


def test_a_command_template_becomes_an_engine_on_a_free_port() -> None:
    a = parse_assignment(assign(gpus=[2, 3], tp=2), CONTROLLER)
    assert a.spec.name == "simulated" and a.tp == 2 and a.gpus == (2, 3)
    assert str(a.spec.port) in a.spec.argv and "m" in a.spec.argv
    assert a.spec.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    cpu = parse_assignment(assign(), CONTROLLER)
    assert "CUDA_VISIBLE_DEVICES" not in cpu.spec.env


def test_an_engine_name_with_options_is_built_by_its_adapter() -> None:
    a = parse_assignment(
        {"op": "assign", "model": "m", "engine": "simulated", "options": {"ttft_ms": 5}}, CONTROLLER
    )
    assert a.spec.name == "simulated" and "--ttft-ms" in a.spec.argv
    with pytest.raises(Refusal) as refusal:
        parse_assignment(
            {"op": "assign", "model": "m", "engine": "simulated", "options": {"bogus": 1}}, CONTROLLER
        )
    assert refusal.value.code == "bad_template"


@pytest.mark.parametrize(
    "message, code",
    [
        ({"op": "unassign"}, "bad_request"),
        (assign(model=""), "bad_request"),
        (assign(gpus=[-1]), "bad_request"),
        (assign(tp=0), "bad_request"),
        ({"op": "assign", "model": "m"}, "bad_request"),
        (assign(command=[]), "bad_template"),
        (assign(command=7), "bad_template"),
        (assign(command="my-server --listen 127.0.0.1"), "bad_template"),  # custom engine, no port known
    ],
)
def test_bad_assignments_are_refused_with_a_reason(message: dict[str, Any], code: str) -> None:
    with pytest.raises(Refusal) as refusal:
        parse_assignment(message, CONTROLLER)
    assert refusal.value.code == code and str(refusal.value)


def service(
    busy: str | None = None,
    controllers: tuple[str, ...] = (CONTROLLER,),
    any_: bool = False,
    running: tuple[str, ...] = (),
):
    started: list[EngineAssignment] = []
    stopped: list[str] = []

    def stop(model: str) -> bool:
        stopped.append(model)
        return model in running

    svc = ControlService(
        controllers, any_, lambda _a: Refusal("busy", busy) if busy else None, started.append, stop
    )
    svc.stopped = stopped  # type: ignore[attr-defined]
    return svc, started


def test_only_listed_controllers_may_assign_and_an_empty_list_refuses_everyone() -> None:
    svc, _ = service(controllers=())
    with pytest.raises(Refusal, match="lists no controllers") as refusal:
        svc.check(assign(), CONTROLLER)
    assert refusal.value.code == "not_authorised"
    svc, _ = service()
    with pytest.raises(Refusal, match="not in this node's controllers"):
        svc.check(assign(), STRANGER)
    assert svc.check(assign(), CONTROLLER).controller == CONTROLLER
    svc, _ = service(controllers=(), any_=True)
    assert svc.check(assign(), STRANGER).model == "m"


def test_a_busy_node_refuses_and_a_bad_command_is_refused_as_such() -> None:
    svc, started = service(busy="the node already runs engine vllm")
    with pytest.raises(Refusal) as refusal:
        svc.check(assign(), CONTROLLER)
    assert refusal.value.code == "busy" and "already runs" in str(refusal.value) and not started
    with pytest.raises(Refusal) as refusal:
        svc.check(assign(command="{nonsense}"), CONTROLLER)
    assert refusal.value.code == "bad_template"


def test_an_assignment_may_name_its_memory_and_profile() -> None:
    a = parse_assignment(assign(memory_mib=2048, profile="abc123"), CONTROLLER)
    assert (a.memory_mib, a.profile) == (2048, "abc123")
    assert parse_assignment(assign(), CONTROLLER).memory_mib is None
    for bad in (0, -5, "2048", True, 1.5):
        with pytest.raises(Refusal) as refusal:
            parse_assignment(assign(memory_mib=bad), CONTROLLER)
        assert refusal.value.code == "bad_request"
    with pytest.raises(Refusal):
        parse_assignment(assign(profile=7), CONTROLLER)
    assert parse_assignment(assign(keep_alive_s=2), CONTROLLER).keep_alive_s == 2.0
    for bad in (0, -1, "5", False):
        with pytest.raises(Refusal):
            parse_assignment(assign(keep_alive_s=bad), CONTROLLER)


async def test_stop_stops_one_engine_for_an_authorised_controller() -> None:
    svc, _ = service(running=("a",))
    assert await exchange(svc, CONTROLLER, {"op": "stop", "model": "a"}) == {
        "ok": True,
        "state": "stopped",
        "model": "a",
    }
    missing = await exchange(svc, CONTROLLER, {"op": "stop", "model": "b"})
    assert (missing["ok"], missing["code"]) == (False, "not_found")
    stranger = await exchange(svc, STRANGER, {"op": "stop", "model": "a"})
    assert (stranger["ok"], stranger["code"]) == (False, "not_authorised")
    bad = await exchange(svc, CONTROLLER, {"op": "stop"})
    assert (bad["ok"], bad["code"]) == (False, "bad_request")
    assert svc.stopped == ["a", "b"]  # type: ignore[attr-defined]


async def exchange(svc: ControlService, sender: str, message: Any) -> dict[str, Any]:
    ours, theirs = memory_stream_pair(PROTO_CONTROL, sender, "node")
    await write_msg(ours, message)
    await ours.write_eof()
    await svc.handle_stream(theirs)
    return await read_msg(ours)


async def test_answers_on_the_wire() -> None:
    svc, started = service()
    answer = await exchange(svc, CONTROLLER, assign())
    assert answer["ok"] and answer["state"] == "starting" and answer["engine"] == "simulated"
    assert len(started) == 1 and answer["port"] == started[0].spec.port
    answer = await exchange(svc, STRANGER, assign())
    assert answer == {"ok": False, "code": "not_authorised", "error": answer["error"]}
    assert svc.counters == {"accepted": 1, "refused": 1}


async def test_a_block_assignment_is_checked_then_handed_to_the_node() -> None:
    taken: list[tuple[str, int, int]] = []

    def blocks(model: str, start: int, end: int) -> Refusal | None:
        if taken:
            return Refusal("busy", "already serves blocks")
        taken.append((model, start, end))
        return None

    svc = ControlService((CONTROLLER,), False, lambda _a: None, lambda _a: None, None, blocks)
    ok = await exchange(svc, CONTROLLER, {"op": "blocks", "model": "m", "start": 0, "end": 10})
    assert ok == {"ok": True, "state": "loading", "model": "m", "start": 0, "end": 10}
    assert taken == [("m", 0, 10)]
    busy = await exchange(svc, CONTROLLER, {"op": "blocks", "model": "m", "start": 10, "end": 20})
    assert (busy["ok"], busy["code"]) == (False, "busy")
    stranger = await exchange(svc, STRANGER, {"op": "blocks", "model": "m", "start": 0, "end": 1})
    assert stranger["code"] == "not_authorised"
    for bad in (
        {"start": 5, "end": 5},
        {"start": -1, "end": 3},
        {"start": "0", "end": 3},
        {"start": None},
        {"model": ""},
    ):
        answer = await exchange(svc, CONTROLLER, {"op": "blocks", "model": "m", "start": 0, "end": 4, **bad})
        assert answer["code"] == "bad_request", bad
    assert taken == [("m", 0, 10)]
    no_blocks, _ = service()
    answer = await exchange(no_blocks, CONTROLLER, {"op": "blocks", "model": "m", "start": 0, "end": 4})
    assert answer["code"] == "bad_request"
