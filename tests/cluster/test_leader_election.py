"""Leader election against the real API server (kube-apiserver + etcd of the local dev cluster).

In-process: two :class:`batchfill.adapters.leader.LeaderElector` on one Lease, each with its own API client.
Exactly one leads; a killed leader (its renewals stop, the Lease is not released) is taken over within
``leaseDurationSeconds`` + one retry period of its last renewal, and not before the safety margin; a graceful
stop releases the Lease for a takeover within a retry period; a leader that sees another holder, or cannot reach
the API server for its renew deadline, reports the loss, and before anyone else leads.

End to end: ``batchfill run`` processes (two at a time) as the install's ServiceAccount (RBAC from deploy/base),
the standby answering its liveness endpoint; SIGKILL of the leader, SIGTERM of the leader, and a stolen Lease
(the leader exits 1).

The timing is shortened to 6 / 4 / 1 s (lease duration / renew deadline / retry period; renewals every 2 s) to
keep the tests short. The machine may be a noisy 2-core one: bounds carry SLACK_S, and measured times are printed
(``pytest -s``) and attached to the report.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.adapters.leader import LeaderElector
from batchfill.policy.leader import LeaseTiming
from batchfill.testbed import devcluster
from batchfill.testbed.install import OPERATOR_NS, install_operator_rbac, operator_as_service_account
from batchfill.testbed.process import free_port

from .support import Kube, rbac_denials, temp_namespace, wait_for

pytestmark = pytest.mark.cluster

TIMING = LeaseTiming(lease_duration_s=6, renew_deadline_s=4.0, retry_period_s=1.0)
SLACK_S = 4.0  # scheduling noise on a loaded 2-core machine, API latency
EPS_S = 0.1  # clock granularity between the two candidates' wall clocks (same host)
TIMING_ENV = {
    "BATCHFILL_LEADER_ELECTION_LEASE_DURATION_SECONDS": str(TIMING.lease_duration_s),
    "BATCHFILL_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": str(TIMING.renew_deadline_s),
    "BATCHFILL_LEADER_ELECTION_RETRY_PERIOD_SECONDS": str(TIMING.retry_period_s),
}


def report(request: pytest.FixtureRequest, line: str) -> None:
    """Print a measurement and keep it in the test report."""
    print(line)
    request.node.user_properties.append(("measured", line))


def read_lease(kube: Kube, ns: str, name: str) -> Any:
    return client.CoordinationV1Api(kube.api).read_namespaced_lease(name, ns)


def holder(kube: Kube, ns: str, name: str) -> str | None:
    try:
        return read_lease(kube, ns, name).spec.holder_identity
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def steal(kube: Kube, ns: str, name: str, thief: str) -> None:
    """Write the Lease as another holder, as an admin would (optimistic concurrency, retried on conflict)."""
    coord = client.CoordinationV1Api(kube.api)
    for _ in range(10):
        lease = coord.read_namespaced_lease(name, ns)
        lease.spec.holder_identity = thief
        try:
            coord.replace_namespaced_lease(name, ns, lease)
            return
        except ApiException as e:
            if e.status != 409:
                raise
    pytest.fail("could not write the Lease in 10 attempts")


class Candidate:
    """A LeaderElector with its own API client, campaigning in a thread; then renewing in the elector's thread."""

    def __init__(self, kube: Kube, ns: str, lease: str, identity: str) -> None:
        self.api = devcluster.api_client(kube.kubeconfig)
        self.lost_at: float | None = None
        self.lost_reasons: list[str] = []
        self.elector = LeaderElector(self.api, lease, ns, identity, TIMING, on_lost=self._lost)
        self.leading_since: float | None = None
        self._give_up = threading.Event()
        self._thread = threading.Thread(target=self._campaign, name=f"candidate-{identity}", daemon=True)

    @property
    def identity(self) -> str:
        return self.elector.identity

    def _lost(self, reason: str) -> None:
        self.lost_at = time.monotonic()
        self.lost_reasons.append(reason)

    def _campaign(self) -> None:
        if self.elector.acquire(self._give_up):
            self.leading_since = time.monotonic()
            self.elector.start_renewing()

    def start(self) -> Candidate:
        self._thread.start()
        return self

    def kill(self) -> None:
        """As SIGKILL: renewals stop, the Lease is left to expire."""
        self._give_up.set()
        self.elector.stop(release=False)

    def stop(self) -> None:
        """Graceful: the Lease is released."""
        self._give_up.set()
        self._thread.join(timeout=10)
        self.elector.stop(release=True)

    def close(self) -> None:
        self.kill()
        self._thread.join(timeout=10)
        self.api.close()


