"""`otela slurm --submit` against a real single-node Slurm: the job's worker serves through the ingress, and
cancelling the job takes it out (LEFT) while requests keep succeeding on another replica."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests_support_slurm import SlurmCluster, SlurmUnavailable, ensure_installed

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "sim-model"
SIMULATED = [*OTELA, "engine", "simulated", "--model", MODEL]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd for this host, installed with apt-get if missing; skipped where impossible."""
    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


def job_logs(directory: Path, job_name: str) -> str:
    """Every job log of `job_name` in `directory`, oldest job first."""
    return "".join(p.read_text(errors="replace") for p in sorted(directory.glob(f"{job_name}-*.out")))


async def chat(mesh: LocalMesh) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with asyncio.timeout(30), mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Otela-Provider", "")


async def slurm_record(mesh: LocalMesh) -> dict[str, Any] | None:
    table = await mesh.get_json("/dnt/table") or []
    return next((r for r in table if r["provider_id"] == "lab-slurm"), None)


@pytest.mark.timeout(240)
async def test_submitted_worker_serves_and_leaves_when_the_job_is_cancelled(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "worker.sbatch"
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("local", SIMULATED, provider="lab-local")
        submit = await asyncio.create_subprocess_exec(
            *OTELA,
            "slurm",
            "--submit",
            "--bootstrap",
            mesh.bootstrap,
            "--provider-id",
            "lab-slurm",
            "--listen",
            "127.0.0.1:0",
            "--key-file",
            str(tmp_path / "slurm-worker.key"),
            "--log-dir",
            str(tmp_path / "slurm-logs"),
            "--gpus",
            "0",
            "--time",
            "10",
            "--job-name",
            "otela-test",
            "--output",
            str(script),
            "--",
            *SIMULATED,
            env=slurm.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(submit.communicate(), 60)
        assert submit.returncode == 0, err.decode()
        job_id = out.decode().strip()
        assert job_id.isdigit(), (out, err)
        assert f"submitted job {job_id}" in err.decode()
        job_log = tmp_path / f"otela-test-{job_id}.out"

        async def job_failed() -> str:
            log = job_log.read_text(errors="replace") if job_log.exists() else "(no job log yet)"
            return f"job {job_id} state {slurm.job_state(job_id)!r}\n--- job log ---\n{log}\n{slurm.logs()}"

        try:

            async def serving() -> dict[str, Any] | None:
                record = await slurm_record(mesh)
                return record if record and record["lifecycle"] == "SERVING" else None

            before = await mesh.wait_for(serving, timeout=120, what="the Slurm job's worker to be SERVING")
            await mesh.wait_serving(MODEL, 2, timeout=30)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{await job_failed()}") from None
        assert slurm.job_state(job_id) == "RUNNING"

        results: list[tuple[int, str]] = []
        stop = asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                results.append(await chat(mesh))

        loader = asyncio.create_task(load())
        try:
            await mesh.wait_for(
                lambda: asyncio.sleep(0, result=any(p == "lab-slurm" for _, p in results)),
                timeout=30,
                what="a request served by the Slurm job",
            )
            slurm.run("scancel", job_id)

            async def gone() -> dict[str, Any] | None:
                record = await slurm_record(mesh)
                return record if record and record["lifecycle"] in ("DOWN", "LEFT") else None

            after = await mesh.wait_for(gone, timeout=60, what="the cancelled job's worker to leave")
            served_before = len(results)
            await mesh.wait_for(
                lambda: asyncio.sleep(0, result=len(results) >= served_before + 20),
                timeout=30,
                what="20 more requests",
            )
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await loader

        async def job_ended() -> bool:
            return await asyncio.to_thread(slurm.job_state, job_id) in ("", "COMPLETED", "CANCELLED")

        await mesh.wait_for(job_ended, timeout=60, what=f"job {job_id} to end")

    assert after["session_id"] == before["session_id"]
    assert after["lifecycle"] == "LEFT", await job_failed()
    assert {status for status, _ in results} == {200}, [r for r in results if r[0] != 200]
    assert {p for _, p in results[served_before:]} == {"lab-local"}
    log = job_log.read_text()
    assert "otela-slurm: node exited with status 0" in log, log


@pytest.mark.timeout(240)
async def test_renewal_submits_a_successor_that_serves_before_the_job_ends(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """A one-minute job with --renew: Slurm's warning signal makes it queue its successor, which serves while the
    first still does; when the first ends (here cancelled: Slurm's time limit sends the same SIGTERM) the model
    is still served."""
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        submit = await asyncio.create_subprocess_exec(
            *OTELA,
            "slurm",
            "--submit",
            "--bootstrap",
            mesh.bootstrap,
            "--provider-id",
            "lab-slurm",
            "--listen",
            "127.0.0.1:0",
            "--log-dir",
            str(tmp_path / "slurm-logs"),
            "--gpus",
            "0",
            "--time",
            "1",
            "--renew",
            "--renew-before",
            "0.5",
            "--job-name",
            "otela-renew",
            "--output",
            str(tmp_path / "renew.sbatch"),
            "--",
            *SIMULATED,
            env=slurm.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(submit.communicate(), 60)
        assert submit.returncode == 0, err.decode()
        first_job = out.decode().strip()

        async def serving() -> list[dict[str, Any]]:
            table = await mesh.get_json("/dnt/table") or []
            return [r for r in table if r["provider_id"] == "lab-slurm" and r["lifecycle"] == "SERVING"]

        try:
            first = (await mesh.wait_for(serving, timeout=120, what="the first job's worker"))[0]

            async def both_serving() -> list[dict[str, Any]] | None:
                live = await serving()
                return (
                    live
                    if len(live) >= 2 and first["session_id"] in {r["session_id"] for r in live}
                    else None
                )

            # Slurm sends the warning signal 30 s (up to a minute) before the limit of this one-minute job.
            both = await mesh.wait_for(
                both_serving, timeout=150, what="the successor to serve beside the first"
            )
            jobs = slurm.run("squeue", "-h", "-n", "otela-renew", "-o", "%i", check=False).stdout.split()
            slurm.run("scancel", first_job)

            async def first_left() -> list[dict[str, Any]] | None:
                live = await serving()
                return live if first["session_id"] not in {r["session_id"] for r in live} else None

            after = await mesh.wait_for(first_left, timeout=60, what="the first job's worker to leave")
        finally:
            slurm.run("scancel", "-n", "otela-renew", check=False)
        table = await mesh.get_json("/dnt/table") or []
        logs = job_logs(tmp_path, "otela-renew")

    assert f"otela-slurm: job {first_job} submitted successor job" in logs, logs
    assert first_job in jobs and len(jobs) >= 2, jobs
    successor = next(r for r in both if r["session_id"] != first["session_id"])
    assert successor["session_id"] in {r["session_id"] for r in after}  # still serving after the first left
    assert next(r for r in table if r["session_id"] == first["session_id"])["lifecycle"] == "LEFT"
