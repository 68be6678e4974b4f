"""A stalled watch on the real API server: the operator's BatchedModel WATCH stops forwarding without closing.

The operator talks to the dev cluster's kube-apiserver through :class:`batchfill.testbed.api_proxy.WatchStallingProxy`.
Once the model is served, the proxy stalls every WATCH of batchedmodels (the open stream gets no further byte, a
new one is never answered), so kopf never hears of the edit that follows, whatever its own timeouts do; LISTs and
writes still pass. The scaling loop must notice that ``status.observedGeneration`` lags ``metadata.generation``
past ``BATCHFILL_UNHANDLED_GENERATION_SECONDS`` and reconcile the edit itself, with one ``GenerationUnhandled``
Event; once the watch flows again, kopf's own handling changes nothing more.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import ConditionType, EventReason
from batchfill.api.spec import GROUP, PLURAL, VERSION
from batchfill.render.kube import CONFIG_HASH_ANNOTATION
from batchfill.testbed.api_proxy import WatchStallingProxy
from batchfill.testbed.install import install_operator_rbac

from .conftest import USE_EXISTING
from .support import Kube, Operator, model_volume, rbac_denials, require_gpus, temp_namespace, until, wait_for
from .test_operator import batched_model, custom, get_bm, is_true

pytestmark = pytest.mark.cluster

INTERVAL_S = 2.0
BOUND_S = 10.0
#: What the operator may take past the bound: a scaling interval to notice, the reconcile, and the operator's
#: pooled connections that had been open through the proxy (a request timeout each, at worst).
SLACK_S = 25.0
ENV = {
    "BATCHFILL_RECONCILE_INTERVAL_SECONDS": f"{INTERVAL_S:g}",
    "BATCHFILL_UNHANDLED_GENERATION_SECONDS": f"{BOUND_S:g}",
    "BATCHFILL_REQUEST_TIMEOUT_SECONDS": "5",
}


@pytest.fixture
def proxied(kube: Kube, tmp_path: Any) -> Iterator[tuple[WatchStallingProxy, Operator]]:
    if USE_EXISTING or kube.info is None:
        pytest.skip("the proxy serves with the dev cluster's own serving certificate (its PKI)")
    install_operator_rbac(kube.kubeconfig, tmp_path)
    with WatchStallingProxy(kube.info.server, kube.info.run_dir / "pki") as proxy:
        operator = Operator(kube, tmp_path, env=ENV, args=("--verbose",), server=proxy.url)
        operator.start()
        try:
            yield proxy, operator
        finally:
            operator.stop()
    denied = rbac_denials(operator.logs())
    assert not denied, "the ServiceAccount lacked a permission:\n" + "\n".join(denied[:10])


def events_of(kube: Kube, ns: str, name: str, reason: str) -> list[Any]:
    items = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in items if e.reason == reason]


def handled_sla(bm: dict[str, Any]) -> dict[str, Any]:
    """The SLA of the spec kopf's handlers last handled (its diff base, an annotation)."""
    text = (bm["metadata"].get("annotations") or {}).get(f"{GROUP}/last-handled-configuration") or "{}"
    sla: dict[str, Any] = json.loads(text).get("spec", {}).get("sla", {})
    return sla


def config_hash(kube: Kube, ns: str, name: str) -> str:
    try:
        dep = kube.apps.read_namespaced_deployment(f"{name}-triton", ns)
    except ApiException:
        return ""
    return str((dep.spec.template.metadata.annotations or {}).get(CONFIG_HASH_ANNOTATION) or "")


def test_an_edit_behind_a_stalled_watch_is_reconciled_by_the_loop_within_the_bound(
    kube: Kube, proxied: tuple[WatchStallingProxy, Operator]
) -> None:
    proxy, operator = proxied
    require_gpus(kube)
    with temp_namespace(kube) as ns:
        model_volume(kube, ns)
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, batched_model("frozen"))
        until("Planned=True", lambda: get_bm(kube, ns, "frozen"), lambda b: is_true(b, ConditionType.PLANNED), 90)
        first = wait_for("the first config", lambda: config_hash(kube, ns, "frozen"), 60)
        wait_for("kopf's BatchedModel watch through the proxy", lambda: proxy.watches("batchedmodels"), 30)

        proxy.stall("batchedmodels")
        edited = time.monotonic()
        custom(kube).patch_namespaced_custom_object(  # the admin's client: straight to the API server
            GROUP, VERSION, ns, PLURAL, "frozen", {"spec": {"sla": {"latencyP99Ms": 70, "networkOverheadMs": 10}}}
        )
        bm = until(
            "the edit handled behind the stalled watch",
            lambda: get_bm(kube, ns, "frozen"),
            lambda b: b["status"].get("observedGeneration") == b["metadata"]["generation"] == 2,
            BOUND_S + SLACK_S,
        )
        took = time.monotonic() - edited
        assert took > BOUND_S, f"handled after {took:.1f} s: the stall did not hold kopf's watch"
        assert proxy.watches("batchedmodels") >= 1, "kopf's watch is still held open by the proxy"
        assert config_hash(kube, ns, "frozen") not in ("", first), "the edited SLA's config is rolled out"
        assert is_true(bm, ConditionType.PLANNED)
        time.sleep(3 * INTERVAL_S)  # more ticks: the event is not repeated
        (event,) = events_of(kube, ns, "frozen", EventReason.GENERATION_UNHANDLED)
        assert event.type == "Warning"
        assert "generation 2 was not handled" in event.message

        proxy.resume()  # kopf gets the edit at last: its update handler finds nothing left to do
        until(
            "kopf's handler to record the edit",
            lambda: get_bm(kube, ns, "frozen"),
            lambda b: handled_sla(b).get("latencyP99Ms") == 70,
            60,
        )
        time.sleep(2 * INTERVAL_S)
        assert len(events_of(kube, ns, "frozen", EventReason.GENERATION_UNHANDLED)) == 1
        assert len(events_of(kube, ns, "frozen", EventReason.CONFIG_CHANGED)) == 1, "the config rolled once"
        assert operator.alive()
