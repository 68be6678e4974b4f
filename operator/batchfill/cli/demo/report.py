"""What ``batchfill demo`` prints for the user: the cluster's view and the load table."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from batchfill.cli.demo.results import DemoResult
from batchfill.testbed.install import kubectl_stdout as _kubectl


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.1f}"


def report(
    console: Console,
    kubeconfig: Path,
    ns: str,
    name: str,
    config_name: str,
    config: str,
    result: DemoResult,
    bm_table: str | None = None,
) -> None:
    """Print the cluster's view and the load table; ``bm_table``: ``kubectl get bm -A`` as taken under load (else
    taken now)."""
    console.rule("kubectl get bm -A" + (" (under load)" if bm_table is not None else ""))
    table = bm_table if bm_table is not None else _kubectl(kubeconfig, "get", "bm", "-A")
    console.print(table, markup=False, highlight=False)
    console.rule(f"kubectl get configmap {config_name} -n {ns}: config.pbtxt derived from the SLA")
    console.print(config, markup=False, highlight=False)
    console.rule("pods on GPU nodes")
    columns = (
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,GPUS:.spec.containers[0].resources.limits."
        "nvidia\\.com/gpu,READY:.status.conditions[?(@.type=='Ready')].status,"
        "CONFIG:.metadata.annotations.batchfill\\.io/config-hash"
    )
    console.print(_kubectl(kubeconfig, "get", "pods", "-n", ns, "-o", columns), markup=False, highlight=False)
    console.rule(f"events of {ns}/{name}")
    events = _kubectl(
        kubeconfig,
        "get",
        "events",
        "-n",
        ns,
        f"--field-selector=involvedObject.name={name}",
        "--sort-by=.lastTimestamp",
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
    )
    console.print(events, markup=False, highlight=False)
    console.print(load_table(result))
    verdict = "[green]SLA kept[/green]" if result.sla_kept else "[red]SLA missed[/red]"
    worst = max((p for p in result.server_p99_ms.values() if p is not None), default=None)
    console.print(f"{verdict}: worst server p99 {_fmt(worst)} ms against T = {result.server_budget_ms:g} ms")


def load_table(result: DemoResult) -> Table:
    """Per pod: the Poisson rate λ asked for and what was sent and answered per second over the load's duration
    (a seeded draw of arrivals differs from λ·duration: 292 arrivals in 15 s for λ = 22.3 req/s), the counts,
    Triton's and the client's p99 and the budget T (ms)."""
    table = Table(
        title="real tritonserver per Ready pod, under Poisson load",
        caption="λ: Poisson rate asked for; sent, achieved: requests sent, answered, per second of load",
    )
    columns = ("pod", "λ req/s", "sent req/s", "achieved req/s", "sent/failed", "server p99 ms", "client p99 ms")
    for col in (*columns, "T ms"):
        table.add_column(col, justify="right")
    for pod, r in sorted(result.loads.items()):
        table.add_row(
            pod,
            f"{r.rate_rps:.1f}",
            f"{r.sent / r.duration_s:.1f}" if r.duration_s > 0 else "n/a",
            f"{r.achieved_rate_rps:.1f}",
            f"{r.sent}/{r.failed}",
            _fmt(result.server_p99_ms.get(pod)),
            _fmt(r.p99_ms),
            f"{result.server_budget_ms:g}",
        )
    return table
