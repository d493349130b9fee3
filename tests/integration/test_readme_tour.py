"""The README's quick tour and API-key section, run as written: real processes on loopback, one shared HOME.

The commands are read from README.md by section heading, so a README edit that breaks the tour breaks this test.
Only what cannot be taken literally on a test machine is substituted:

- hosts (``INGRESS_HOST``, ``DBHOST``, ``0.0.0.0``) become 127.0.0.1 and every port the README names
  (4001, 8092, 8093, ...) becomes a free port; the ports the commands leave to their defaults get the same
  free ports through ``OTELA_*`` variables, and nodes listen on loopback;
- ``otela`` is this environment's console script, ``python`` its interpreter, and ``curl`` the system's curl,
  quiet and failing on an HTTP error (a Python stand-in where none is installed);
- step 3's vLLM and SGLang commands become the simulated engine serving the same model name (no GPU here);
- ``catalog.yaml`` is a small catalog written into the directory the commands run in;
- ``CONTROLLER_PEER_ID`` is what ``otela controller ... --show-peer-id`` prints;
- the PostgreSQL URL of the stand-alone frontend becomes the SQLite database the other commands use by
  default (no PostgreSQL server is needed for this check; the frontend tests cover PostgreSQL), and both
  frontends on it admit through the database (``OTELA_FRONTEND_ADMISSION=database``), as on PostgreSQL.

Every process shares one temporary HOME with no XDG variables, like a user with several shells on one machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from opentela.cli.localmesh import NodeProcess, free_port
from sim_engine_process import SIMULATED_TEMPLATE

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOUR_HEADING = "Quick tour"
KEYS_HEADING = "API keys, usage and the dashboard"
TOUR_SHAPE = {1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 2}
"""Commands per numbered step of the tour, as the checks below expect them."""
KEYS_COMMANDS = 3
EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
GPU_MODEL = "Qwen/Qwen3-1.7B"
ASSIGNED_MODEL = "tour/assigned"
SERVED_WITHIN_S = 30.0
"""Steps 1 and 2 to a served SmolLM2: the demo takes about 11 s on an idle 2-core machine; this leaves room for
a busy one while still catching a start that hangs on something (a shared key, a port, a download)."""

BIN = Path(sys.executable).parent
OTELA_BIN = str(BIN / "otela") if (BIN / "otela").exists() else None


# --- reading the README ---------------------------------------------------------------------------------------


def readme_section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``##`` heading)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {heading}' section: the tour test reads its commands from there"
    return match.group(1)


def fenced_blocks(section: str, lang: str) -> list[str]:
    """The ```lang fenced blocks of a section, in order."""
    return re.findall(rf"^```{lang}[ \t]*\n(.*?)^```", section, re.M | re.S)


def logical_lines(block: str) -> list[str]:
    """Lines of a shell block with backslash continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return [line.strip() for line in lines if line.strip()]


def tour_steps(block: str) -> dict[int, list[list[str]]]:
    """Commands of a bash block grouped by its ``# N. ...`` step comments (trailing comments dropped)."""
    steps: dict[int, list[list[str]]] = {}
    current: int | None = None
    for line in logical_lines(block):
        if line.startswith("#"):
            step = re.match(r"#\s*(\d+)\.\s", line)
            if step:
                current = int(step.group(1))
                steps[current] = []
            continue
        assert current is not None, f"README tour: command {line!r} comes before any '# 1. ...' step comment"
        steps[current].append(shlex.split(line, comments=True))
    return steps


def plain_commands(block: str) -> list[list[str]]:
    """Commands of a bash block without steps (comments dropped)."""
    return [shlex.split(line, comments=True) for line in logical_lines(block) if not line.startswith("#")]


@dataclass(frozen=True)
class Readme:
    """What the test runs: the tour's steps, the openai snippet and the API-key commands."""

    steps: dict[int, list[list[str]]]
    snippet: str
    keys: list[list[str]]


def read_readme(text: str | None = None) -> Readme:
    """Parse README.md, failing with the reason when the structure the test relies on is gone."""
    text = README.read_text() if text is None else text
    tour = readme_section(text, TOUR_HEADING)
    bash = fenced_blocks(tour, "bash")
    assert len(bash) == 1, f"README '{TOUR_HEADING}': expected one ```bash block, found {len(bash)}"
    steps = tour_steps(bash[0])
    shape = {n: len(cmds) for n, cmds in steps.items()}
    assert shape == TOUR_SHAPE, (
        f"README '{TOUR_HEADING}': steps and commands per step are {shape}, the test checks {TOUR_SHAPE}; "
        "update the test's checks together with the tour"
    )
    for n, cmds in steps.items():
        for argv in cmds:
            assert argv[0] in ("otela", "curl"), (
                f"README tour step {n}: unexpected command {shlex.join(argv)}"
            )
    python = fenced_blocks(tour, "python")
    assert len(python) == 1, f"README '{TOUR_HEADING}': expected one ```python block, found {len(python)}"
    assert "OpenAI(" in python[0] and "chat.completions.create" in python[0], (
        "README tour: the Python snippet no longer calls the openai client"
    )
    keys_section = readme_section(text, KEYS_HEADING)
    keys_bash = fenced_blocks(keys_section, "bash")
    assert len(keys_bash) == 1, f"README '{KEYS_HEADING}': expected one ```bash block, found {len(keys_bash)}"
    keys = plain_commands(keys_bash[0])
    assert len(keys) == KEYS_COMMANDS and all(argv[0] == "otela" for argv in keys), (
        f"README '{KEYS_HEADING}': expected {KEYS_COMMANDS} otela commands, found "
        f"{[shlex.join(a) for a in keys]}"
    )
    return Readme(steps, python[0], keys)


