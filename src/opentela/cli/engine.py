"""`otela engine`: run an engine (embedded llama.cpp, the tensor-parallel engine or the simulated server) in the
foreground."""

from __future__ import annotations

import argparse

from opentela._logging import LogConfig, setup_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per engine, each with that engine's flags."""
    from opentela.engines import embedded, simulated_config
    from opentela.engines.tp import server as tp_server

    engines = parser.add_subparsers(dest="engine_cmd", required=True, metavar="ENGINE")
    embedded.add_arguments(
        engines.add_parser("embedded", help="SmolLM2-135M-Instruct on llama.cpp (xllamacpp), CPU")
    )
    tp_server.add_arguments(
        engines.add_parser(
            "tp",
            help="a model over local tensor-parallel rank processes (NumPy, CPU) that survives losing a rank",
        )
    )
    simulated_config.add_simulated_arguments(
        engines.add_parser(
            "simulated",
            help="a SIMULATED OpenAI server for one or more models, with configurable timing and failures",
        )
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM."""
    # An engine is a child of its node, which reads the node's log settings; the engine logs at INFO as text.
    setup_logging(LogConfig())
    if args.engine_cmd == "embedded":
        from opentela.engines.embedded import run_from_args

        run_from_args(args)
    elif args.engine_cmd == "tp":
        from opentela.engines.tp.server import run_from_args as run_tp

        run_tp(args)
    else:
        from opentela.engines.simulated import run_simulated
        from opentela.engines.simulated_config import simulated_config_from_args

        run_simulated(simulated_config_from_args(args))
    return 0
