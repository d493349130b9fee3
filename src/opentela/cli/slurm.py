"""`otela slurm`: a batch script that runs a worker node inside a Slurm allocation, optionally submitted.

The job runs `otela start ... -- ENGINE` in the foreground of the batch shell. Two ways keep a model served
across allocations that end (typically after 12 hours):

- `--renew`: Slurm signals the batch shell (`--signal=B:USR1@N`) N seconds before the time limit, and the
  shell submits this same script again. The successor queues while this job still serves, so it can start and
  load the model before this one is stopped; a new node joins under a new session id and the old one leaves.
  (`--dependency=singleton` was rejected: the successor could only start after this job ended, so every
  renewal would leave a gap of at least the queue wait plus the model's load time.)
- `--requeue`: Slurm may put the job back in the queue after a node failure or a preemption, under the same
  job id; the worker rejoins with a new session id.

At the end (time limit, `scancel`, preemption) Slurm sends SIGTERM to every process of the job: the node writes
LEFT, tells its peers and stops its engine before Slurm's SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentela.errors import ConfigError, OpenTelaError

_TIME_FORMATS = (
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
)


def time_limit_seconds(text: str) -> int:
    """Seconds in a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    for pattern in _TIME_FORMATS:
        found = pattern.match(text.strip())
        if found:
            parts = {k: int(v) for k, v in found.groupdict().items() if v is not None}
            total = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60
            total += parts.get("s", 0)
            if total <= 0:
                break
            return total
    raise ConfigError(
        f"--time {text!r}: give a positive Slurm time limit (MM, HH:MM:SS or D-HH:MM:SS, e.g. 12:00:00)"
    )


def current_otela() -> list[str]:
    """The command that runs this very `otela`, absolute, so the job uses the same installation."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "otela" and argv0.exists():
        return [str(argv0.absolute())]
    return [sys.executable, "-m", "opentela"]


@dataclass(frozen=True)
class SlurmJob:
    """Everything one worker job script says."""

    script_path: Path
    otela_cmd: tuple[str, ...]
    start_args: tuple[str, ...]
    engine_command: tuple[str, ...]
    job_name: str = "otela-worker"
    time_limit: str = "12:00:00"
    gpus: int = 1
    partition: str = ""
    cpus_per_task: int = 0
    job_log: str = ""
    requeue: bool = False
    renew_before_s: int = 0
    sbatch_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        limit = time_limit_seconds(self.time_limit)
        if self.gpus < 0 or self.cpus_per_task < 0:
            raise ConfigError("--gpus and --cpus-per-task must be >= 0")
        if self.renew_before_s and self.renew_before_s >= limit:
            raise ConfigError(
                f"--renew-before ({self.renew_before_s // 60} min) must be shorter than --time {self.time_limit}"
            )
        if self.renew_before_s and "--key-file" in self.start_args:
            raise ConfigError(
                "--key-file with --renew: the successor would serve beside this job under the same peer id; "
                "leave --key-file out (each job then makes its own key)"
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.job_name):
            raise ConfigError(f"--job-name {self.job_name!r}: use letters, digits, '.', '_' and '-'")

    def sbatch_lines(self) -> list[str]:
        """The #SBATCH directives."""
        log = self.job_log or str(self.script_path.parent / f"{self.job_name}-%j.out")
        opts = [
            f"--job-name={self.job_name}",
            "--nodes=1",
            "--ntasks=1",
            f"--time={self.time_limit}",
            f"--output={log}",
        ]
        if self.gpus:
            opts.append(f"--gres=gpu:{self.gpus}")
        if self.cpus_per_task:
            opts.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.requeue:
            opts += ["--requeue", "--open-mode=append"]  # a requeued run appends to the same log
        if self.renew_before_s:
            opts.append(f"--signal=B:USR1@{self.renew_before_s}")
        opts += list(self.sbatch_options)
        return [f"#SBATCH {opt}" for opt in opts]


def _array(values: Sequence[str]) -> str:
    return "(" + " ".join(shlex.quote(v) for v in values) + ")"


