"""Placement: CP-SAT plans satisfy C1-C3 and beat memP on the simulator's objective; policies are pluggable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opentela.errors import CapacityError, ConfigError
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.placement import Cluster, Group, Plan, Problem, check_plan, get_policy, simulate_plan
from opentela.scheduler.tables import SimSettings, TableBuilder
from opentela.scheduler.workload import LengthDist, Workload

FAST = SimSettings(horizon_s=10.0, min_requests=60, max_requests=300, rate_points=8)


def small_problem(
    devices: dict[str, int] | None = None, rates: tuple[float, float] = (20.0, 60.0)
) -> Problem:
    cluster = Cluster(devices or {"A100-80G": 4, "L40S": 4}, builtin_catalog())
    workloads = [
        Workload("Llama-3.1-8B", rates[0], LengthDist(800, 200, 16, 4000), LengthDist(200, 50, 1, 1000)),
        Workload("Qwen3-1.7B", rates[1], LengthDist(300, 80, 16, 4000), LengthDist(100, 30, 1, 1000)),
    ]
    return Problem(cluster, workloads, TableBuilder(settings=FAST), shares=10, time_limit_s=30.0)


@pytest.fixture(scope="module")
def solved() -> tuple[Problem, Plan, Plan]:
    problem = small_problem()
    return problem, get_policy("cpsat").place(problem), get_policy("memp").place(problem)


def test_cpsat_plan_satisfies_c1_c2_c3(solved: tuple[Problem, Plan, Plan]) -> None:
    problem, plan, _ = solved
    assert plan.status in ("OPTIMAL", "FEASIBLE")
    assert check_plan(problem, plan) == []
    for w in problem.workloads:
        assert sum(g.share for g in plan.groups if g.model == w.model) == pytest.approx(1.0)
    for name, count in problem.cluster.devices.items():
        assert sum(g.devices for g in plan.groups if g.device == name) <= count


def test_memp_plan_is_valid_and_proportional(solved: tuple[Problem, Plan, Plan]) -> None:
    problem, _, memp = solved
    assert check_plan(problem, memp) == []
    alloc = memp.allocation()
    # rate x params: the 8B model's demand is larger than the 1.7B model's, so it gets more devices.
    assert sum(alloc["Llama-3.1-8B"].values()) > sum(alloc["Qwen3-1.7B"].values())


def test_cpsat_beats_or_equals_memp_on_the_simulator_objective(solved: tuple[Problem, Plan, Plan]) -> None:
    problem, plan, memp = solved
    assert problem.objective(plan) <= problem.objective(memp) + 1e-9
    assert plan.predicted_e2e == pytest.approx(problem.objective(plan))
    ours, theirs = simulate_plan(problem, plan, 10.0), simulate_plan(problem, memp, 10.0)
    assert ours["overall"]["completed"] == ours["overall"]["requests"]
    assert set(theirs["per_model"]) == {"Llama-3.1-8B", "Qwen3-1.7B"}


def test_check_plan_reports_each_violated_constraint() -> None:
    problem = small_problem()
    bad = Plan(
        "hand",
        [
            Group("Llama-3.1-8B", "A100-80G", 1, 5, 1.0),  # 5 > 4 devices: C1
            Group("Qwen3-1.7B", "L40S", 16, 1, 1.0),  # tp beyond a node: C3
        ],
    )
    errors = check_plan(problem, bad)
    assert any(e.startswith("C1") for e in errors) and any(e.startswith("C3") for e in errors)
    big = Problem(
        Cluster({"RTX-3090": 8}, builtin_catalog()),
        [Workload("Llama-3.3-70B-Instruct", 1.0, LengthDist(100), LengthDist(10))],
        TableBuilder(settings=FAST),
    )
    assert any(
        e.startswith("C2")
        for e in check_plan(big, Plan("hand", [Group(big.workloads[0].model, "RTX-3090", 1, 1, 1.0)]))
    )


def test_a_cluster_that_cannot_host_a_model_is_an_error() -> None:
    problem = Problem(
        Cluster({"RTX-3090": 1}, builtin_catalog()),
        [Workload("Llama-3.3-70B-Instruct", 1.0, LengthDist(100), LengthDist(10))],
        TableBuilder(settings=FAST),
    )
    with pytest.raises(CapacityError, match="no device type"):
        get_policy("cpsat").place(problem)


def test_policies_load_by_name_or_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_policy.py").write_text(
        textwrap.dedent(
            """
            from opentela.scheduler.placement import Group, Plan

            class EverythingOnFirst:
                name = "first"

                def place(self, problem, progress=None):
                    name = next(iter(problem.cluster.devices))
                    return Plan("first", [Group(w.model, name, 1, 1, 1.0) for w in problem.workloads])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = get_policy("my_policy:EverythingOnFirst").place(small_problem())
    assert [g.device for g in plan.groups] == ["A100-80G", "A100-80G"]
    with pytest.raises(ConfigError, match=r"unknown placement policy 'nope'.*cpsat"):
        get_policy("nope")
