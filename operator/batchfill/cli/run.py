"""`batchfill run`: the operator (kopf), configured by BATCHFILL_* environment variables and the flags.

With leader election on (batchfill.controller.settings), the process first waits for the Lease and runs the
handlers only while it holds it. Bad settings exit 2 with one line per variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import kopf
from kubernetes import client
from pydantic import ValidationError
from rich.console import Console

from batchfill.adapters import memory, operator_metrics
from batchfill.adapters.kube import load_config
from batchfill.adapters.leader import LeaderElector, StandbyHealth, default_identity
from batchfill.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err_line
from batchfill.controller.settings import OperatorSettings, describe_errors


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Run the operator (kopf) until interrupted; with leader election, only while holding the Lease."""
    try:
        settings = OperatorSettings.from_env(
            prometheus_url=args.prometheus_url,
            namespaces=tuple(n for n in (args.namespaces or "").split(",") if n) or None,
            log_format=args.log_format,
            metrics_port=args.metrics_port,
            reconcile_interval_s=args.interval,
        )
    except ValidationError as e:
        for problem in describe_errors(e):
            err_line(err, f"setting {problem}")
        return EXIT_USAGE
    kopf.configure(
        verbose=args.verbose, log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    import batchfill.controller.handlers  # noqa: F401  (registers the handlers, once kopf is configured)

    memory.limit_arenas()  # before any of the operator's threads allocates

    elector = None
    if settings.leader_election:
        elector = _lead_or_wait(settings, args.liveness)
        if elector is None:
            return EXIT_OK  # stopped (SIGTERM/SIGINT) while standing by
    operator_metrics.LEADER.set(1)
    try:
        kopf.run(
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            memo=kopf.Memo(settings=settings, elector=elector),  # elector: None without leader election
            liveness_endpoint=args.liveness,
        )
    finally:
        operator_metrics.LEADER.set(0)
        if elector is not None:
            elector.stop(release=True)  # kopf and the loops have stopped: a standby may take over at once
    return EXIT_OK


def _lead_or_wait(settings: OperatorSettings, liveness: str | None) -> LeaderElector | None:
    """Block until this process holds the leader-election Lease; None when stopped while waiting.

    While waiting, the liveness endpoint answers 200 (a standby is healthy) and /metrics is served with
    batchfill_operator_leader 0. Once leading, a daemon thread renews the Lease; when a renewal fails for the renew
    deadline or another holder shows up, the process exits at once with status 1 (as controller-runtime), so that
    nothing acts without the Lease and the pod restarts as a standby.
    """
    log = logging.getLogger("batchfill.leader")

    def lost(reason: str) -> None:
        log.critical("leader election lost (%s): exiting so that nothing acts without the Lease", reason)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)  # at once, not a graceful kopf shutdown: a standby may be acting soon

    load_config()
    elector = LeaderElector(
        client.ApiClient(),
        settings.leader_election_lease_name,
        settings.leader_election_namespace,
        default_identity(),
        settings.lease_timing,
        on_lost=lost,
    )
    operator_metrics.serve(settings.metrics_port)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    standby = StandbyHealth(liveness, lambda: {"leader": False, "identity": elector.identity}) if liveness else None
    try:
        acquired = elector.acquire(stop)
    finally:
        if standby is not None:
            standby.close()  # kopf opens the same endpoint
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not acquired:
        return None
    elector.start_renewing()
    return elector
