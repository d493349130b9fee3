"""The controller's catalog file and the request rates it observes at the ingress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from loopback_http import serve_app
from opentela.cli.controller import ObservedRates, observed_by_workload, request_counts, with_calibrations
from opentela.errors import ConfigError
from opentela.gateway.metrics import GatewayMetrics
from opentela.scheduler.fleet_catalog import load_fleet_catalog, parse_fleet_catalog

GOOD: dict[str, Any] = {
    "models": [
        {
            "id": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "config": "SmolLM2-135M-Instruct",
            "command": "vllm serve {model} --port {port} -tp {tp}",
            "workload": {"rate": 2, "input": {"mean": 300, "std": 50}, "output": 100},
        },
        {
            "id": "qwen",
            "config": "Qwen3-1.7B",
            "engine": "vllm",
            "options": {"max_model_len": 8192},
            "workload": {"rate": 0.5, "observe": False},
        },
    ],
    "planning": {"interval_s": 5, "table_points": 6, "scale_out": False},
}


def test_a_catalog_becomes_controller_settings() -> None:
    catalog = parse_fleet_catalog(GOOD)
    config = catalog.controller_config()
    assert [w.model for w in config.workloads] == ["SmolLM2-135M-Instruct", "Qwen3-1.7B"]
    assert config.served_as["SmolLM2-135M-Instruct"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config.launch["SmolLM2-135M-Instruct"] == {"command": "vllm serve {model} --port {port} -tp {tp}"}
    assert config.launch["Qwen3-1.7B"] == {"engine": "vllm", "options": {"max_model_len": 8192}}
    assert config.interval_s == 5 and config.settings.rate_points == 6 and config.scale_out is False
    assert catalog.controller_config(interval_s=1).interval_s == 1
    qwen = catalog.models[1].workload
    assert qwen.rate == 0.5 and qwen.input.mean == 512 and qwen.output.mean == 256  # declared defaults


def test_a_config_path_is_relative_to_the_catalog_file(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[3] / "src/opentela/scheduler/data/models"
    config = next(shipped.glob("*SmolLM2*"))
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(config.read_text())
    raw = {
        "models": [
            {"id": "mine", "config": "my-model", "command": "x --port {port}", "workload": {"rate": 1}}
        ]
    }
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(raw))
    catalog = load_fleet_catalog(tmp_path / "catalog.yaml")
    assert catalog.models[0].config == str(tmp_path / "my-model")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.pop("models"), "non-empty list under 'models'"),
        (lambda c: c["models"][0].pop("id"), "'id'"),
        (lambda c: c["models"][0].update(engine="vllm"), "either 'command'"),
        (lambda c: c["models"][1].pop("engine"), "either 'command'"),
        (lambda c: c["models"][0].update(config="No-Such-Model-7B"), "No-Such-Model-7B"),
        (lambda c: c["models"][0].update(workload={"input": 5}), "rate"),
        (lambda c: c["models"][0]["workload"].update(rate=-1), "rate must be >= 0"),
        (lambda c: c["models"][0]["workload"].update(rat=1), "unknown fields"),
        (lambda c: c["models"][1].update(config="SmolLM2-135M-Instruct"), "share the config"),
        (lambda c: c["models"][1].update(id="HuggingFaceTB/SmolLM2-135M-Instruct"), "share the id"),
        (lambda c: c["planning"].update(interval_s=0), "interval_s must be positive"),
        (lambda c: c["planning"].update(intervals=3), "unknown fields"),
        (lambda c: c.update(extra={}), "unknown sections"),
    ],
)
def test_bad_catalogs_say_what_is_wrong(change: Any, message: str) -> None:
    raw = json.loads(json.dumps(GOOD))
    change(raw)
    with pytest.raises(ConfigError, match=message):
        parse_fleet_catalog(raw, "catalog.yaml")


def test_request_rates_come_from_the_gateway_counters() -> None:
    metrics = GatewayMetrics()
    for node, status in (("a", "200"), ("b", "200"), ("a", "500")):
        metrics.requests.labels("HuggingFaceTB/SmolLM2-135M-Instruct", node, status).inc(4)
    metrics.requests.labels("qwen", "a", "200").inc()
    counts = request_counts(metrics.render().decode())
    assert counts == {"HuggingFaceTB/SmolLM2-135M-Instruct": 12.0, "qwen": 1.0}
    catalog = parse_fleet_catalog(GOOD)
    rates = {"HuggingFaceTB/SmolLM2-135M-Instruct": 3.0, "qwen": 9.0, "other": 1.0}
    # qwen declares observe: false; a model without traffic keeps its declared rate.
    assert observed_by_workload(catalog, rates) == {"SmolLM2-135M-Instruct": 3.0}
    assert observed_by_workload(catalog, {}) == {}


async def test_observed_rates_are_counter_changes_over_time() -> None:
    metrics = GatewayMetrics()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", serve)
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        url = f"{base}/v1"
        rates = ObservedRates(url, min_window_s=0.0)
        assert await rates.sample(http) == {}  # a first sample is only a baseline
        metrics.requests.labels("m", "a", "200").inc(10)
        observed = await rates.sample(http)
        assert observed["m"] > 0
        patient = ObservedRates(url, min_window_s=3600.0)
        await patient.sample(http)
        metrics.requests.labels("m", "a", "200").inc(10)
        assert await patient.sample(http) == {}  # too short a window


def test_the_shipped_example_catalog_is_valid() -> None:
    catalog = load_fleet_catalog(Path(__file__).parents[3] / "deploy/controller/catalog.yaml")
    assert {m.id for m in catalog.models} >= {"Qwen/Qwen3-1.7B", "SmolLM2-135M-Instruct"}


def test_the_controller_plans_on_the_stored_calibrations_of_its_engine(tmp_path: Path) -> None:
    from opentela.scheduler.calibration import Calibration, StepPoint
    from opentela.scheduler.step_model import StepModel

    catalog = load_fleet_catalog(Path(__file__).parents[3] / "deploy/controller/catalog.yaml")
    step = StepModel(step_overhead_s=0.02, gemm=0.3, source="test")
    Calibration("H100-SXM", "sglang", step, "", (StepPoint(0.03, decode=(64,)),)).save(tmp_path)
    planned = with_calibrations(catalog, "sglang", str(tmp_path))
    assert planned.hardware is not None and planned.hardware["H100-SXM"].step == step
    assert planned.hardware["A100-80G"].step.is_identity  # no calibration stored: the plain roofline
    assert with_calibrations(catalog, "vllm", str(tmp_path)).hardware["H100-SXM"].step.is_identity
    assert planned.models == catalog.models