@pytest.fixture
def lease_ns(kube: Kube) -> Iterator[str]:
    with temp_namespace(kube, prefix="bf-lease-") as ns:
        yield ns


@pytest.fixture
def candidates(kube: Kube, lease_ns: str) -> Iterator[Callable[[str], Candidate]]:
    """Factory of started candidates on one Lease (unique per test); all closed after."""
    lease = f"batchfill-{uuid.uuid4().hex[:6]}"
    made: list[Candidate] = []

    def make(name: str) -> Candidate:
        c = Candidate(kube, lease_ns, lease, f"{name}_{uuid.uuid4()}").start()
        made.append(c)
        return c

    make.lease = lease  # type: ignore[attr-defined]
    yield make
    for c in made:
        c.close()


def one_leader(cands: list[Candidate], timeout_s: float = 15.0) -> Candidate:
    return wait_for("a leader", lambda: next((c for c in cands if c.elector.is_leader), None), timeout_s, 0.05)


def assert_exactly_one_leads(kube: Kube, ns: str, lease: str, cands: list[Candidate], seconds: float) -> Candidate:
    """For ``seconds``: one candidate leads, the same one, and the Lease names it and keeps being renewed."""
    leader = one_leader(cands)
    renew_times: set[datetime] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        leading = [c for c in cands if c.elector.is_leader]
        assert leading == [leader], f"leaders: {[c.identity for c in leading]}"
        spec = read_lease(kube, ns, lease).spec
        assert spec.holder_identity == leader.identity
        renew_times.add(spec.renew_time)
        time.sleep(0.25)
    if seconds > TIMING.renew_interval_s + 1:
        assert len(renew_times) >= 2, "the leader did not renew the Lease"
    return leader


# --- in-process ------------------------------------------------------------------------------------------------------
def test_exactly_one_leads_and_a_killed_leader_is_taken_over_within_lease_duration_plus_retry(
    kube: Kube, lease_ns: str, candidates: Any, request: pytest.FixtureRequest
) -> None:
    a, b = candidates("op-a"), candidates("op-b")  # campaign at the same time: one create wins, one gets 409
    leader = assert_exactly_one_leads(kube, lease_ns, candidates.lease, [a, b], 2 * TIMING.renew_interval_s + 1)
    standby = b if leader is a else a
    before = read_lease(kube, lease_ns, candidates.lease).spec

    killed_at = time.monotonic()
    leader.kill()
    last_renewal = read_lease(kube, lease_ns, candidates.lease).spec.renew_time  # no renewal after the kill
    wait_for("the standby to take over", lambda: standby.leading_since, TIMING.takeover_bound_s + SLACK_S + 5, 0.02)
    assert standby.leading_since is not None
    after = read_lease(kube, lease_ns, candidates.lease).spec
    from_kill = standby.leading_since - killed_at
    from_renewal = (after.acquire_time - last_renewal).total_seconds()  # both written with this host's clock
    report(
        request,
        f"killed leader: taken over {from_kill:.2f} s after the kill, {from_renewal:.2f} s after its last renewal "
        f"(contract: <= leaseDuration + retry = {TIMING.takeover_bound_s:g} s; not before "
        f"{TIMING.lease_duration_s - TIMING.retry_period_s:g} s)",
    )
    assert after.holder_identity == standby.identity
    assert after.lease_transitions == (before.lease_transitions or 0) + 1
    # liveness: within the contract (plus noise) ...
    assert from_renewal <= TIMING.takeover_bound_s + SLACK_S
    assert from_kill <= TIMING.takeover_bound_s + SLACK_S
    # ... and safety: not before the lease could have expired on the standby's clock
    assert from_renewal >= TIMING.lease_duration_s - TIMING.retry_period_s - EPS_S
    assert not leader.elector.is_leader
    assert not standby.lost_reasons


