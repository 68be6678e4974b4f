"""`batchfill` command line: the parser of every command, and the dispatch to the command's own module.

Building the parser imports nothing but the standard library and :mod:`batchfill.cli.common`, so `batchfill
--help` and every command's `--help` start fast; each command imports what it needs when it runs (cli/plan.py,
run.py, crd.py, profile.py, simulate.py, serve.py, demo.py). A command whose optional dependencies are missing
exits 2 with one line naming the `pip install 'batchfill[EXTRA]'` that installs them (pyproject.toml).

Exit codes: 0 success, 2 bad input (one line per problem, each naming its field path), 1 an internal or
environment failure (still one line, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchfill import __version__
from batchfill.cli.common import EXIT_FAILED, EXIT_USAGE, POLICIES, TRACES, err_line, missing_extra

if TYPE_CHECKING:
    from rich.console import Console


def _without_extra(command: str, extra: str, err: Console) -> bool:
    """True, after printing the one line that says what to install, when ``extra`` is not installed."""
    line = missing_extra(command, extra)
    if line is not None:
        err_line(err, line)
    return line is not None


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    from batchfill.cli.plan import command

    return command(args, out, err)


def cmd_simulate(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A BatchedModel against a trace under batchfill's policy and the baselines (fleet simulator)."""
    if _without_extra("simulate", "simulate", err):
        return EXIT_USAGE
    if args.fleet or args.fleet_trace:
        from batchfill.cli.simulate_fleet import command
    else:
        from batchfill.cli.simulate import command

    return command(args, out, err)


def cmd_profile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from batchfill.cli.profile import command

    return command(args, out, err)


def cmd_crd(args: argparse.Namespace, out: Console, err: Console) -> int:
    from batchfill.cli.crd import command

    return command(args, out, err)


