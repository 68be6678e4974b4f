"""What ``batchfill demo`` is given and what it observed; the example it serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchfill.testbed.loadgen import LoadResult

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "deploy" / "examples" / "ocr-recognizer.yaml"


EXAMPLE_MODEL = "ocr_recognizer"  # the shipped model.py the example's annotation names


class DemoError(RuntimeError):
    """A demo step failed; the message says which and where its log is."""


@dataclass(frozen=True)
class DemoOptions:
    """``batchfill demo`` flags. Seconds and fractions of the planned capacity."""

    kubeconfig: Path | None = None
    run_dir: Path | None = None
    load_fraction: float = 0.7
    load_seconds: float = 15.0
    keep: bool = False
    seed: int = 0
    timeout_s: float = 180.0
    real_nodes: bool = False  # serve from real pods on a real node (cli/demo/real.py)


@dataclass
class DemoResult:
    """What the demo observed (for the exit code and tests)."""

    model: str
    server_budget_ms: float
    capacity_rps: float
    pods: dict[str, str]  # Ready pod -> node
    loads: dict[str, LoadResult]
    server_p99_ms: dict[str, float | None]

    @property
    def sla_kept(self) -> bool:
        return bool(self.loads) and all(
            r.failed == 0 and (p := self.server_p99_ms.get(pod)) is not None and p <= self.server_budget_ms
            for pod, r in self.loads.items()
        )