def render_script(job: SlurmJob) -> str:
    """The batch script (bash) for `job`."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [
        "#!/bin/bash",
        f"# OpenTela worker node, written by `otela slurm` on {stamp}.",
        *job.sbatch_lines(),
        "",
        f"OTELA={_array(job.otela_cmd)}",
        f"START={_array(['start', *job.start_args])}",
        *(
            []
            if "--key-file" in job.start_args
            else [
                "# A key of its own for each job: jobs of one user share a home directory, and two nodes must",
                "# never share a peer id (a renewed job serves beside its predecessor for a while).",
                'KEY_FILE="${TMPDIR:-/tmp}/otela-node-${SLURM_JOB_ID:-$$}.key"',
                'START+=(--key-file "$KEY_FILE")',
            ]
        ),
        f"ENGINE={_array(job.engine_command)}",
        f"SCRIPT={shlex.quote(str(job.script_path))}",
        "",
    ]
    if job.renew_before_s:
        lines += [
            "# Slurm sends USR1 to this shell before the time limit: queue a successor now, so it can start and",
            "# load the model while this job still serves. This job then leaves (LEFT) at its time limit.",
            "renew() {",
            "    trap '' USR1",
            '    if successor=$(sbatch --parsable "$SCRIPT"); then',
            '        echo "otela-slurm: job ${SLURM_JOB_ID:-?} submitted successor job ${successor%%;*}" >&2',
            "    else",
            '        echo "otela-slurm: job ${SLURM_JOB_ID:-?} could not submit a successor" >&2',
            "    fi",
            "}",
            "trap renew USR1",
            "",
        ]
    lines += [
        "# scancel and the time limit signal every process of the job; a signal sent to this shell alone",
        "# is passed on, so the node always leaves in order (LEFT) and stops its engine.",
        "trap 'kill -TERM \"$node\" 2>/dev/null' TERM INT",
        "",
        "if [ ${#ENGINE[@]} -gt 0 ]; then",
        '    "${OTELA[@]}" "${START[@]}" -- "${ENGINE[@]}" &',
        "else",
        '    "${OTELA[@]}" "${START[@]}" &',
        "fi",
        "node=$!",
        "# `wait` returns early when a trapped signal arrives; keep waiting while the node runs.",
        "while :; do",
        '    wait "$node"',
        '    kill -0 "$node" 2>/dev/null || break',
        "done",
        'wait "$node"',
        "status=$?",
        *([] if "--key-file" in job.start_args else ['rm -f "$KEY_FILE"']),
        'echo "otela-slurm: node exited with status $status" >&2',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def start_argv(args: argparse.Namespace, start_flags: Sequence[argparse.Action]) -> list[str]:
    """The `otela start` flags (the options `start_flags`) given in `args`, as a command line again."""
    out: list[str] = []
    for action in start_flags:
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.dest == "config":
            value = os.path.abspath(value)  # the job may start elsewhere
        if action.nargs == 0:  # a switch such as --ingress: it takes no value
            out.append(flag)
        elif isinstance(value, list):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, str(value)]
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `otela slurm`: every `otela start` flag, and the Slurm job's own."""
    from opentela.cli import start

    # The start flags go into the namespace too, so that `run` knows which of the given flags to pass on.
    p.set_defaults(start_flags=tuple(start.add_arguments(p)))
    p.description = (
        "Write a batch script running `otela start [flags] -- ENGINE` in a Slurm job; "
        "every `otela start` flag given here is passed on."
    )
    g = p.add_argument_group("Slurm job")
    g.add_argument(
        "--gpus", type=int, default=1, help="GPUs for the engine (--gres=gpu:N; 0: none; default 1)"
    )
    g.add_argument("--time", default="12:00:00", help="time limit, Slurm format (default 12:00:00)")
    g.add_argument("--partition", default="", help="partition to run in")
    g.add_argument("--job-name", default="otela-worker", help="job name (default otela-worker)")
    g.add_argument("--cpus-per-task", type=int, default=0, metavar="N", help="CPUs for the job")
    g.add_argument(
        "--requeue", action="store_true", help="let Slurm requeue the job after a node failure or preemption"
    )
    g.add_argument(
        "--renew",
        action="store_true",
        help="before the time limit, submit a successor job so the model stays served",
    )
    g.add_argument(
        "--renew-before",
        type=float,
        default=10.0,
        metavar="MIN",
        help="minutes before the time limit to submit the successor (default 10)",
    )
    g.add_argument("--output", metavar="PATH", help="where to write the script (default ./JOB_NAME.sbatch)")
    g.add_argument("--job-log", metavar="PATH", default="", help="job output (default next to the script)")
    g.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra #SBATCH option, e.g. --sbatch-option=--account=lab (repeatable)",
    )
    g.add_argument("--otela-cmd", metavar="CMD", help="command running otela in the job (default: this one)")
    g.add_argument("--submit", action="store_true", help="submit the script with sbatch; print the job id")


def job_from_args(args: argparse.Namespace) -> SlurmJob:
    """The job the flags describe."""
    if args.renew and not args.renew_before * 60 >= 1:
        raise ConfigError(f"--renew-before {args.renew_before:g}: give a positive number of minutes")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    script = Path(args.output or f"{args.job_name}.sbatch").absolute()
    return SlurmJob(
        script_path=script,
        otela_cmd=tuple(shlex.split(args.otela_cmd) if args.otela_cmd else current_otela()),
        start_args=tuple(start_argv(args, args.start_flags)),
        engine_command=tuple(command),
        job_name=args.job_name,
        time_limit=args.time,
        gpus=args.gpus,
        partition=args.partition,
        cpus_per_task=args.cpus_per_task,
        job_log=args.job_log,
        requeue=args.requeue,
        renew_before_s=round(args.renew_before * 60) if args.renew else 0,
        sbatch_options=tuple(args.sbatch_option),
    )


def submit(script: Path, sbatch: str = "sbatch") -> str:
    """Submit `script`; return the job id."""
    exe = shutil.which(sbatch)
    if exe is None:
        raise ConfigError(f"{sbatch} not found: run on a Slurm login node, or leave out --submit")
    try:
        result = subprocess.run(
            [exe, "--parsable", str(script)], capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise OpenTelaError("sbatch did not answer within 120 s") from exc
    if result.returncode != 0:
        raise OpenTelaError(f"sbatch refused {script}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip().split(";")[0]


def run(args: argparse.Namespace) -> int:
    """`otela slurm`: write the script; print it, or submit it and print the job id."""
    job = job_from_args(args)
    text = render_script(job)
    try:
        job.script_path.parent.mkdir(parents=True, exist_ok=True)
        job.script_path.write_text(text)
        job.script_path.chmod(0o755)
    except OSError as exc:
        raise ConfigError(f"cannot write {job.script_path}: {exc}") from exc
    print(f"wrote {job.script_path}", file=sys.stderr)
    if not args.submit:
        print(text, end="")
        print(f"submit with: sbatch {shlex.quote(str(job.script_path))}", file=sys.stderr)
        return 0
    job_id = submit(job.script_path)
    print(f"submitted job {job_id}", file=sys.stderr)
    print(job_id)
    return 0
