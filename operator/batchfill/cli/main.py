"""`batchfill` command line: plan, crd (and, as they land, the operator and its tools).

Exit codes: 0 success, 2 bad input (one line per problem, each naming its field path), 1 an internal or
environment failure (still one line, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.table import Table

from batchfill import __version__
from batchfill.api.errors import Problem, SpecError
from batchfill.api.validate import load_model, parse_documents
from batchfill.policy.plan import PlanResult, plan_batching, replicas_for

if TYPE_CHECKING:
    from batchfill.adapters.leader import LeaderElector
    from batchfill.controller.settings import OperatorSettings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _err(console: Console, line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _read(path: str) -> str:
    """The file's text. Raises SpecError for bytes that are not UTF-8 (YAML is text)."""
    try:
        if path == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError([Problem("(file)", f"is not UTF-8 text (byte {e.start}): not a YAML document")]) from None


def plan_document(doc: Any, rps: float | None, seed: int) -> dict[str, Any]:
    """Plan one parsed document; the JSON shape of `batchfill plan -o json`.

    Raises:
        SpecError: bad or infeasible spec (field-named problems).
    """
    from batchfill.render import render_model_config

    bm = load_model(doc)
    if not bm.spec.profile:
        raise SpecError(
            [
                Problem(
                    "spec.profile",
                    "is required to plan: give each batch size's execution latency (measure it with "
                    "`batchfill profile`)",
                )
            ]
        )
    result = plan_batching(bm.spec, seed=seed)
    status = result.to_status()
    out: dict[str, Any] = {
        "name": bm.metadata.name,
        "plan": status.model_dump(mode="json", exclude_none=True),
        "seedRule": status.seedRule.model_dump(mode="json") if status.seedRule else None,
        "config": render_model_config(bm.spec, status),
        # the reason's plain value: yaml.safe_dump (``-o yaml``) refuses str subclasses such as a StrEnum
        "warnings": [{"reason": w.reason.value, "path": w.path, "message": w.message} for w in result.warnings],
    }
    if rps is not None:
        s = bm.spec.scaling
        out["replicas"] = {
            "requestRate": rps,
            "replicas": replicas_for(
                rps, result.chosen.capacity_rps, s.targetUtilization, s.minReplicas, s.maxReplicas
            ),
            "targetUtilization": s.targetUtilization,
            "lowerBoundGpus": round(rps / result.chosen.capacity_rps * max(1, bm.spec.triton.gpusPerReplica), 3)
            if result.chosen.capacity_rps > 0
            else None,
        }
    out["_result"] = result
    return out


