"""Field-named problems: what every user-facing error is made of."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def field_path(loc: Iterable[Any], root: str = "spec") -> str:
    """Render a location tuple as a Kubernetes-style field path.

    ``("batching", "preferredBatchSizes", 1)`` -> ``spec.batching.preferredBatchSizes[1]``.
    """
    out = root
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the field path and a message with the numbers."""

    path: str
    message: str

    def __str__(self) -> str:
        # "spec.x[1]=16 exceeds ..." reads as one sentence; other messages follow a colon.
        sep = "" if self.message.startswith("=") else ": "
        return f"{self.path}{sep}{self.message}"


class SpecError(ValueError):
    """A BatchedModel spec that cannot be served; carries every problem found, each naming its field.

    ``reason`` is a CamelCase condition reason (``InvalidSpec``, ``InvalidBatching``, ``SLAInfeasible``).
    """

    def __init__(self, problems: Sequence[Problem], reason: str = "InvalidSpec") -> None:
        if not problems:
            raise ValueError("SpecError needs at least one problem")
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.reason = reason
        super().__init__("; ".join(str(p) for p in self.problems))


class InfeasibleSLAError(SpecError):
    """No configuration meets the SLA, not even batch size 1; the message gives the numbers."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__(problems, reason="SLAInfeasible")