# --- making a command local ----------------------------------------------------------------------------------


class Ports:
    """A free loopback port for every port number the README uses, the same one each time it appears."""

    def __init__(self) -> None:
        self._ports: dict[int, int] = {}

    def __getitem__(self, readme_port: int) -> int:
        if readme_port not in self._ports:
            self._ports[readme_port] = free_port()
        return self._ports[readme_port]


_HOST_PORT = re.compile(r"(INGRESS_HOST|DBHOST|0\.0\.0\.0|127\.0\.0\.1|localhost)(?::(\d+))?")


def local_text(text: str, ports: Ports) -> str:
    """Hosts become 127.0.0.1 and README ports free ports, inside any token or snippet."""

    def sub(m: re.Match[str]) -> str:
        return "127.0.0.1" + (f":{ports[int(m.group(2))]}" if m.group(2) else "")

    return _HOST_PORT.sub(sub, text)


def simulated_stand_in(engine: Sequence[str]) -> list[str]:
    """The simulated engine serving the model that a vLLM or SGLang command of the tour serves."""
    args = list(engine)
    if args[:2] == ["vllm", "serve"] and len(args) >= 3:
        model = args[2]
    elif "sglang.launch_server" in args and "--model-path" in args:
        model = args[args.index("--model-path") + 1]
    else:
        raise AssertionError(f"README tour: no stand-in for the engine command {shlex.join(args)}")
    return [sys.executable, "-m", "opentela", "engine", "simulated", "--model", model]


def program(name: str) -> list[str]:
    """The argv prefix that runs `name` here."""
    if name == "otela":
        return [OTELA_BIN] if OTELA_BIN else [sys.executable, "-m", "opentela"]
    if name == "curl":
        curl = shutil.which("curl")
        if curl:
            return [curl, "--silent", "--show-error", "--fail"]
        fetch = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())"
        return [sys.executable, "-c", fetch]
    raise AssertionError(f"README tour: unknown program {name!r}")


def localize(argv: Sequence[str], ports: Ports, *, db: str | None = None, **placeholders: str) -> list[str]:
    """One README command made runnable here (see the module docstring for what changes)."""
    args = [a if db is None or not a.startswith("postgresql://") else db for a in argv[1:]]
    args = [local_text(a, ports) for a in args]
    args = [placeholders.get(a, a) for a in args]
    if "--" in args:
        i = args.index("--")
        args = [*args[: i + 1], *simulated_stand_in(args[i + 1 :])]
    if "--process" in args:
        i = args.index("--process") + 1
        args[i] = shlex.join(simulated_stand_in(shlex.split(args[i])))
    leftover = [a for a in args if re.search(r"\b[A-Z][A-Z_]+[A-Z]\b", a) and "/" not in a]
    assert not leftover, f"README command {shlex.join(argv)}: placeholders with no value here: {leftover}"
    return [*program(argv[0]), *args]


# --- processes -----------------------------------------------------------------------------------------------