def _table(console: Console, planned: dict[str, Any]) -> None:
    result: PlanResult = planned["_result"]
    plan, seed = planned["plan"], planned["seedRule"]
    console.rule(f"[bold]{planned['name']}[/bold]: config.pbtxt")
    console.print(planned["config"], markup=False, highlight=False)
    t = Table(title=f"Batching plan for {planned['name']}", show_header=True, header_style="bold")
    t.add_column("", no_wrap=True)
    t.add_column("seed rule (D = S - l(B) - N)", justify="right")
    t.add_column("chosen plan", justify="right")
    t.add_row(
        "max_batch_size",
        str(seed["maxBatchSize"]) if seed else "-",
        str(plan["maxBatchSize"]),
    )
    t.add_row(
        "preferred_batch_size",
        str([seed["maxBatchSize"]]) if seed else "-",
        str(plan.get("preferredBatchSizes", [])),
    )
    t.add_row(
        "max_queue_delay_microseconds",
        str(seed["maxQueueDelayMicroseconds"]) if seed else "-",
        str(plan["maxQueueDelayMicroseconds"]),
    )
    t.add_row(
        "capacity per replica at SLA (req/s)",
        f"{seed['capacityPerReplicaRps']:.1f}" if seed else "-",
        f"{plan['capacityPerReplicaRps']:.1f}",
    )
    t.add_row("simulated p99 at that capacity (ms)", "", f"{plan['predictedP99Ms']:.2f}")
    t.add_row("server budget T = S - N (ms)", "", f"{plan['serverBudgetMs']:g}")
    t.add_row("minimum client timeout (ms)", "", f"{plan['minClientTimeoutMs']:.1f}")
    t.add_row("instance_group count", "", str(plan["instanceCount"]))
    if "replicas" in planned:
        r = planned["replicas"]
        t.add_row(f"replicas for {r['requestRate']:g} req/s (u={r['targetUtilization']:g})", "", str(r["replicas"]))
        if r["lowerBoundGpus"] is not None:
            t.add_row("GPU lower bound  λ / capacity", "", f"{r['lowerBoundGpus']:.2f}")
    console.print(t)
    console.print(f"rule: {plan['rule']}", markup=False, highlight=False)
    for w in planned["warnings"]:
        console.print(f"warning ({w['reason']}): {w['message']}", markup=False, highlight=False)
    evaluated = [c for c in result.candidates if not c.pruned]
    console.print(
        f"{len(result.candidates)} candidates, {len(evaluated)} simulated, "
        f"{len(result.candidates) - len(evaluated)} pruned (full batches could not beat the best)",
        highlight=False,
    )


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    try:
        docs = parse_documents(_read(args.file))
    except OSError as e:
        _err(err, f"{args.file}: cannot read: {e.strerror or e}")
        return EXIT_USAGE
    except SpecError as e:
        for p in e.problems:
            _err(err, f"{args.file}: {p}")
        return EXIT_USAGE
    if not docs:
        _err(err, f"{args.file}: no YAML documents")
        return EXIT_USAGE
    planned: list[dict[str, Any]] = []
    failed = False
    for i, doc in enumerate(docs):
        label = f"{args.file}" + (f" (document {i + 1})" if len(docs) > 1 else "")
        try:
            planned.append(plan_document(doc, args.rps, args.seed))
        except SpecError as e:
            failed = True
            for p in e.problems:
                _err(err, f"{label}: {p}")
    public = [{k: v for k, v in one.items() if not k.startswith("_")} for one in planned]
    if args.output == "json":
        payload: Any = public[0] if len(public) == 1 else public
        print(json.dumps(payload, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump_all(public, sort_keys=False), end="")
    else:
        for one in planned:
            _table(out, one)
    # the documents that planned are printed; any that did not make the exit code 2
    return EXIT_USAGE if failed else EXIT_OK


def _one_model(path: str, command: str, err: Console) -> Any:
    """The single BatchedModel of ``path``, or the exit code after printing why (one line per problem)."""
    try:
        docs = parse_documents(_read(path))
        if len(docs) != 1:
            _err(err, f"{path}: `batchfill {command}` takes one BatchedModel, found {len(docs)} documents")
            return EXIT_USAGE
        return load_model(docs[0])
    except OSError as e:
        _err(err, f"{path}: cannot read: {e.strerror or e}")
        return EXIT_USAGE
    except SpecError as e:
        for p in e.problems:
            _err(err, f"{path}: {p}")
        return EXIT_USAGE


def cmd_simulate(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A BatchedModel against a trace under batchfill's policy and the baselines (fleet simulator)."""
    from batchfill.cli.simulate import TraceOptions, parse_duration, run_simulation
    from batchfill.compare.run import CompareError, Options

    bm = _one_model(args.file, "simulate", err)
    if isinstance(bm, int):
        return bm
    try:
        numbers = {"--mean-rps": args.mean_rps, "--peak-rps": args.peak_rps, "--startup": args.startup}
        for flag, value in numbers.items():
            if value is not None and not (value >= 0 and value != float("inf")):
                raise ValueError(f"{flag}={value} must be a finite number >= 0")
        if args.mean_rps is not None and args.mean_rps == 0:
            raise ValueError("--mean-rps=0 must be > 0 req/s")
        if not 0 < args.hpa_gpu_target <= 100:
            raise ValueError(f"--hpa-gpu-target={args.hpa_gpu_target} must be a percentage in (0, 100]")
        if args.seed < 0:
            raise ValueError(f"--seed={args.seed} must be >= 0")
        trace_opts = TraceOptions(
            kind=args.trace,
            mean_rps=args.mean_rps,
            duration_s=parse_duration(args.duration, "--duration") if args.duration else None,
            peak_to_trough=args.peak_to_trough,
            cv=args.cv,
            peak_rps=args.peak_rps,
            start_s=parse_duration(args.start, "--start") if args.start else None,
            length_s=parse_duration(args.length, "--length") if args.length else None,
            rates_file=args.rates,
            seed=args.seed,
        )
        options = Options(startup_s=args.startup, hpa_gpu_target=args.hpa_gpu_target / 100.0, seed=args.seed)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        run_simulation(
            bm.spec,
            trace_opts,
            policies,
            options,
            out,
            err,
            plot=None if args.plot == "" else Path(args.plot),
            json_path=Path(args.json) if args.json else None,
        )
    except SpecError as e:
        for p in e.problems:
            _err(err, f"{args.file}: {p}")
        return EXIT_USAGE
    except (CompareError, ValueError) as e:
        _err(err, f"{args.file}: {e}")
        return EXIT_USAGE
    return EXIT_OK


def cmd_profile(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Measure a live model's execution latency per batch size; print the profile and the plan it gives.

    Bad flags, a bad -f file, and batch sizes the server's model cannot take exit 2 before anything is printed
    or measured; a server, model or input problem exits 1; both as one line on stderr.
    """
    from batchfill.adapters.profiler import check_url, one_line
    from batchfill.cli.profile import (
        ProfileError,
        ProfileOptions,
        ProfileUsageError,
        check_options,
        parse_shape,
        run_profile,
    )

    try:
        sizes = tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else ()
    except ValueError:
        _err(err, f"--batch-sizes {args.batch_sizes!r} must be comma-separated integers")
        return EXIT_USAGE
    if any(b < 1 for b in sizes):
        _err(err, f"--batch-sizes {args.batch_sizes!r}: every batch size must be >= 1")
        return EXIT_USAGE
    base = None
    try:
        url = check_url(args.url)  # before anything else: no client is ever made for a bad URL
        shapes = tuple(parse_shape(s) for s in args.shape or [])
        if args.file:
            docs = parse_documents(_read(args.file))
            if len(docs) != 1:
                raise ValueError(f"{args.file}: -f takes one BatchedModel, found {len(docs)} documents")
            load_model(docs[0])  # the document must be valid before minutes of measuring
            base = docs[0]
        opts = ProfileOptions(
            url=url,
            model=args.model,
            version=args.model_version,
            batch_sizes=sizes,
            warmup=args.warmup,
            repeats=args.repeats,
            quantile=args.quantile,
            shapes=shapes,
            latency_p99_ms=args.latency_p99_ms,
            network_overhead_ms=args.network_ms,
            base_document=base,
            base_path=args.file or "",
            seed=args.seed,
        )
        check_options(opts)
    except OSError as e:
        _err(err, f"{args.file}: cannot read: {e.strerror or e}")
        return EXIT_USAGE
    except SpecError as e:
        for p in e.problems:
            _err(err, f"{args.file}: {p}")
        return EXIT_USAGE
    except (ValueError, ProfileUsageError) as e:
        _err(err, str(e))
        return EXIT_USAGE
    try:
        run_profile(opts, out, err, output=args.output)
    except ProfileUsageError as e:  # a flag or the file against the model on the server, before measuring
        _err(err, one_line(str(e), limit=2000))
        return EXIT_USAGE
    except ProfileError as e:  # the server's words are cut to one line where they are quoted; this is the rest
        _err(err, f"batchfill profile: {one_line(str(e), limit=2000)}")
        return EXIT_FAILED
    except SpecError as e:
        for p in e.problems:
            _err(err, f"measured profile: {p}")
        return EXIT_USAGE
    return EXIT_OK


def cmd_crd(args: argparse.Namespace, out: Console, err: Console) -> int:
    from batchfill.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return EXIT_OK


def cmd_serve(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Measure, plan and serve on a local tritonserver.

    SIGTERM stops tritonserver and removes the work directory as Ctrl-C does, and exits 143 (Ctrl-C: 130).
    """
    from batchfill.cli.serve import serve

    # the flags before anything starts (a bad --load used to fail after tritonserver was up)
    if not (0 < args.load <= 2):  # NaN too
        _err(err, f"--load={args.load} must be in (0, 2]: the offered load as a fraction of the planned capacity")
        return EXIT_USAGE
    if not (0 < args.duration <= 3600):
        _err(err, f"--duration={args.duration} must be in (0, 3600] seconds of Poisson load")
        return EXIT_USAGE
    if args.seed < 0:
        _err(err, f"--seed={args.seed} must be >= 0")
        return EXIT_USAGE
    bm = _one_model(args.file, "serve", err)
    if isinstance(bm, int):
        return bm

    terminated = False

    def interrupt(signum: int, frame: Any) -> None:
        nonlocal terminated
        terminated = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise KeyboardInterrupt

    import gevent  # tritonclient.http's event loop

    # An interrupt that lands in gevent's hub reaches serve() all the same; the hub need not print it first.
    hub = gevent.get_hub()
    not_error = hub.NOT_ERROR
    hub.NOT_ERROR = (*not_error, KeyboardInterrupt)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        report = serve(
            bm, out, load_fraction=args.load, duration_s=args.duration, measure=not args.no_measure, seed=args.seed
        )
    except SpecError as e:
        for p in e.problems:
            _err(err, f"{args.file}: {p}")
        return EXIT_USAGE
    except KeyboardInterrupt:  # serve() has stopped tritonserver and removed its work directory
        if terminated:
            return 128 + signal.SIGTERM  # 143, as if SIGTERM had killed the process (Ctrl-C: 130, in main)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        hub.NOT_ERROR = not_error
    return EXIT_OK if report.sla_kept else EXIT_FAILED


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Run the operator (kopf) until interrupted; with leader election, only while holding the Lease."""
    import logging

    import kopf
    from pydantic import ValidationError

    from batchfill.controller.settings import OperatorSettings, describe_errors

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
            _err(err, f"setting {problem}")
        return EXIT_USAGE
    kopf.configure(
        verbose=args.verbose, log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    import batchfill.controller.handlers  # noqa: F401  (registers the handlers)
    from batchfill.adapters import memory, operator_metrics

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
    import logging
    import os
    import threading

    from kubernetes import client

    from batchfill.adapters import operator_metrics
    from batchfill.adapters.kube import load_config
    from batchfill.adapters.leader import LeaderElector, StandbyHealth, default_identity

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


def cmd_dev_cluster(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A real local control plane (etcd, kube-apiserver, scheduler, controller-manager, kwok GPU nodes)."""
    from batchfill.testbed.devcluster import dev_cluster_main

    return dev_cluster_main(
        args.action,
        run_dir=args.run_dir,
        gpu_nodes=args.gpu_nodes,
        gpus_per_node=args.gpus_per_node,
        cpu_nodes=args.cpu_nodes,
        build=not args.no_build,
        console=err,
    )


def cmd_demo(args: argparse.Namespace, out: Console, err: Console) -> int:
    """The main job end to end: control plane, operator, the real example model on real tritonservers."""
    from batchfill.cli.demo import DemoOptions, demo_main

    if not (0 < args.load <= 2) or not (0 < args.duration <= 3600):
        _err(err, f"--load={args.load} must be in (0, 2] and --duration={args.duration} in (0, 3600] seconds")
        return EXIT_USAGE
    options = DemoOptions(
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        load_fraction=args.load,
        load_seconds=args.duration,
        keep=args.keep,
        seed=args.seed,
    )
    return demo_main(options, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchfill",
        description="Serve models on Triton at the lowest GPU cost that meets a p99 latency SLA.",
    )
    parser.add_argument("--version", action="version", version=f"batchfill {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="derive Triton's batching settings and capacity from a BatchedModel file")
    p.add_argument("file", help="BatchedModel YAML (several documents are planned one by one); - for stdin")
    p.add_argument("--rps", type=float, default=None, help="request rate to size replicas for (req/s)")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml", "json"),
        default="table",
        help="json: one object per document (a list when the file holds several); yaml: one document each",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated arrivals (default 0)")
    p.set_defaults(func=cmd_plan)

    s = sub.add_parser(
        "serve",
        help="measure, plan and serve a shipped example model on a real local tritonserver under Poisson load",
    )
    s.add_argument("file", help="BatchedModel YAML with the batchfill.io/example-model annotation")
    s.add_argument(
        "--load", type=float, default=0.9, help="offered load as a fraction of capacity, in (0, 2] (default 0.9)"
    )
    s.add_argument("--duration", type=float, default=20.0, help="seconds of Poisson load, at most 3600 (default 20)")
    s.add_argument("--no-measure", action="store_true", help="plan from the declared profile, do not measure")
    s.add_argument("--seed", type=int, default=0, help="seed of the planner and of the load (default 0)")
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser(
        "demo",
        help="the main job: local control plane with GPU nodes, the operator, and the example model served by "
        "real tritonservers under Poisson load",
    )
    m.add_argument("--kubeconfig", default=None, help="use this existing cluster (e.g. kind) instead of starting one")
    m.add_argument("--run-dir", default=None, help="working directory (default ~/.local/state/batchfill/demo)")
    m.add_argument("--load", type=float, default=0.7, help="offered load per pod, fraction of capacity (default 0.7)")
    m.add_argument("--duration", type=float, default=15.0, help="seconds of Poisson load (default 15)")
    m.add_argument("--keep", action="store_true", help="stay up after the report until Ctrl-C")
    m.add_argument("--seed", type=int, default=0, help="seed of the load (default 0)")
    m.set_defaults(func=cmd_demo)

    r = sub.add_parser(
        "run", help="run the operator (settings: BATCHFILL_* environment variables, batchfill.controller.settings)"
    )
    r.add_argument("--prometheus-url", default=None, help="Prometheus base URL (BATCHFILL_PROMETHEUS_URL)")
    r.add_argument("--namespaces", default=None, help="comma-separated namespaces; empty: all (BATCHFILL_NAMESPACES)")
    r.add_argument("--log-format", choices=("text", "json"), default=None, help="(BATCHFILL_LOG_FORMAT)")
    r.add_argument("--metrics-port", type=int, default=None, help="operator /metrics port (BATCHFILL_METRICS_PORT)")
    r.add_argument(
        "--interval",
        type=float,
        default=None,
        help="status/scaling timer period, s (BATCHFILL_RECONCILE_INTERVAL_SECONDS)",
    )
    r.add_argument("--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    r.add_argument("--verbose", action="store_true")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser(
        "dev-cluster", help="start/stop a real local Kubernetes control plane with fake GPU nodes (127.0.0.1)"
    )
    d.add_argument("action", choices=("up", "down", "status", "build"))
    d.add_argument(
        "--run-dir", default=None, help="state directory (default: $BATCHFILL_DEV_CLUSTER_DIR or ~/.local/state/...)"
    )
    d.add_argument("--gpu-nodes", type=int, default=2, help="fake GPU nodes (default 2)")
    d.add_argument("--gpus-per-node", type=int, default=4, help="nvidia.com/gpu per node (default 4)")
    d.add_argument("--cpu-nodes", type=int, default=0, help="fake nodes without GPUs (default 0)")
    d.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    d.set_defaults(func=cmd_dev_cluster)

    pr = sub.add_parser(
        "profile",
        help="measure a live Triton model's execution latency per batch size and print a profile: ready to paste",
    )
    pr.add_argument("--url", required=True, help="Triton HTTP endpoint, HOST:PORT (e.g. localhost:8000)")
    pr.add_argument("--model", required=True, help="model name on that server")
    pr.add_argument("--model-version", default="", help="model version (default: the server's choice)")
    pr.add_argument(
        "--batch-sizes",
        default=None,
        help="comma-separated, each at most the server's max_batch_size (exit 2 otherwise); default: powers of 2 "
        "up to max_batch_size, and max_batch_size",
    )
    pr.add_argument("--repeats", type=int, default=30, help="measured executions per batch size (default 30)")
    pr.add_argument("--warmup", type=int, default=5, help="unmeasured requests per batch size first (default 5)")
    pr.add_argument(
        "--quantile",
        type=float,
        default=0.9,
        help="quantile of the executions that becomes the profile value, in (0, 1) (default 0.9)",
    )
    pr.add_argument("--shape", action="append", help="NAME=d1,d2: dims of an input with variable dims (repeatable)")
    pr.add_argument("--latency-p99-ms", type=float, default=None, help="SLA p99, ms: also print a BatchedModel + plan")
    pr.add_argument(
        "--network-overhead-ms",
        dest="network_ms",
        type=float,
        default=None,
        help="SLA budget outside Triton, ms (with --latency-p99-ms; default 0)",
    )
    pr.add_argument(
        "-f",
        "--file",
        default=None,
        help="BatchedModel to put the measured profile into: everything else (spec.model.repository, its SLA, "
        "which plans it) is kept; not with the SLA flags. Its profile batch sizes above the server's "
        "max_batch_size are dropped, with a note on stderr",
    )
    pr.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml"),
        default="table",
        help="yaml: only the document on stdout (the plan line goes to stderr). A BatchedModel carries "
        "spec.model.repository from -f; built from the server's metadata it has none (Triton does not say where "
        "its files are) and starts with a YAML comment saying to add one before applying it",
    )
    pr.add_argument("--seed", type=int, default=0, help="seed of the synthesized inputs and the planner (default 0)")
    pr.set_defaults(func=cmd_profile)

    from batchfill.cli.simulate import TRACES
    from batchfill.compare.run import POLICIES

    sim = sub.add_parser(
        "simulate",
        help="GPU-hours and SLO attainment of batchfill's autoscaling against HPA, KEDA, static peak and the lower "
        "bound, on a simulated fleet and trace",
    )
    sim.add_argument("file", help="BatchedModel YAML with spec.profile")
    sim.add_argument("--trace", choices=TRACES, default="diurnal", help="traffic shape (default diurnal)")
    sim.add_argument(
        "--mean-rps",
        type=float,
        default=None,
        help="mean (spike/step: base) rate, req/s (default 40%% of maxReplicas x capacity)",
    )
    sim.add_argument("--duration", default=None, help="trace length: 3600, 90m, 24h (default 24h diurnal, else 1h)")
    sim.add_argument("--peak-to-trough", type=float, default=5.0, help="diurnal peak/trough ratio (default 5)")
    sim.add_argument("--cv", type=float, default=4.0, help="bursty: CV of Gamma inter-arrival times (default 4)")
    sim.add_argument("--peak-rps", type=float, default=None, help="spike/step: peak rate, req/s (default 3 x mean)")
    sim.add_argument("--start", default=None, help="spike/step: start time (default a third of the trace)")
    sim.add_argument("--length", default=None, help="spike: length (default a sixth of the trace)")
    sim.add_argument("--rates", default=None, help="replay: per-minute rate file (req/s per line, or minute,rps)")
    sim.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, from {', '.join(POLICIES)} (default all)"
    )
    sim.add_argument("--startup", type=float, default=60.0, help="replica start-up to Ready, s (default 60)")
    sim.add_argument("--hpa-gpu-target", type=float, default=80.0, help="hpa-gpu utilization target, %% (default 80)")
    sim.add_argument("--plot", default="batchfill-simulate.png", help="PNG to write ('' for none)")
    sim.add_argument("--json", default=None, help="also write the figures as JSON here")
    sim.add_argument("--seed", type=int, default=0, help="seed of the trace and the planner (default 0)")
    sim.set_defaults(func=cmd_simulate)

    c = sub.add_parser("crd", help="print the BatchedModel CustomResourceDefinition (YAML)")
    c.set_defaults(func=cmd_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if hasattr(signal, "SIGPIPE"):  # `batchfill plan ... | head` ends quietly, as Unix tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    args = build_parser().parse_args(argv)
    if getattr(args, "rps", None) is not None and not (args.rps >= 0 and args.rps != float("inf")):
        _err(err, f"--rps={args.rps} must be a finite number >= 0")
        return EXIT_USAGE
    try:
        return int(args.func(args, out, err))
    except KeyboardInterrupt:
        return 130
    except SpecError as e:  # pragma: no cover - commands catch their own
        for prob in e.problems:
            _err(err, str(prob))
        return EXIT_USAGE
    except Exception as e:
        _err(err, f"batchfill {args.command}: internal error: {type(e).__name__}: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
