"""The PostgreSQL and network-namespace fixtures work from a non-login shell, whose PATH lacks the sbin folders
(where Debian keeps runuser, nft and often ip): one test of each, run by pytest with PATH=/usr/bin:/bin, passes."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests_support_netns import require_netns

from system_tools import postgres_bindir

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHORT_PATH = "/usr/bin:/bin"
# Small ones: a store test on a real PostgreSQL (runuser, initdb, pg_ctl, createdb) and the NAT test's private
# case (ip netns, veth links, nft inside a namespace).
TESTS = (
    "tests/frontend/test_store.py::test_revoke_rotate_expire[postgresql]",
    "tests/integration/test_nat.py::test_private_worker_serves_through_a_relay[private]",
)


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case of a JUnit XML report and how it ended: passed, skipped: <why>, failed or error."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag == "skipped":
                outcome = f"skipped: {child.get('message', '')}"
            elif child.tag in ("failure", "error"):
                outcome = child.tag
        result[f"{case.get('classname')}.{case.get('name')}"] = outcome
    return result


@pytest.mark.timeout(420)
def test_postgres_and_netns_fixtures_run_with_a_path_without_sbin(tmp_path: Path) -> None:
    # Where the tools truly cannot run (not root, no PostgreSQL and no way to install it), the inner run would
    # skip too: skip here with the same reason instead of failing.
    require_netns()
    if postgres_bindir() is None and os.geteuid() != 0:
        pytest.skip("PostgreSQL is not installed and installing it (apt-get) needs root")
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "PATH": SHORT_PATH}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *TESTS]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    report = f"PATH={SHORT_PATH} pytest exited {run.returncode}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert junit.exists(), report
    seen = outcomes(junit)
    assert len(seen) == len(TESTS), report
    assert all(outcome == "passed" for outcome in seen.values()), f"{seen}\n{report}"
    assert run.returncode == 0, report
