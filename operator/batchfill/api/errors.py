"""Field-named problems: what every user-facing error is made of."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from batchfill.api.reasons import SpecReason


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


#: Longest field path and message a problem keeps, and most problems one error keeps (one more says how many
#: were left out). All of them joined become a condition's message, which the API server caps at 32768
#: characters (status.conditions[].message); a spec with a 1 MB string or 128 duplicated tensor names must
#: still get its condition written, not a status write the server refuses on every retry.
MAX_PATH_CHARS = 256
MAX_MESSAGE_CHARS = 512
MAX_PROBLEMS = 30


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 40, 40


def describe_value(value: Any) -> str:
    """A short rendering of a user's value for a message: bounded in time and size however big the value is
    (``repr`` of a document built from YAML aliases would render it whole first)."""
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

    ``reason`` is a CamelCase condition reason, a :class:`~batchfill.api.reasons.SpecReason`.
    """

    def __init__(self, problems: Sequence[Problem], reason: str = SpecReason.INVALID_SPEC) -> None:
        if not problems:
            raise ValueError("SpecError needs at least one problem")
        kept = [Problem(_clip(p.path, MAX_PATH_CHARS), _clip(p.message, MAX_MESSAGE_CHARS)) for p in problems]
        if len(kept) > MAX_PROBLEMS:
            rest = len(kept) - MAX_PROBLEMS
            kept = [*kept[:MAX_PROBLEMS], Problem(kept[MAX_PROBLEMS].path, f"and {rest} more problem(s) not listed")]
        self.problems: tuple[Problem, ...] = tuple(kept)
        self.reason = reason
        super().__init__("; ".join(str(p) for p in self.problems))


class InfeasibleSLAError(SpecError):
    """No configuration meets the SLA, not even batch size 1; the message gives the numbers."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__(problems, reason=SpecReason.SLA_INFEASIBLE)