class ShellProcess(NodeProcess):
    """A long-running command started in a given working directory (where catalog.yaml is)."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str], cwd: Path
    ) -> None:
        super().__init__(name, argv, log_path, env)
        self.cwd = cwd

    async def start(self) -> None:
        """Spawn the command in its own session (process group), output to the log file."""
        self._log = open(self.log_path, "ab")  # noqa: ASYNC230 (a local file, opened once)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=self.cwd,
            stdout=self._log,
            stderr=self._log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )


@dataclass
class Shells:
    """Processes started as a user would from several shells on one machine: one HOME, one working directory."""

    root: Path
    ports: Ports = field(default_factory=Ports)
    procs: list[NodeProcess] = field(default_factory=list)
    http: aiohttp.ClientSession | None = None

    @property
    def home(self) -> Path:
        """The HOME every process shares."""
        return self.root / "home"

    @property
    def cwd(self) -> Path:
        """Where the commands run (catalog.yaml lives here)."""
        return self.root / "shell"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a shell: this HOME, no XDG or OTELA_ settings but the defaults' ports."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "OTELA_", "PYTEST_", "COV_"))}
        env.update(
            HOME=str(self.home),
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            # The defaults the commands leave alone, on loopback at this test's ports.
            OTELA_NODE_LISTEN="127.0.0.1:0",
            OTELA_GATEWAY_HTTP=f"127.0.0.1:{self.ports[8092]}",
            OTELA_FRONTEND_HTTP=f"127.0.0.1:{self.ports[8093]}",
        )
        env.update(extra)
        return env

    def url(self, readme_port: int, path: str = "") -> str:
        """http://127.0.0.1:PORT{path} for a port the README names."""
        return f"http://127.0.0.1:{self.ports[readme_port]}{path}"

    async def start(self, name: str, argv: Sequence[str], **env: str) -> NodeProcess:
        """Start a long-running command in its own process group, output in a log file."""
        print(f"[{name}] $ {shlex.join(argv)}")
        proc = ShellProcess(name, argv, self.root / "logs" / f"{name}.log", self.env(**env), cwd=self.cwd)
        self.procs.append(proc)
        await proc.start()
        return proc

    async def run(self, argv: Sequence[str], timeout: float = 60.0, **env: str) -> str:
        """Run a command to completion; its stdout (the test fails with its output when it fails)."""
        print(f"$ {shlex.join(argv)}")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=self.cwd,
            env=self.env(**env),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            os.killpg(proc.pid, 9)
            await proc.wait()
            raise AssertionError(
                f"{shlex.join(argv)} did not finish in {timeout:.0f} s\n{self.tails()}"
            ) from None
        assert proc.returncode == 0, (
            f"{shlex.join(argv)} exited {proc.returncode}\n{out.decode()}\n{err.decode()}\n{self.tails()}"
        )
        return out.decode()

    def tails(self, lines: int = 25) -> str:
        """The last lines of every long-running process's log."""
        return "\n".join(f"--- {p.name} (exit {p.exited()}) ---\n{p.log_tail(lines)}" for p in self.procs)

    def session(self) -> aiohttp.ClientSession:
        """An HTTP client for the checks."""
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self.http

    async def get_json(self, url: str) -> Any:
        """GET url as JSON; None while it does not answer 200."""
        try:
            async with self.session().get(url) as resp:
                return await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def wait_for(self, probe: Callable[[], Awaitable[Any]], *, timeout: float, what: str) -> Any:
        """Poll `probe` until it returns something truthy; fail with every process's log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            died = [p for p in self.procs if p.exited() is not None]
            assert not died, f"{died[0].name} exited ({died[0].exited()}) waiting for {what}\n{self.tails()}"
            result = await probe()
            if result:
                return result
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.tails()}")

    async def wait_line(self, proc: NodeProcess, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first match of `pattern` in a process's output, once it appears."""

        async def probe() -> re.Match[str] | None:
            return re.search(pattern, proc.log_text(), re.M)

        match: re.Match[str] = await self.wait_for(
            probe, timeout=timeout, what=f"{proc.name} to print {pattern!r}"
        )
        return match

    async def aclose(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL to its group) and close the client."""
        await asyncio.gather(*(p.stop(timeout=10) for p in reversed(self.procs)), return_exceptions=True)
        if self.http is not None:
            await self.http.close()


@pytest.fixture
async def shells(tmp_path: Path) -> AsyncIterator[Shells]:
    """A fresh machine's user: an empty HOME, a working directory, and everything stopped afterwards."""
    s = Shells(tmp_path)
    for d in (s.home, s.cwd, tmp_path / "logs"):
        d.mkdir()
    try:
        yield s
    finally:
        await s.aclose()