def test_graceful_stop_releases_the_lease_and_the_standby_takes_over_within_a_retry_period(
    kube: Kube, lease_ns: str, candidates: Any, request: pytest.FixtureRequest
) -> None:
    a, b = candidates("op-a"), candidates("op-b")
    leader = assert_exactly_one_leads(kube, lease_ns, candidates.lease, [a, b], 1.0)
    standby = b if leader is a else a
    stopped_at = time.monotonic()
    leader.stop()
    released_in = time.monotonic() - stopped_at
    wait_for("the standby to take over", lambda: standby.leading_since, TIMING.retry_period_s + SLACK_S + 5, 0.02)
    assert standby.leading_since is not None
    takeover = standby.leading_since - stopped_at
    report(
        request,
        f"graceful stop: released in {released_in:.2f} s, taken over {takeover:.2f} s after the stop "
        f"(contract: <= retry period = {TIMING.retry_period_s:g} s, vs {TIMING.takeover_bound_s:g} s unreleased)",
    )
    assert takeover <= TIMING.retry_period_s + SLACK_S
    assert takeover < TIMING.lease_duration_s - TIMING.retry_period_s  # clearly not by expiry
    assert read_lease(kube, lease_ns, candidates.lease).spec.holder_identity == standby.identity
    assert not leader.lost_reasons  # a stop is not a loss


def test_leader_that_sees_another_holder_reports_the_loss_at_its_next_renewal(
    kube: Kube, lease_ns: str, candidates: Any, request: pytest.FixtureRequest
) -> None:
    a = candidates("op-a")
    one_leader([a])
    stolen_at = time.monotonic()
    steal(kube, lease_ns, candidates.lease, "intruder")
    wait_for("the loss", lambda: a.lost_at, TIMING.renew_interval_s + SLACK_S, 0.02)
    assert a.lost_at is not None
    report(request, f"stolen Lease: loss reported {a.lost_at - stolen_at:.2f} s later (renewal every 2 s)")
    assert a.lost_reasons == ["the Lease is now held by intruder"]
    assert not a.elector.is_leader
    assert holder(kube, lease_ns, candidates.lease) == "intruder"  # the loser writes nothing


def test_leader_cut_off_from_the_api_server_gives_up_before_anyone_else_leads(
    kube: Kube, lease_ns: str, candidates: Any, request: pytest.FixtureRequest
) -> None:
    a = candidates("op-a")
    one_leader([a])
    b = candidates("op-b")
    time.sleep(TIMING.retry_period_s * 2)  # b is standing by
    assert not b.elector.is_leader
    cut_at = time.monotonic()
    a.api.configuration.host = "https://127.0.0.1:9"  # the leader's requests now fail (connection refused)
    wait_for("the loss", lambda: a.lost_at, TIMING.renew_deadline_s + SLACK_S, 0.02)
    wait_for("b to take over", lambda: b.leading_since, TIMING.takeover_bound_s + SLACK_S, 0.02)
    assert a.lost_at is not None
    assert b.leading_since is not None
    report(
        request,
        f"leader cut off: gave up {a.lost_at - cut_at:.2f} s after the cut (renew deadline "
        f"{TIMING.renew_deadline_s:g} s since its last renewal), standby led {b.leading_since - cut_at:.2f} s after "
        f"the cut; no overlap: {b.leading_since - a.lost_at:.2f} s between",
    )
    assert "could not renew" in a.lost_reasons[0]
    assert a.lost_at < b.leading_since  # never two leaders