def cmd_serve(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Measure, plan and serve on a local tritonserver (the test bed's)."""
    if _without_extra("serve", "testbed", err):
        return EXIT_USAGE
    from batchfill.cli.serve import command

    return command(args, out, err)


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from batchfill.cli.run import command

    return command(args, out, err)


def cmd_dev_cluster(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A real local control plane (etcd, kube-apiserver, scheduler, controller-manager, kwok GPU nodes)."""
    from batchfill.cli.dev_cluster import dev_cluster_main

    return dev_cluster_main(
        args.action,
        run_dir=args.run_dir,
        gpu_nodes=args.gpu_nodes,
        gpus_per_node=args.gpus_per_node,
        cpu_nodes=args.cpu_nodes,
        real_nodes=args.real_nodes,
        real_node_gpus=args.real_node_gpus,
        build=not args.no_build,
        console=err,
    )


def cmd_demo(args: argparse.Namespace, out: Console, err: Console) -> int:
    """The main job end to end: control plane, operator, the real example model on real tritonservers."""
    if _without_extra("demo", "testbed", err):
        return EXIT_USAGE
    from batchfill.cli.demo import DemoOptions, demo_main

    if not (0 < args.load <= 2) or not (0 < args.duration <= 3600):
        err_line(err, f"--load={args.load} must be in (0, 2] and --duration={args.duration} in (0, 3600] seconds")
        return EXIT_USAGE
    options = DemoOptions(
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        load_fraction=args.load,
        load_seconds=args.duration,
        keep=args.keep,
        seed=args.seed,
        real_nodes=args.real_nodes,
    )
    if options.real_nodes and options.kubeconfig is not None:
        err_line(err, "--real-nodes starts its own cluster: it cannot be combined with --kubeconfig")
        return EXIT_USAGE
    return demo_main(options, out)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``batchfill`` command.

    Long because it is the table of every command's options, one add_argument each.
    """
    parser = argparse.ArgumentParser(
        prog="batchfill",
        description="Serve models on Triton at the lowest GPU cost that meets a p99 latency SLA.",
    )
    parser.add_argument("--version", action="version", version=f"batchfill {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="derive Triton's batching settings and capacity from a BatchedModel file")
    p.add_argument(
        "file",
        help="BatchedModel YAML, or a folder of them (several documents are planned one by one); - for stdin",
    )
    p.add_argument("--rps", type=float, default=None, help="request rate to size replicas for (req/s)")
    p.add_argument(
        "--rate",
        action="append",
        metavar="NAME=RPS",
        help="place every model together on shared GPUs, this one at RPS req/s (repeat for each model; NAME is "
        "metadata.name)",
    )
    p.add_argument("--rates", metavar="FILE", help="YAML/JSON mapping of model name to req/s (as --rate)")
    p.add_argument(
        "--gpu-memory-mib",
        type=float,
        default=16_384.0,
        help="with --rate/--rates: memory of one GPU, MiB (default 16384, a 16 GiB inference GPU such as a T4)",
    )
    p.add_argument(
        "--memory",
        action="append",
        metavar="NAME=MIB",
        help="with --rate/--rates: GPU memory the model holds when loaded, MiB (default 2048)",
    )
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
    m.add_argument(
        "--run-dir",
        default=None,
        help="working directory (default ~/.local/state/batchfill/demo; with --real-nodes /var/tmp/bf-demo)",
    )
    m.add_argument("--load", type=float, default=0.7, help="offered load per pod, fraction of capacity (default 0.7)")
    m.add_argument(
        "--duration", type=float, default=15.0, help="seconds of load (default 15; at least 40 with --real-nodes)"
    )
    m.add_argument("--keep", action="store_true", help="stay up after the report until Ctrl-C")
    m.add_argument("--seed", type=int, default=0, help="seed of the load (default 0)")
    m.add_argument(
        "--real-nodes",
        action="store_true",
        help="serve from the operator's real pods on a real node (kubelet + containerd; root; builds the Triton image)",
    )
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
    d.add_argument(
        "--real-nodes", type=int, default=0,
        help="real nodes (kubelet + containerd, each in its own network namespace; needs root) (default 0)",
    )  # fmt: skip
    d.add_argument(
        "--real-node-gpus", type=int, default=4,
        help="fake nvidia.com/gpu per real node, advertised to its kubelet by a device plugin; 0: none (default 4)",
    )  # fmt: skip
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

    sim = sub.add_parser(
        "simulate",
        help="GPU-hours and SLO attainment of batchfill's autoscaling against HPA, KEDA, static peak and the lower "
        "bound, on a simulated fleet and trace",
    )
    sim.add_argument(
        "file", help="BatchedModel YAML with spec.profile; with --fleet several (a file of documents or a folder)"
    )
    sim.add_argument(
        "--fleet",
        action="store_true",
        help="several models on shared GPUs over time, placement re-planned as rates move (batchfill plan --rate)",
    )
    sim.add_argument(
        "--fleet-trace", choices=("diurnal",), default=None,
        help="fleet (implies --fleet): per-model diurnal rates, each its own seeded phase (default without --rates)",
    )  # fmt: skip
    sim.add_argument(
        "--replan-minutes", type=float, default=30.0,
        help="fleet: re-plan the placement every this many minutes, on the previous period's rates (default 30)",
    )  # fmt: skip
    sim.add_argument(
        "--sample-seconds", type=float, default=60.0,
        help="fleet: seconds simulated per period after a 10 s warm-up, at most 600 (default 60)",
    )  # fmt: skip
    sim.add_argument(
        "--gpu-memory-mib", type=float, default=16_384.0, help="fleet: memory of one GPU, MiB (default 16384)"
    )
    sim.add_argument(
        "--memory", action="append", metavar="NAME=MIB",
        help="fleet: GPU memory the model holds when loaded, MiB (default 2048)",
    )  # fmt: skip
    sim.add_argument("--trace", choices=TRACES, default="diurnal", help="traffic shape (default diurnal)")
    sim.add_argument(
        "--mean-rps",
        type=float,
        default=None,
        help="mean (spike/step: base) rate, req/s (default 40%% of maxReplicas x capacity; fleet: every model's, "
        "default half its capacity)",
    )
    sim.add_argument(
        "--duration", default=None,
        help="trace length: 3600, 90m, 24h (default 24h diurnal, else 1h; fleet: 24h or --rates' length, at most 7d)",
    )  # fmt: skip
    sim.add_argument("--peak-to-trough", type=float, default=5.0, help="diurnal peak/trough ratio (default 5)")
    sim.add_argument("--cv", type=float, default=4.0, help="bursty: CV of Gamma inter-arrival times (default 4)")
    sim.add_argument("--peak-rps", type=float, default=None, help="spike/step: peak rate, req/s (default 3 x mean)")
    sim.add_argument("--start", default=None, help="spike/step: start time (default a third of the trace)")
    sim.add_argument("--length", default=None, help="spike: length (default a sixth of the trace)")
    sim.add_argument(
        "--rates", default=None,
        help="replay: per-minute rate file (req/s per line, or minute,rps); fleet: YAML/JSON mapping of model name to "
        "a list of req/s per minute",
    )  # fmt: skip
    sim.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, from {', '.join(POLICIES)} (default these), hpa-gpu@<percent>, hpa-gpu@best, and "
        "what teams run today: <batching>/<autoscaler> with batching batching-off, triton-default or seed-rule and "
        "autoscaler hpa-gpu, hpa-gpu@<percent>, hpa-gpu@best or static-peak; 'baselines' names all nine",
    )
    sim.add_argument(
        "--balancing",
        choices=("round-robin", "random"),
        default="round-robin",
        help="how the Service spreads requests over replicas: round-robin, or random as kube-proxy (default "
        "round-robin)",
    )
    sim.add_argument("--startup", type=float, default=60.0, help="replica start-up to Ready, s (default 60)")
    sim.add_argument("--hpa-gpu-target", type=float, default=80.0, help="hpa-gpu utilization target, %% (default 80)")
    sim.add_argument("--plot", default="batchfill-simulate.png", help="PNG to write ('' for none)")
    sim.add_argument("--json", default=None, help="also write the figures as JSON here")
    sim.add_argument("--seed", type=int, default=0, help="seed of the trace and the planner (default 0)")
    sim.set_defaults(func=cmd_simulate)

    c = sub.add_parser("crd", help="print the BatchedModel (or GPUPool) CustomResourceDefinition (YAML)")
    c.add_argument(
        "--kind", choices=("BatchedModel", "GPUPool"), default="BatchedModel",
        help="which CRD: BatchedModel (crds/batchedmodel.yaml, the default) or GPUPool (crds/gpupool.yaml)",
    )  # fmt: skip
    c.set_defaults(func=cmd_crd)
    return parser


#: Columns of output written to a pipe or a file when COLUMNS is not set (a terminal's own width is used as is).
PIPED_WIDTH = 160


def entry() -> None:
    """The ``batchfill`` console script and ``python -m batchfill.cli``: :func:`main` with SIGPIPE at its default.

    ``batchfill plan ... | head`` then ends quietly, as Unix tools do. Only the process's own entry point sets it:
    :func:`main` called in-process (tests, embedding) keeps Python's ignored SIGPIPE, under which a write to a
    closed socket raises ``BrokenPipeError`` instead of killing the whole process.
    """
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    raise SystemExit(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``batchfill`` command; returns its exit code (0 ok, 2 usage, others per command)."""
    args = build_parser().parse_args(argv)  # --help and usage errors exit here, before rich is imported
    from rich.console import Console

    # piped (`| tee log`, CI) and no COLUMNS: rich would cut every table at 80 columns ("text-r…"); a pipe has no
    # width, so give the tables room
    piped = None if os.environ.get("COLUMNS") else PIPED_WIDTH
    out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else piped)
    err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else piped)
    if getattr(args, "rps", None) is not None and not (args.rps >= 0 and args.rps != float("inf")):
        err_line(err, f"--rps={args.rps} must be a finite number >= 0")
        return EXIT_USAGE
    try:
        return int(args.func(args, out, err))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        # A SpecError comes from a loaded batchfill.api.errors; importing it here could fail as the command did.
        errors = sys.modules.get("batchfill.api.errors")
        if errors is not None and isinstance(e, errors.SpecError):  # pragma: no cover - commands catch their own
            for prob in e.problems:
                err_line(err, str(prob))
            return EXIT_USAGE
        err_line(err, f"batchfill {args.command}: internal error: {type(e).__name__}: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