# --- checks --------------------------------------------------------------------------------------------------


async def models(s: Shells) -> dict[str, dict[str, Any]]:
    """The ingress's /v1/models by id."""
    listing = await s.get_json(s.url(8092, "/v1/models")) or {"data": []}
    return {m["id"]: m for m in listing["data"]}


async def serving_peers(s: Shells, model: str, count: int, timeout: float = 90.0) -> set[str]:
    """Wait until `count` distinct nodes are SERVING `model` in the ingress's registry table; their peer ids."""

    async def probe() -> set[str] | None:
        table = await s.get_json(s.url(8092, "/v1/dnt/table")) or []
        peers = {
            r["peer_id"]
            for r in table
            if r["lifecycle"] == "SERVING" and any(m.get("id") == model for m in r.get("models", []))
        }
        listed = (await models(s)).get(model)
        return peers if len(peers) >= count and listed else None

    found: set[str] = await s.wait_for(probe, timeout=timeout, what=f"{count} nodes serving {model}")
    return found


async def chat(s: Shells, base: str, model: str, key: str = "unused") -> tuple[int, dict[str, Any]]:
    """One short chat completion; (status, body)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    headers = {"Authorization": f"Bearer {key}"}
    async with s.session().post(f"{base}/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def answered(status: int, body: dict[str, Any]) -> bool:
    """A 200 with a non-empty assistant message."""
    return status == 200 and bool(body["choices"][0]["message"]["content"])


def node_peer_id(proc: NodeProcess) -> str:
    """The peer id an `otela start` process printed."""
    match = re.search(r"^node\s+(\S+)", proc.log_text(), re.M)
    assert match, f"{proc.name} printed no 'node PEERID' line\n{proc.log_tail()}"
    return match.group(1)


def write_catalog(path: Path) -> None:
    """The controller's catalog: one small model, started with the simulated engine on the node assigned it."""
    catalog = {
        "models": [
            {
                "id": ASSIGNED_MODEL,
                "config": EMBEDDED_MODEL,
                "command": SIMULATED_TEMPLATE,
                "workload": {"rate": 1.0, "input": 64, "output": 16, "observe": False},
            }
        ],
        "planning": {"interval_s": 2, "table_points": 4, "sim_duration_s": 5, "time_limit_s": 20},
    }
    path.write_text(yaml.safe_dump(catalog))


async def start_ingress(s: Shells, argv: Sequence[str], name: str = "step1-ingress") -> NodeProcess:
    """Step 1: the ingress prints its bootstrap address and answers /v1/models."""
    ingress = await s.start(name, localize(argv, s.ports))
    addr = (await s.wait_line(ingress, r"^bootstrap\s+(\S+)")).group(1)
    assert addr.endswith(f"127.0.0.1:{s.ports[4001]}"), f"the ingress prints bootstrap address {addr}"
    await s.wait_for(
        lambda: s.get_json(s.url(8092, "/v1/models")), timeout=30, what="the ingress's /v1/models"
    )
    return ingress


# --- the tests -----------------------------------------------------------------------------------------------


def test_readme_tour_has_the_shape_the_checks_need() -> None:
    """Reading alone, so a README edit that drops a step fails at once with the reason."""
    readme = read_readme()
    ingress = readme.steps[1][0]
    assert ingress[:3] == ["otela", "start", "--ingress"] and "--listen" in ingress and "--http" in ingress
    assert readme.steps[2][0][-2:] == ["--engine", "embedded"]
    assert any(a == "--" for a in readme.steps[3][0]) and "--process" in readme.steps[3][1]
    assert readme.steps[4][0][:2] == ["otela", "start"] and "CONTROLLER_PEER_ID" in readme.steps[4][0]
    assert readme.steps[4][1][:2] == ["otela", "controller"] and "catalog.yaml" in readme.steps[4][1]
    assert all(cmd[:2] == ["otela", "start"] and "--blocks" in cmd for cmd in readme.steps[5])
    assert readme.steps[6][0][:2] == ["otela", "status"] and readme.steps[6][1][0] == "curl"
    assert [a[:2] for a in readme.keys] == [["otela", "start"], ["otela", "frontend"], ["otela", "keys"]]
    assert "--frontend" in readme.keys[0] and readme.keys[2][2] == "create"
    with pytest.raises(AssertionError, match="steps and commands per step"):
        read_readme(README.read_text().replace("# 3. a provider", "# a provider"))


