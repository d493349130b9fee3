"""`otela controller`: a node of role ``controller`` that assigns catalog models to idle workers.

It joins the mesh like any node (through the ingress's bootstrap address unless told otherwise), reads the
fleet from its own registry replica, observes request rates at the ingress's /metrics (or, with a usage feed,
rates and lengths from a frontend's usage export), and sends ``assign`` messages over /otela/control/1. Nodes
accept them only from the peer ids they list in ``controllers``, so the controller keeps its identity in a key
file of its own and prints its peer id at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from opentela._logging import setup_logging
from opentela._signals import on_stop_signals
from opentela._types import PROTO_DEMAND, Lifecycle, Stream
from opentela.bench.traces import TRACE_FORMATS, TraceRecord, read_trace
from opentela.cli._process import run_async
from opentela.config import OtelaConfig, config_home, data_home, load_config
from opentela.errors import ConfigError, OpenTelaError, PeerUnreachableError
from opentela.fabric.identity import Identity
from opentela.fabric.messages import read_msg, write_msg
from opentela.node.agent import NodeAgent
from opentela.registry.record import NodeRecord
from opentela.scheduler.bprr.spec_file import rtt_table
from opentela.scheduler.calibration import calibrated_catalog, default_store
from opentela.scheduler.controller import FleetController
from opentela.scheduler.drift import Measurement, Replan, measure
from opentela.scheduler.fleet import ReplicaAssignment
from opentela.scheduler.fleet_catalog import FleetCatalog, load_fleet_catalog
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.pipeline_control import BlockAssignment, PipelineController
from opentela.scheduler.serverless import ServerlessController
from opentela.scheduler.workload import Workload, workloads_from_trace

logger = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 30.0
SYNC_TIMEOUT_S = 30.0
DEMAND_SYNC_WAIT_S = 5.0
"""How long a want waits for a just-joined controller's first registry sync before it is answered."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `otela controller`."""
    p.add_argument("--ingress", default="http://127.0.0.1:8092", metavar="URL", help="an ingress of the mesh")
    p.add_argument("--catalog", metavar="FILE", help="models to serve: YAML catalog (see docs/scheduler.md)")
    p.add_argument(
        "--engine",
        default="vllm",
        help="engine whose stored calibrations (otela simulate calibrate) the planner applies per device "
        "(default vllm; devices without one are planned on the plain roofline)",
    )
    p.add_argument(
        "--step-models",
        metavar="DIR",
        help="directory of calibrations (default $OTELA_STEP_MODELS or ~/.config/opentela/step-models)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="take the catalog models' rates and lengths from this trace instead (docs/traces.md)",
    )
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default="auto", help="the trace's format (auto)")
    p.add_argument("--speedup", type=float, default=1.0, help="scale the trace's rates by this (1)")
    p.add_argument(
        "--usage-from",
        metavar="URL",
        help="a frontend: measure rates and lengths from its usage export, re-plan when they drift",
    )
    p.add_argument(
        "--usage-window",
        type=float,
        metavar="S",
        help="seconds of recent usage each measurement covers (default: catalog, 3600)",
    )
    p.add_argument(
        "--usage-poll", type=float, metavar="S", help="seconds between measurements (default: catalog, 60)"
    )
    p.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help="the frontend's admin token (default: $OTELA_FRONTEND_ADMIN_TOKEN, else the local frontend's)",
    )
    p.add_argument(
        "--interval", type=float, metavar="S", help="seconds between rounds (default: catalog, 30)"
    )
    p.add_argument("--once", action="store_true", help="run one round, print what was assigned, exit")
    p.add_argument("--dry-run", action="store_true", help="decide and print the assignments, send nothing")
    p.add_argument(
        "--show-peer-id",
        action="store_true",
        help="print the controller's peer id (creating its key) and exit",
    )
    p.add_argument(
        "--key-file", metavar="PATH", help="identity key (default: $XDG_CONFIG_HOME/opentela/controller.key)"
    )
    p.add_argument(
        "--bootstrap", action="append", metavar="ADDR", help="join through ADDR (default: the ingress)"
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="fabric listen address (default 0.0.0.0:0)")
    p.add_argument("--provider-id", metavar="ID", help="provider named in the controller's record")
    p.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file ([fabric], [registry])")
    p.add_argument("--join-token", metavar="TOKEN", help="join token of a closed network")
    p.add_argument("--join-token-file", metavar="FILE", help="file holding the join token")
    p.add_argument("--network-id", metavar="ID", help="closed network to belong to (otn_...)")


