"""One set of Prometheus queries per tick for every BatchedModel: one query per signal for all models, not per model.

The scaling loop (controller.loops.ScalingLoop) marks each pass (:meth:`SignalHub.new_pass`), naming every model the
pass will ask for, and then asks for each model in turn; the first request of a pass runs the eight queries for every
model the hub knows (asked for before, with Ready pods or not, or named for this pass), the others reuse those
answers (for at most ``max_age_s``) and only aggregate their own Ready pods (pure). A model the query set did not
cover (not named, or its namespace/model name changed) gets the eight queries for itself alone, merged in.

Why models without Ready pods are in the query set: the series selector names only namespaces and Triton model
names, so covering them costs nothing, and a fleet being created, whose pods turn Ready between passes, is then
one query set per pass. Covering only the models with Ready pods as of their last tick made every model that
turned Ready since then a query set of its own: 800 to 1,000 Prometheus queries per pass while 1,000 new models
came up (benchmarks/scale.py), 7 once they were all Ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import fields

from batchfill.adapters.metrics import PrometheusSignals, QueryFailure, QueryResults, SignalTarget, aggregate
from batchfill.policy.signals import ModelSignals


class SignalHub:
    """Thread-safe cache of the last query set.

    Args:
        source: the Prometheus reader (its ``window_s`` is the signal window).
        max_age_s: how long one query set serves later timers, seconds (half the timer interval is right).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, source: PrometheusSignals, max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, str], SignalTarget] = {}
        self._results: QueryResults | QueryFailure | None = None
        self._covered: frozenset[tuple[str, str]] = frozenset()
        self._at = -float("inf")
        self.query_sets = 0  # how many times Prometheus was asked (for the operator's own metrics and tests)

    @property
    def window_s(self) -> float:
        return self.source.window_s

    def signals(self, target: SignalTarget) -> ModelSignals:
        """The signals of ``target`` (its Ready pods as given now); never raises for Prometheus trouble.

        A target without Ready pods needs no answer (NoReadyPods) and asks nothing, but is remembered: the next
        query set covers it.
        """
        if not target.ready_pods:
            with self._lock:
                self._targets[target.key] = target
            return aggregate([target], QueryResults(), self.window_s)[target.key]
        with self._lock:
            self._targets[target.key] = target
            now = self._clock()
            covered = (target.namespace, target.model) in self._covered
            if self._results is None or now - self._at >= self.max_age_s:
                known = list(self._targets.values())
                self._results = self.source.query_all(known)
                self._covered = frozenset((t.namespace, t.model) for t in known)
                self._at = now
                self.query_sets += 1
            elif not covered:
                own = self.source.query_all([target])
                self.query_sets += 1
                if isinstance(own, QueryFailure) or isinstance(self._results, QueryFailure):
                    return aggregate([target], own, self.window_s)[target.key]
                self._results = _merged(self._results, own)
                self._covered = self._covered | {(target.namespace, target.model)}
            results = self._results
        return aggregate([target], results, self.window_s)[target.key]

    def new_pass(self, expected: Iterable[SignalTarget] = ()) -> None:
        """The next request runs a fresh query set: one per pass, however long the pass takes.

        ``expected``: the models the pass will ask for (only their namespace and Triton model name are used until
        they are asked for themselves); the query set covers them, so a model seen for the first time, or Ready
        for the first time, is not asked for alone.
        """
        with self._lock:
            self._at = -float("inf")
            for target in expected:
                self._targets.setdefault(target.key, target)

    def forget(self, namespace: str, name: str) -> None:
        """Stop querying for a deleted BatchedModel."""
        with self._lock:
            self._targets.pop((namespace, name), None)


def _merged(a: QueryResults, b: QueryResults) -> QueryResults:
    """The series of both (disjoint models: the second adds a model the first did not cover)."""
    return QueryResults(**{f.name: {**getattr(a, f.name), **getattr(b, f.name)} for f in fields(QueryResults)})