@pytest.mark.timeout(360)
async def test_quick_tour_as_written(shells: Shells) -> None:
    """Steps 1 to 6 and the openai snippet, each checked for what the README says it does."""
    s, readme = shells, read_readme()
    write_catalog(s.cwd / "catalog.yaml")
    started = time.monotonic()

    # 1. the ingress
    await start_ingress(s, readme.steps[1][0])

    # 2. the embedded engine: SmolLM2 at the ingress, and a chat completion through it answers
    provider = await s.start("step2-embedded", localize(readme.steps[2][0], s.ports))
    (embedded_peer,) = await serving_peers(s, EMBEDDED_MODEL, 1)
    served_after = time.monotonic() - started
    print(f"steps 1 and 2: {EMBEDDED_MODEL} served at the ingress {served_after:.1f} s after step 1 started")
    assert served_after < SERVED_WITHIN_S, f"SmolLM2 took {served_after:.1f} s to be served\n{s.tails()}"
    assert node_peer_id(provider) == embedded_peer
    status, body = await chat(s, s.url(8092), EMBEDDED_MODEL)
    assert answered(status, body), (status, body)

    # 3. both GPU commands (the simulated engine standing in): the model appears, once per command
    gpu = [await s.start(f"step3-gpu-{i}", localize(cmd, s.ports)) for i, cmd in enumerate(readme.steps[3])]
    gpu_peers = await serving_peers(s, GPU_MODEL, 2)
    assert gpu_peers == {node_peer_id(p) for p in gpu}
    status, body = await chat(s, s.url(8092), GPU_MODEL)
    assert answered(status, body), (status, body)

    # 4. an idle node listing the controller; the controller prints its peer id and assigns it work
    node_cmd, controller_cmd = readme.steps[4]
    controller_id = (await s.run([*localize(controller_cmd, s.ports), "--show-peer-id"])).strip()
    idle = await s.start("step4-idle", localize(node_cmd, s.ports, CONTROLLER_PEER_ID=controller_id))
    idle_peer = (await s.wait_line(idle, r"^node\s+(\S+)")).group(1)

    async def joined_idle() -> bool:
        table = await s.get_json(s.url(8092, "/v1/dnt/table")) or []
        return any(r["peer_id"] == idle_peer and r["lifecycle"] == "JOIN" and not r["models"] for r in table)

    await s.wait_for(joined_idle, timeout=60, what="the idle node to join with no model")
    controller = await s.start("step4-controller", localize(controller_cmd, s.ports))
    printed = (await s.wait_line(controller, r"^controller\s+(\S+)")).group(1)
    assert printed == controller_id, "the controller's peer id differs from what --show-peer-id printed"
    line = await s.wait_line(controller, r'^\{"event": "assign".*$', timeout=120)
    assignment = json.loads(line.group(0))
    # The assignment line names the model as the placement knows it (the catalog's config).
    assert assignment["ok"] and assignment["peer_id"] == idle_peer and assignment["model"] == EMBEDDED_MODEL
    assert await serving_peers(s, ASSIGNED_MODEL, 1, timeout=120) == {idle_peer}

    # 5. two block servers: each serves its half of SmolLM2's 30 blocks, and together they cover the model
    blocks = [
        await s.start(f"step5-blocks-{i}", localize(cmd, s.ports)) for i, cmd in enumerate(readme.steps[5])
    ]
    block_peers = [(await s.wait_line(p, r"^node\s+(\S+)")).group(1) for p in blocks]

    async def halves_served() -> list[list[int]] | None:
        table = await s.get_json(s.url(8092, "/v1/dnt/table")) or []
        spans = [
            [b["start"], b["end"]]
            for r in table
            if r["peer_id"] in block_peers and r["lifecycle"] == "SERVING"
            for b in r.get("blocks", [])
            if b["model"] == EMBEDDED_MODEL
        ]
        return sorted(spans) if len(spans) == len(blocks) else None

    spans = await s.wait_for(halves_served, timeout=120, what="the block servers to serve their ranges")
    assert spans[0][0] == 0 and spans[-1][1] == 30 and spans[0][1] == spans[1][0], spans

    # 6. otela status lists every node; curl lists every model
    table = await s.run(localize(readme.steps[6][0], s.ports))
    for proc in [provider, *gpu, idle, *blocks]:
        assert node_peer_id(proc)[-8:] in table, f"otela status does not list {proc.name}:\n{table}"
    assert "controller" in table and "ingress" in table, table
    listing = json.loads(await s.run(localize(readme.steps[6][1], s.ports)))
    assert {EMBEDDED_MODEL, GPU_MODEL, ASSIGNED_MODEL} <= {m["id"] for m in listing["data"]}, listing

    # The openai client, as in the snippet.
    snippet = s.cwd / "tour_client.py"
    snippet.write_text(local_text(readme.snippet, s.ports))
    reply = await s.run([sys.executable, str(snippet)])
    assert reply.strip(), "the openai snippet printed no answer"