def controller_identity(key_file: str | None) -> Identity:
    """The controller's own identity, kept apart from a node's on the same machine."""
    return Identity.load_or_create(key_file or config_home() / "controller.key")


async def ingress_bootstraps(http: aiohttp.ClientSession, ingress: str) -> list[str]:
    """Where the ingress says others can join through it."""
    url = ingress.rstrip("/").removesuffix("/v1") + "/v1/dnt/bootstraps"
    try:
        async with http.get(url) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"cannot ask the ingress {url} for a bootstrap address: {exc}") from None
    addrs = body.get("self") if isinstance(body, dict) else None
    if not addrs:
        raise ConfigError(f"the ingress at {url} gave no bootstrap address; pass --bootstrap")
    return [str(a) for a in addrs]


def request_counts(metrics_text: str) -> dict[str, float]:
    """Finished requests per model from the gateway's Prometheus text (``otela_requests_total``)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "otela_requests":
            continue
        for sample in family.samples:
            if sample.name == "otela_requests_total":
                model = sample.labels.get("model", "")
                counts[model] = counts.get(model, 0.0) + sample.value
    return counts


class ObservedRates:
    """Request rates per model at the ingress, from the change of its counters between two rounds."""

    def __init__(self, ingress: str, min_window_s: float = 5.0) -> None:
        self.url = ingress.rstrip("/").removesuffix("/v1") + "/metrics"
        self.min_window_s = min_window_s
        self._last: tuple[float, dict[str, float]] | None = None

    async def sample(self, http: aiohttp.ClientSession) -> dict[str, float]:
        """Requests per second per served model id since the previous sample (empty the first time)."""
        try:
            async with http.get(self.url) as resp:
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.info("no metrics from the ingress: %s", exc)
            return {}
        now, counts = time.monotonic(), request_counts(text)
        if self._last is not None and now - self._last[0] < self.min_window_s:
            return {}  # too short a window to tell a rate: keep the older baseline
        last, self._last = self._last, (now, counts)
        if last is None:
            return {}
        elapsed = now - last[0]
        return {m: max(c - last[1].get(m, 0.0), 0.0) / elapsed for m, c in counts.items()}


def observed_by_workload(catalog: FleetCatalog, rates: Mapping[str, float]) -> dict[str, float]:
    """Rates keyed by workload model, for the catalog models that observe theirs and saw traffic."""
    return {m.config: rates[m.id] for m in catalog.models if m.observe and rates.get(m.id, 0.0) > 0}


def admin_token(path: str | None) -> str:
    """The frontend's admin token: from `path`, else $OTELA_FRONTEND_ADMIN_TOKEN, else a local frontend's file."""
    if path is None and os.environ.get("OTELA_FRONTEND_ADMIN_TOKEN"):
        return os.environ["OTELA_FRONTEND_ADMIN_TOKEN"]
    file = Path(path) if path else data_home() / "admin-token"
    try:
        token = file.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"--usage-from needs the frontend's admin token: cannot read {file} ({exc.strerror}); "
            "pass --admin-token-file or set OTELA_FRONTEND_ADMIN_TOKEN"
        ) from None
    if not token:
        raise ConfigError(f"the admin token file {file} is empty")
    return token


class UsageFeed:
    """A frontend's recent usage, read from its trace export (``GET /admin/usage/export.csv?since=``)."""

    def __init__(self, frontend: str, token: str, window_s: float) -> None:
        self.url = frontend.rstrip("/").removesuffix("/v1") + "/admin/usage/export.csv"
        self.token, self.window_s = token, window_s

    def __repr__(self) -> str:
        return f"<UsageFeed {self.url} window={self.window_s:g}s>"

    async def fetch(self, http: aiohttp.ClientSession, now: float) -> list[TraceRecord]:
        """The requests of the last `window_s` seconds before `now` (Unix time), through `read_trace`."""
        params = {"since": repr(now - self.window_s)}
        headers = {"Authorization": f"Bearer {self.token}"}
        # Through a file, so that the export is read by the one trace reader every tool uses.
        with tempfile.TemporaryDirectory(prefix="otela-usage-") as tmp:
            path = Path(tmp) / "usage.csv"
            try:
                async with http.get(self.url, params=params, headers=headers) as resp:
                    if resp.status != 200:
                        detail = (await resp.text())[:200]
                        raise ConfigError(
                            f"the frontend's usage export {self.url} answered {resp.status}: {detail}"
                        )
                    with path.open("wb") as out:
                        async for chunk in resp.content.iter_chunked(1 << 16):
                            out.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ConfigError(f"cannot read the frontend's usage export {self.url}: {exc}") from None
            return await asyncio.to_thread(read_trace, path, "opentela")

    async def measure(self, http: aiohttp.ClientSession, now: float | None = None) -> dict[str, Measurement]:
        """Rates and lengths per requested model over the window (see `scheduler.drift.measure`)."""
        now = time.time() if now is None else now
        records = await self.fetch(http, now)
        return measure(records, window_s=self.window_s, now=now)