# --- end to end: `batchfill run` as the install's ServiceAccount ----------------------------------------------------
def liveness(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            body: dict[str, Any] = json.loads(r.read() or b"{}")
            return body
    except OSError:
        return None


class Operator:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path, port: int) -> None:
        self.name, self.proc, self.log, self.port = name, proc, log, port

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def test_batchfill_run_replicas_elect_one_and_hand_over(
    kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    work = tmp_path_factory.mktemp("leader-e2e")
    install_operator_rbac(kube.kubeconfig, work)  # deploy/base: the leases Role in batchfill-system
    lease = f"batchfill-e2e-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        watched = stack.enter_context(temp_namespace(kube, prefix="bf-le-"))
        operators: dict[str, Operator] = {}

        def start(name: str) -> Operator:
            port = free_port()
            env = {
                "BATCHFILL_LEADER_ELECTION": "1",
                "BATCHFILL_LEADER_ELECTION_LEASE_NAME": lease,
                "POD_NAMESPACE": OPERATOR_NS,  # as the downward API sets it
                "POD_NAME": name,
                "BATCHFILL_NAMESPACES": watched,
                "BATCHFILL_PROMETHEUS_URL": "http://127.0.0.1:9",
                **TIMING_ENV,
            }
            log = work / f"{name}.log"
            proc = stack.enter_context(
                operator_as_service_account(
                    kube.kubeconfig, work, log, env=env, args=(f"--liveness=http://127.0.0.1:{port}/healthz",)
                )
            )
            operators[name] = Operator(name, proc, log, port)
            return operators[name]

        def leader_of(ops: list[Operator]) -> Operator | None:
            h = holder(kube, OPERATOR_NS, lease) or ""
            return next((o for o in ops if h.startswith(o.name + "_")), None)

        def kopf_serving(op: Operator) -> bool:
            body = liveness(op.port)
            return body is not None and "leader" not in body  # kopf's probe results, not the standby's answer

        a, b = start("op-a"), start("op-b")
        first = wait_for("a leader", lambda: leader_of([a, b]), 60, 0.1)
        second = b if first is a else a
        wait_for(f"{first.name}'s kopf liveness endpoint", lambda: kopf_serving(first), 60, 0.2)
        # the standby waits, alive: its liveness endpoint answers (a probe would not restart it)
        wait_for(f"{second.name} standing by", lambda: "standing by" in second.text(), 30, 0.2)
        body = liveness(second.port)
        assert body is not None
        assert body["leader"] is False
        assert body["identity"].startswith(second.name + "_")
        time.sleep(TIMING.lease_duration_s)  # longer than a lease: the leader renews, the standby keeps waiting
        assert leader_of([a, b]) is first
        assert second.proc.poll() is None
        assert liveness(second.port) == body  # still the standby's answer: kopf has not started there

        # 1. SIGKILL of the leader: the standby takes over when the Lease expires.
        killed_at = time.monotonic()
        first.proc.send_signal(signal.SIGKILL)
        wait_for("takeover after SIGKILL", lambda: leader_of([second]), TIMING.takeover_bound_s + SLACK_S + 10, 0.05)
        takeover_kill = time.monotonic() - killed_at
        wait_for(f"{second.name}'s kopf liveness endpoint", lambda: kopf_serving(second), 60, 0.2)

        # 2. SIGTERM of the leader with a standby: kopf stops, the Lease is released, the standby takes over.
        c = start("op-c")
        wait_for("op-c standing by", lambda: "standing by" in c.text(), 60, 0.2)
        termed_at = time.monotonic()
        second.proc.send_signal(signal.SIGTERM)
        wait_for("takeover after SIGTERM", lambda: leader_of([c]), 60, 0.05)
        takeover_term = time.monotonic() - termed_at
        assert second.proc.wait(timeout=30) == 0
        assert "released Lease" in second.text()

        # 3. A stolen Lease: the leader exits with status 1 at once.
        wait_for("op-c's kopf liveness endpoint", lambda: kopf_serving(c), 60, 0.2)
        stolen_at = time.monotonic()
        steal(kube, OPERATOR_NS, lease, "intruder")
        code = c.proc.wait(timeout=TIMING.renew_interval_s + SLACK_S + 5)
        exit_after = time.monotonic() - stolen_at

        report(
            request,
            f"batchfill run: takeover {takeover_kill:.2f} s after SIGKILL of the leader (contract "
            f"<= {TIMING.takeover_bound_s:g} s after its last renewal), {takeover_term:.2f} s after SIGTERM (kopf's "
            f"shutdown + release + <= {TIMING.retry_period_s:g} s); stolen Lease: exit {code} after "
            f"{exit_after:.2f} s",
        )
        assert takeover_kill <= TIMING.takeover_bound_s + SLACK_S
        assert code == 1
        assert "leader election lost" in c.text()
        for op in operators.values():
            denied = rbac_denials(op.text())
            assert not denied, f"{op.name}: the ServiceAccount lacked a permission:\n" + "\n".join(denied[:5])
        with suppress(ApiException):
            client.CoordinationV1Api(kube.api).delete_namespaced_lease(lease, OPERATOR_NS)