@pytest.mark.timeout(240)
async def test_api_keys_section_as_written(shells: Shells) -> None:
    """Ingress with the frontend, the stand-alone frontend, and a key made by `otela keys create` that works."""
    s, readme = shells, read_readme()
    combined_cmd, frontend_cmd, keys_cmd = readme.keys

    # The ingress with its frontend in one process (it joins nobody), and the tour's provider joining it. Both
    # frontends here share one SQLite file where the README gives the second PostgreSQL, so both admit through the
    # database as replicas on PostgreSQL do (in-memory admission is for a file one frontend has alone).
    shared = {"OTELA_FRONTEND_ADMISSION": "database"}
    combined = await s.start("keys-ingress-frontend", localize(combined_cmd, s.ports), **shared)
    bootstrap = (await s.wait_line(combined, r"^bootstrap\s+(\S+)")).group(1)
    dashboard = (await s.wait_line(combined, r"^frontend\s+(\S+)/ \(dashboard\)")).group(1)
    assert dashboard == s.url(8093), f"the dashboard is at {dashboard}, the README says :8093"
    # The provider's INGRESS_HOST:4001 is this ingress's printed address (it listens where the default puts it).
    tour_address = f"127.0.0.1:{s.ports[4001]}"
    worker_cmd = [bootstrap if a == tour_address else a for a in localize(readme.steps[2][0], s.ports)]
    await s.start("keys-provider", worker_cmd)
    await serving_peers(s, EMBEDDED_MODEL, 1)

    async def dashboard_page() -> bool:
        async with s.session().get(s.url(8093, "/")) as resp:
            return resp.status == 200 and "text/html" in resp.headers.get("Content-Type", "")

    assert await dashboard_page()

    # The stand-alone frontend in front of the same ingress, on the database the other commands use.
    db_file = s.home / ".local" / "share" / "opentela" / "frontend.db"
    assert str(db_file) in (await s.wait_line(combined, r"^database\s.*$")).group(0), combined.log_tail()
    db = f"sqlite:///{db_file}"
    standalone = await s.start(
        "keys-frontend",
        localize(frontend_cmd, s.ports, db=db),
        OTELA_FRONTEND_HTTP=f"127.0.0.1:{free_port()}",
        **shared,
    )
    alone = (await s.wait_line(standalone, r"^frontend\s+(\S+)/ \(dashboard\)")).group(1)

    # The key is printed once, on a line of its own, and works through both frontends; a wrong one gets 401.
    key = (await s.run(localize(keys_cmd, s.ports))).strip()
    assert key and len(key.splitlines()) == 1, f"otela keys create printed {key!r}"
    for base in (dashboard, alone):
        status, body = await chat(s, base, EMBEDDED_MODEL, key)
        assert answered(status, body), (base, status, body, s.tails())
        status, body = await chat(s, base, EMBEDDED_MODEL, key[:-4] + "xxxx")
        assert status == 401, (base, status, body)


@pytest.mark.timeout(240)
async def test_identical_workers_on_one_host_are_two_replicas(shells: Shells) -> None:
    """Step 2's command run twice on one machine, same HOME and flags: two nodes, two replicas."""
    s, readme = shells, read_readme()
    await start_ingress(s, readme.steps[1][0])
    command = localize(readme.steps[2][0], s.ports)
    workers = [await s.start(f"worker-{i}", command) for i in range(2)]
    peers = await serving_peers(s, EMBEDDED_MODEL, 2)
    assert peers == {node_peer_id(w) for w in workers} and len(peers) == 2
    replicas = (await models(s))[EMBEDDED_MODEL].get("replicas", [])
    assert len([r for r in replicas if r.get("state") == "SERVING"]) == 2, replicas