def measured_by_workload(
    catalog: FleetCatalog, measured: Mapping[str, Measurement]
) -> dict[str, Measurement]:
    """Measurements keyed by workload model, for the kept catalog models that observe their traffic.

    A usage row names the model the client requested: the served `id`, else the `config` name, as for traces.
    """
    out = {}
    for m in catalog.kept:
        found = measured.get(m.id) or measured.get(m.config)
        if m.observe and found is not None:
            w = found.workload
            out[m.config] = Measurement(Workload(m.config, w.rate, w.input, w.output), found.samples)
    return out


def catalog_with_trace(
    catalog: FleetCatalog, records: Sequence[TraceRecord], speedup: float = 1.0
) -> FleetCatalog:
    """The catalog with the traffic of each model the trace has (matched by served id, else by config name)."""
    derived = {w.model: w for w in workloads_from_trace(records, speedup=speedup)}
    models = []
    for m in catalog.models:
        w = derived.get(m.id) or derived.get(m.config)
        # The placement knows a model by its config name, whatever the trace calls it.
        models.append(
            m if w is None else dataclasses.replace(m, workload=Workload(m.config, w.rate, w.input, w.output))
        )
    return dataclasses.replace(catalog, models=models)


class FleetControllerNode:
    """The controller process: a NodeAgent of role controller driving a FleetController."""

    def __init__(
        self,
        agent: NodeAgent,
        catalog: FleetCatalog,
        interval_s: float | None = None,
        dry_run: bool = False,
        usage: UsageFeed | None = None,
        usage_poll_s: float | None = None,
    ) -> None:
        self.agent, self.catalog, self.dry_run, self.usage = agent, catalog, dry_run, usage
        self.usage_poll_s = catalog.usage_poll_s if usage_poll_s is None else usage_poll_s
        self.controller = FleetController(
            catalog.controller_config(interval_s),
            self.records,
            self.dry_run_send if dry_run else self.send,
            catalog.hardware,
        )
        self.wake = asyncio.Event()
        self.serverless = (
            ServerlessController(catalog.serverless, self.records, self.send) if catalog.serverless else None
        )
        self.pipelines = PipelineController(
            catalog.pipelines,
            self.records,
            self.dry_run_send if dry_run else self.send,
            catalog.hardware,
            assign_timeout_s=catalog.assign_timeout_s,
        )

    def serve_demand(self) -> None:
        """Answer ingresses' wants for serverless models (/otela/demand/1), and time their cold starts."""
        if self.serverless is None or self.dry_run:
            return
        serverless = self.serverless
        assert self.agent.host is not None
        gossip = self.agent.gossip

        async def handle_demand(stream: Stream) -> None:
            # A controller that has just joined may be known to the ingress before it holds the workers'
            # records (a joiner pulls the registry in parts): its answer waits for that, briefly.
            if gossip is not None:
                await gossip.wait_synced(DEMAND_SYNC_WAIT_S)
            await serverless.handle_stream(stream)

        self.agent.host.set_handler(PROTO_DEMAND, handle_demand)

        def changed(record: NodeRecord, local: bool) -> None:
            if serverless.starting and not local and record.models:
                serverless.settle()

        self.agent.mesh.on_change(changed)

    def records(self) -> list[NodeRecord]:
        """Live records of this replica, without the peers our liveness layer suspects."""
        return self.agent.mesh.live_records()

    async def send(self, peer_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """Deliver one control message over /otela/control/1 and return the node's answer."""
        stream = await self.agent.mesh.open_control_stream(peer_id, timeout=10.0)
        try:
            await write_msg(stream, message)
            await stream.write_eof()
            answer = await asyncio.wait_for(read_msg(stream), ANSWER_TIMEOUT_S)
        except asyncio.IncompleteReadError:
            raise PeerUnreachableError(f"{peer_id} closed the control stream without answering") from None
        finally:
            with contextlib.suppress(OpenTelaError):
                await stream.aclose()
        return answer if isinstance(answer, dict) else {"ok": False, "error": f"unreadable answer {answer!r}"}

    async def dry_run_send(self, peer_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send nothing: report the assignment as accepted so later rounds plan around it."""
        return {"ok": True, "dry_run": True}

    def watch_registry(self) -> None:
        """Wake the loop early when a worker joins idle (its JOIN record without models arrives)."""

        def changed(record: NodeRecord, local: bool) -> None:
            if (
                not local
                and record.lifecycle == Lifecycle.JOIN
                and not record.models
                and "worker" in record.roles
            ):
                self.wake.set()

        self.agent.mesh.on_change(changed)

    async def wait_synced(self, http: aiohttp.ClientSession, ingress: str) -> None:
        """Wait until our replica holds every live session the ingress lists (or give up after a while)."""
        url = ingress.rstrip("/").removesuffix("/v1") + "/v1/dnt/table"
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with http.get(url) as resp:
                    table = await resp.json(content_type=None)
                theirs = {r["session_id"] for r in table if r.get("lifecycle") in ("JOIN", "SERVING")}
                ours = {r.session_id for r in self.records()}
                if theirs and theirs <= ours:
                    return
            await asyncio.sleep(0.2)
        logger.warning("registry not in step with the ingress after %.0f s; planning anyway", SYNC_TIMEOUT_S)

    async def run(
        self, http: aiohttp.ClientSession, ingress: str, *, once: bool, stop: asyncio.Event
    ) -> None:
        """Rounds until stopped: every interval, or sooner when an idle worker joins or the workload drifts."""
        # Usage replaces the ingress's counters: the first round already plans with what it measured.
        rates = None if self.usage else ObservedRates(ingress)
        if self.usage is not None:
            await self.poll_usage(http)
        if self.usage is None or once:
            await self._rounds(http, ingress, once=once, stop=stop, rates=rates)
            return
        async with asyncio.TaskGroup() as tg:
            poller = tg.create_task(self._poll_forever(http, stop))
            try:
                await self._rounds(http, ingress, once=once, stop=stop, rates=None)
            finally:
                poller.cancel()

    async def poll_usage(self, http: aiohttp.ClientSession, now: float | None = None) -> Replan | None:
        """Measure the usage once; on drift, print the re-plan and wake the loop for a round now."""
        assert self.usage is not None
        measured = measured_by_workload(self.catalog, await self.usage.measure(http, now))
        replan = self.controller.observe_usage(measured, time.time() if now is None else now)
        if replan is not None:
            print_replan(replan)
            self.wake.set()
        return replan

    async def _poll_forever(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.usage_poll_s)
            try:
                await self.poll_usage(http)
            except ConfigError as exc:
                # The frontend may be restarting: plan with the traffic as it was until it answers again.
                logger.warning("usage.unavailable", extra={"error": str(exc)})

    async def _rounds(
        self,
        http: aiohttp.ClientSession,
        ingress: str,
        *,
        once: bool,
        stop: asyncio.Event,
        rates: ObservedRates | None,
    ) -> None:
        if rates is not None:
            await rates.sample(http)
        await self.wait_synced(http, ingress)
        while not stop.is_set():
            self.wake.clear()
            if rates is not None:
                self.controller.observed_rates = observed_by_workload(self.catalog, await rates.sample(http))
            if self.catalog.pipelines:
                # Split models first: they need several nodes, where whole models scale out onto any.
                for blocks, answer in await self.pipelines.run_round(await ingress_rtt(http, ingress)):
                    print_blocks_result(blocks, answer)
                    if answer.get("ok"):
                        self.controller.reserve(blocks.peer_id, blocks.model)
            for assignment, answer in await self.controller.run_round():
                print_result(assignment, answer)
            if once:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.controller.config.interval_s):
                    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waits:
                            w.cancel()
            if self.wake.is_set() and not stop.is_set():
                await asyncio.sleep(1.0)  # let the joining node's record settle (and others join with it)


async def ingress_rtt(http: aiohttp.ClientSession, ingress: str) -> dict[str, float]:
    """The ingress's measured round trips to its peers in ms (empty when it cannot say)."""
    url = ingress.rstrip("/").removesuffix("/v1") + "/v1/dnt/rtt"
    try:
        async with http.get(url) as resp:
            doc = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        logger.info("no round trips from the ingress: %s", exc)
        return {}
    try:
        table = rtt_table(doc, url)
    except ConfigError as exc:
        logger.info("unreadable round trips from the ingress: %s", exc)
        return {}
    return next(iter(table.values()), {})


def print_blocks_result(a: BlockAssignment, answer: Mapping[str, Any]) -> None:
    """One JSON line per block assignment on stdout."""
    line = {
        "event": "blocks",
        "peer_id": a.peer_id,
        "model": a.model,
        "blocks": [a.start, a.end],
        "ok": bool(answer.get("ok")),
        **{k: answer[k] for k in ("state", "code", "error", "dry_run") if k in answer},
    }
    print(json.dumps(line), flush=True)


def print_replan(replan: Replan) -> None:
    """One JSON line per re-plan on stdout: the models that drifted and why, and the traffic now planned with."""
    line = {
        "event": "replan",
        "reasons": {m: list(r) for m, r in replan.reasons.items()},
        "workloads": {
            m: {
                "rate": round(x.workload.rate, 4),
                "input_p50": round(x.workload.input.median, 1),
                "output_p50": round(x.workload.output.median, 1),
                "samples": x.samples,
            }
            for m, x in replan.adopted.items()
        },
    }
    print(json.dumps(line), flush=True)


def print_result(a: ReplicaAssignment, answer: Mapping[str, Any]) -> None:
    """One JSON line per assignment on stdout: what went where, and the node's answer."""
    line = {
        "event": "assign",
        "peer_id": a.peer_id,
        "model": a.model,
        "device": a.device,
        "tp": a.tp,
        "gpus": list(a.gpus),
        "ok": bool(answer.get("ok")),
        **{k: answer[k] for k in ("state", "code", "error", "dry_run") if k in answer},
    }
    print(json.dumps(line), flush=True)


def _config(args: argparse.Namespace) -> OtelaConfig:
    node: dict[str, Any] = {"role": "controller"}
    for name in ("listen", "provider_id"):
        if getattr(args, name):
            node[name] = getattr(args, name)
    fabric = {k: v for k in ("join_token", "join_token_file", "network_id") if (v := getattr(args, k))}
    config = load_config(args.config, flags={"node": {}, "fabric": fabric})
    # NodeConfig does not know the controller role from files or flags: it is set here only.
    return dataclasses.replace(config, node=dataclasses.replace(config.node, **node))


def with_calibrations(catalog: FleetCatalog, engine: str, step_models: str | None) -> FleetCatalog:
    """`catalog` planning on devices that carry the stored calibration of `engine` where one exists."""
    store = Path(step_models) if step_models else default_store()
    hardware = calibrated_catalog(catalog.hardware or builtin_catalog(), engine, store)
    return dataclasses.replace(catalog, hardware=hardware)


async def run_controller(args: argparse.Namespace) -> int:
    """`otela controller`: join the mesh, then assign catalog models to idle workers round after round."""
    identity = controller_identity(args.key_file)
    if args.show_peer_id:
        print(identity.peer_id)
        return 0
    if not args.catalog:
        raise ConfigError("--catalog FILE is required (models, engine command templates, workloads)")
    catalog = with_calibrations(load_fleet_catalog(args.catalog), args.engine, args.step_models)
    if args.trace:
        catalog = catalog_with_trace(catalog, read_trace(args.trace, args.trace_format), args.speedup)
    usage = None
    if args.usage_from:
        window = catalog.usage_window_s if args.usage_window is None else args.usage_window
        if window <= 0 or (args.usage_poll is not None and args.usage_poll <= 0):
            raise ConfigError("--usage-window and --usage-poll must be positive")
        usage = UsageFeed(args.usage_from, admin_token(args.admin_token_file), window)
    config = _config(args)
    setup_logging(config.log)
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        bootstrap = tuple(args.bootstrap or ()) or tuple(await ingress_bootstraps(http, args.ingress))
        node = dataclasses.replace(config.node, bootstrap=bootstrap)
        agent = NodeAgent(identity, node, config.fabric, config.registry)
        controller_node = FleetControllerNode(
            agent, catalog, args.interval, args.dry_run, usage=usage, usage_poll_s=args.usage_poll
        )
        restore_signals = on_stop_signals(stop.set)
        try:
            await agent.start()
            controller_node.watch_registry()
            controller_node.serve_demand()
            print(f"controller {agent.peer_id}", file=sys.stderr)
            print(f"key        {Path(args.key_file or config_home() / 'controller.key')}", file=sys.stderr)
            print(f"bootstrap  {','.join(bootstrap)}", file=sys.stderr)
            names = [m.id for m in catalog.models] + [f"{p.id} (split)" for p in catalog.pipelines]
            print(
                f"catalog    {', '.join(names)} (policy {catalog.policy})",
                file=sys.stderr,
            )
            if args.trace:
                rates = ", ".join(f"{m.id} {m.workload.rate:.3g} req/s" for m in catalog.kept)
                print(f"traffic    {rates} (from {args.trace})", file=sys.stderr)
            if usage is not None:
                print(
                    f"usage      {usage.url}, last {usage.window_s:g} s, every "
                    f"{controller_node.usage_poll_s:g} s",
                    file=sys.stderr,
                )
            print(
                "nodes accept assignments from this controller once they list its peer id in [node] controllers",
                file=sys.stderr,
            )
            sys.stderr.flush()
            await controller_node.run(http, args.ingress, once=args.once, stop=stop)
        finally:
            restore_signals()
            await agent.aclose()
    return 0


def run(args: argparse.Namespace) -> int:
    """`otela controller`: run the fleet controller until SIGINT/SIGTERM (or one round with --once)."""
    return run_async(run_controller(args))
