"""`batchfill plan`: Triton's batching settings, the capacity at SLA and the replica count of a BatchedModel file.

Printed as a table with the rendered config.pbtxt, or as JSON or YAML (``-o``); bad input exits 2 with one line per
problem, each naming its field path.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from batchfill.api.errors import Problem, SpecError
from batchfill.api.validate import load_model
from batchfill.cli.common import EXIT_OK, EXIT_USAGE, err_line, input_error
from batchfill.policy.plan import PlanResult, plan_batching, replicas_for


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


def command(args: argparse.Namespace, out: Console, err: Console) -> int:
    """`batchfill plan FILE|FOLDER`: every document planned; exit 2 when any failed (the others are still printed).
    With ``--rate``/``--rates`` the models are placed together instead (cli/placement.py)."""
    from batchfill.cli import placement

    if getattr(args, "rate", None) or getattr(args, "rates", None):
        return placement.command(args, out, err)
    try:
        labelled = placement.fleet_documents(args.file)
    except OSError as e:
        return input_error(f"{args.file}", e, err)
    except SpecError as e:
        for p in e.problems:
            err_line(err, str(p))
        return EXIT_USAGE
    labelled, pools, problems = placement.split_pools(labelled)
    for p in problems:
        err_line(err, str(p))
    if args.output == "table":
        for label, pool in pools:
            s = pool.spec
            out.print(f"{label}: GPUPool {pool.metadata.name}: accepted ({s.gpusPerPod} x {s.gpuResource} of "
                      f"{s.gpuMemoryMiB} MiB per pod, {s.minPods}..{s.maxPods} pods)", highlight=False)  # fmt: skip
    if not labelled and not pools and not problems:
        err_line(err, f"{args.file}: no YAML documents")
        return EXIT_USAGE
    planned: list[dict[str, Any]] = []
    failed = bool(problems)
    for label, doc in labelled:
        try:
            planned.append(plan_document(doc, args.rps, args.seed))
        except SpecError as e:
            failed = True
            for p in e.problems:
                err_line(err, f"{label}: {p}")
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
