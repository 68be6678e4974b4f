"""Reconcile time and API calls for a fleet of BatchedModels created at once, on the real local control plane.

Target (README.md, Tests and benchmarks): 100 BatchedModels, all Planned and Ready (a Triton pod scheduled on a
fake GPU node and Ready) within 60 s on a 2-core machine. Every model gets its own SLA, so every plan is computed
(no cache hits).
API calls come from kube-apiserver's own counter ``apiserver_request_total`` (by verb and resource), read before
and after; the benchmark's own calls (one server-side apply per model, a list of BatchedModels every 0.5 s) are
shown separately. Prints figures; not a pass/fail test.

Run: .venv/bin/python benchmarks/reconcile_fleet.py [--models 100] [--distinct-slas 100]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from batchfill.api.reasons import ConditionType
from batchfill.testbed import devcluster
from batchfill.testbed.install import (
    GROUP,
    PLURAL,
    VERSION,
    install_operator_rbac,
    model_volume,
    operator_as_service_account,
)

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "fleet"
TARGET_S = 60.0


def request_counts(kubeconfig: Path) -> collections.Counter[tuple[str, str]]:
    """kube-apiserver's apiserver_request_total summed by (verb, resource[/subresource])."""
    text = devcluster.kubectl(kubeconfig, "get", "--raw", "/metrics").stdout
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            resource = sample.labels.get("resource", "")
            if sample.labels.get("subresource"):
                resource += "/" + sample.labels["subresource"]
            counts[(sample.labels.get("verb", ""), resource)] += int(sample.value)
    return counts


def fleet(n: int, distinct: int) -> list[dict[str, Any]]:
    base = yaml.safe_load((ROOT / "examples" / "seed-example.yaml").read_text())
    docs = []
    for i in range(n):
        doc = yaml.safe_load(yaml.safe_dump(base))
        doc["metadata"] = {"name": f"model-{i:03d}", "namespace": NAMESPACE}
        doc["spec"]["model"]["repository"] = {"pvc": {"claimName": "triton-models"}}
        doc["spec"]["sla"]["latencyP99Ms"] = 80 + (i % distinct)  # a different SLA: a different plan
        docs.append(doc)
    return docs


#: Requests only the operator makes (children it applies, its status and kopf's annotations); the rest of the
#: table mixes the operator with the controllers, the scheduler and kwok (the counter has no user label).
OPERATOR_ONLY = {
    ("APPLY", "configmaps"), ("APPLY", "deployments"), ("APPLY", "services"), ("PATCH", PLURAL),
    ("PATCH", f"{PLURAL}/status"), ("GET", PLURAL), ("LIST", PLURAL),
}  # fmt: skip


def who(verb: str, resource: str) -> str:
    return "operator" if (verb, resource) in OPERATOR_ONLY else "operator and/or controllers"


def is_true(bm: dict[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in (bm.get("status") or {}).get("conditions") or []
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--distinct-slas", type=int, default=100, help="how many different SLAs (plans) among them")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    console = Console(stderr=True)
    out = Console()
    gpus_per_node = 32
    nodes = max(2, -(-args.models // gpus_per_node))
    with tempfile.TemporaryDirectory(prefix="batchfill-fleet-") as tmp:
        work = Path(tmp)
        devcluster.ensure_binaries(console)
        cluster = devcluster.running_cluster(
            work / "cluster",
            gpu_nodes=nodes,
            gpus_per_node=gpus_per_node,
            quiet=True,
            die_with_parent=True,
            build=False,
        )
        with cluster as info:
            kubeconfig = info.kubeconfig
            install_operator_rbac(kubeconfig, work)
            volume = model_volume(NAMESPACE, "fleet", work / "models")
            (work / "models").mkdir()
            (work / "volume.yaml").write_text(yaml.safe_dump_all(volume))
            devcluster.kubectl(kubeconfig, "apply", "--server-side", "-f", str(work / "volume.yaml"))
            (work / "fleet.yaml").write_text(yaml.safe_dump_all(fleet(args.models, args.distinct_slas)))
            with (
                operator_as_service_account(kubeconfig, work, work / "operator.log") as operator,
                devcluster.api_client(kubeconfig) as api,
            ):
                custom = client.CustomObjectsApi(api)
                time.sleep(3.0)  # the operator's startup (kopf scans the API), before the clock starts
                before = request_counts(kubeconfig)
                t0 = time.monotonic()
                devcluster.kubectl(kubeconfig, "apply", "--server-side", "-f", str(work / "fleet.yaml"), timeout_s=120)
                created_s = time.monotonic() - t0
                planned_s = ready_s = None
                polls = 0
                with console.status("waiting for every BatchedModel to be Planned and Ready ...") as status:
                    while time.monotonic() - t0 < args.timeout and operator.poll() is None:
                        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
                        polls += 1
                        planned = sum(is_true(b, ConditionType.PLANNED) for b in items)
                        ready = sum(is_true(b, ConditionType.READY) for b in items)
                        now = time.monotonic() - t0
                        status.update(f"{now:5.1f} s: {planned}/{args.models} Planned, {ready} Ready")
                        if planned_s is None and planned == args.models:
                            planned_s = now
                        if ready == args.models:
                            ready_s = now
                            break
                        time.sleep(0.5)
                time.sleep(2.0)
                after = request_counts(kubeconfig)
            log_tail = (work / "operator.log").read_text().splitlines()[-5:]
    delta = after - before
    own = collections.Counter({("APPLY", PLURAL): args.models, ("LIST", PLURAL): polls})
    table = Table(title=f"API requests during the run ({args.models} BatchedModels, {args.distinct_slas} SLAs)")
    for col in ("verb", "resource", "requests", "of them the benchmark's", "others per model", "by"):
        table.add_column(col, justify="right")
    operator_total = 0
    for (verb, resource), count in sorted(delta.items(), key=lambda kv: (-kv[1], kv[0])):
        mine = min(count, own.get((verb, resource), 0))
        operator_total += count - mine
        table.add_row(verb, resource, str(count), str(mine), f"{(count - mine) / args.models:.2f}", who(verb, resource))
    out.print(table)
    out.print(f"created {args.models} BatchedModels in {created_s:.1f} s (one server-side apply)")
    out.print(f"all Planned after: {planned_s:.1f} s" if planned_s is not None else "not all Planned before timeout")
    out.print(
        f"all Ready after:   {ready_s:.1f} s (target {TARGET_S:g} s): {'met' if ready_s <= TARGET_S else 'MISSED'}"
        if ready_s is not None
        else f"not all Ready within {args.timeout:g} s; operator log tail: {log_tail}"
    )
    ours = sum(c - min(c, own.get(k, 0)) for k, c in delta.items() if k in OPERATOR_ONLY)
    out.print(f"API requests by others than the benchmark (operator, controllers, scheduler, kwok): {operator_total}"
              f" ({operator_total / args.models:.1f} per model); of them the operator's own kinds: {ours}"
              f" ({ours / args.models:.1f} per model)")  # fmt: skip


if __name__ == "__main__":
    main()
