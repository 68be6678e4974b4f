"""Bad input through the real API server and the real operator ("Bad input").

Every BatchedModel spec is either rejected by the API server (with the field named), or accepted and then either
planned or given a condition that names a ``spec.`` field; the operator never crashes, never loops, and never
writes NaN or infinity. The specs are 40 fixed draws of :func:`tests.fuzz_specs.fuzzed_specs` (near-valid
specs with wrong types, huge and tiny numbers, missing and unknown fields, long strings, reordered or duplicated
lists) plus a few hand-picked ones (1 MiB strings, a spec exactly as in examples/). Half are sent with
``fieldValidation=Strict`` (unknown fields rejected), half with the server's default (unknown fields dropped with
a warning), as kubectl and client libraries do.

The operator runs as in test_operator.py (the install's ServiceAccount) with a 5 s scaling tick and a 10 s
profiling tick, so a status write that repeats shows up within the quiet window. A ResourceQuota caps the
namespace at 12 pods: a spec may legitimately ask for 10,000 replicas.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from batchfill.api.reasons import ConditionType
from batchfill.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from batchfill.testbed.install import install_operator_rbac, operator_as_service_account

from ..fuzz_specs import MIB, SEED_SPEC, numbers, sample_specs
from .support import Kube, model_volume, rbac_denials, temp_namespace, wait_for

pytestmark = pytest.mark.cluster

N_FUZZED = 40
#: Seconds without any write to any BatchedModel that count as settled (> 8 scaling ticks, > 4 profiling ones).
QUIET_SECONDS = float(os.environ.get("BATCHFILL_FUZZ_QUIET_SECONDS", "45"))
#: How long the operator may take to handle every accepted spec, and then to stop writing (2 cores, shared).
HANDLED_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 300.0
CONDITION_TYPES = (ConditionType.CONFIG_VALID, ConditionType.SLA_FEASIBLE, ConditionType.PLANNED)
TRACEBACK_MARKERS = ("Traceback (most recent call last)", "failed with an exception")
#: The annotation kopf keeps the handled spec in (batchfill.controller.handlers.configure).
KOPF_COPY = "batchfill.io/last-handled-configuration"


def _hand_picked() -> list[tuple[str, dict[str, Any]]]:
    deployable = copy.deepcopy(SEED_SPEC)
    deployable["model"]["repository"] = {"pvc": {"claimName": "models"}}
    long_name = copy.deepcopy(deployable)
    long_name["model"]["name"] = "m" * MIB
    described = {**copy.deepcopy(deployable), "description": "d" * MIB}  # unknown: dropped, or Strict: refused
    # maps and objects copied into the pod template: once accepted with no length limit (kopf then failed to store
    # the handled spec in its annotation, 256 KiB at most, and retried for ever), now refused by the schema
    huge_selector = copy.deepcopy(deployable)
    huge_selector["triton"] = {"nodeSelector": {"example.com/zone": "z" * MIB}}
    huge_toleration = copy.deepcopy(deployable)
    huge_toleration["triton"] = {"tolerations": [{"key": "k", "operator": "Equal", "value": "v" * MIB}]}
    huge_quantity = copy.deepcopy(deployable)
    huge_quantity["triton"] = {"resources": {"limits": {"memory": "9" * MIB}}}  # an int-or-string: a CEL rule
    # accepted, but the Deployment would refuse them: the operator names the field in a condition instead
    bad_selector = copy.deepcopy(deployable)
    bad_selector["triton"] = {"nodeSelector": {"zone": "a b/c"}}
    bad_quantity = copy.deepcopy(deployable)
    bad_quantity["triton"] = {"resources": {"requests": {"cpu": "fast"}, "limits": {"memory": -1}}}
    # near the bounds, with every character one kopf escapes (`"`): its copy in kopf's annotation is ~100 KB and
    # must still fit (api.spec.SPEC_BYTES_MAX); non-ASCII text, which kopf would escape to up to 12 bytes a
    # character, is refused by the schema
    largest = copy.deepcopy(deployable)
    largest["triton"] = {
        "args": [f"--{i:02d}=" + '"' * 1019 for i in range(16)],
        "nodeSelector": {f"{i:02d}" + '"' * 315: '"' * 63 for i in range(32)},
        "tolerations": [{"key": '"' * 317, "operator": "Equal", "value": '"' * 63, "effect": "NoSchedule"}] * 16,
    }
    non_ascii = copy.deepcopy(deployable)
    non_ascii["triton"] = {"args": ["--log-info=\u00e9t\u00e9 \U0001f680" * 10]}
    return [
        ("largest-escaped", largest),
        ("args-non-ascii", non_ascii),
        ("model-name-1mib", long_name),
        ("description-1mib", described),
        ("node-selector-1mib", huge_selector),
        ("toleration-1mib", huge_toleration),
        ("quantity-1mib", huge_quantity),
        ("node-selector-syntax", bad_selector),
        ("quantity-syntax", bad_quantity),
    ]


def specs_under_test() -> list[tuple[str, dict[str, Any]]]:
    # at most 2 mutations: with more, nearly every spec is refused by the schema and never reaches the operator
    specs = sample_specs(N_FUZZED, deployable=True, max_mutations=2)
    fuzzed = [(f"fuzz-{i:02d}", s) for i, s in enumerate(specs)]
    return fuzzed + _hand_picked()


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Outcome:
    """What happened to one spec."""

    name: str
    spec: dict[str, Any]
    strict: bool
    request_bytes: int
    rejected_status: int | None = None  # HTTP status of an API-server rejection
    rejected_fields: list[str] = field(default_factory=list)
    rejected_message: str = ""
    verdict: str = ""  # planned / condition (accepted); "" until handled

    def describe(self) -> str:
        how = "Strict" if self.strict else "Warn"
        if self.rejected_status is not None:
            return f"{self.name} [{how}, {self.request_bytes} B]: HTTP {self.rejected_status} {self.rejected_fields}"
        return f"{self.name} [{how}, {self.request_bytes} B]: accepted -> {self.verdict or 'not handled'}"


@pytest.fixture(scope="module")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """CRD + RBAC from deploy/base, then ``batchfill run`` as the install's ServiceAccount with fast ticks."""
    work = tmp_path_factory.mktemp("fuzz-operator")
    install_operator_rbac(kube.kubeconfig, work)
    log = work / "operator.log"
    env = {
        "BATCHFILL_RECONCILE_INTERVAL_SECONDS": "5",
        "BATCHFILL_PROFILE_INTERVAL_SECONDS": "10",
        "BATCHFILL_PROMETHEUS_URL": "http://127.0.0.1:9",  # nothing listens: signals unknown at once
    }
    with operator_as_service_account(kube.kubeconfig, work, log, env=env, args=("--verbose",)) as proc:
        time.sleep(3)
        assert proc.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        yield Operator(proc, log)
    denied = rbac_denials(log.read_text())
    assert not denied, "the ServiceAccount lacked a permission:\n" + "\n".join(denied[:10])


def custom(kube: Kube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api)


def list_models(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    listed: Any = custom(kube).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    return {o["metadata"]["name"]: o for o in listed["items"]}


def _causes(err: ApiException) -> tuple[list[str], str]:
    """Field paths and message of an API error (422 causes; the message of 400 strict decoding errors)."""
    try:
        status = json.loads(err.body or "{}")
    except ValueError:
        return [], str(err.body)[:500]
    causes = (status.get("details") or {}).get("causes") or []
    return [str(c.get("field", "")) for c in causes], str(status.get("message", ""))[:2000]


def create(kube: Kube, ns: str, name: str, spec: dict[str, Any], strict: bool) -> Outcome:
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    size = len(json.dumps(body))
    outcome = Outcome(name, spec, strict, size)
    kwargs: dict[str, Any] = {"field_validation": "Strict"} if strict else {}
    try:
        custom(kube).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body, **kwargs)
    except ApiException as e:
        if e.status in (None, 0) or e.status >= 500:
            raise
        outcome.rejected_status = e.status
        outcome.rejected_fields, outcome.rejected_message = _causes(e)
    return outcome


def names_a_spec_field(o: Outcome) -> bool:
    """A rejection that says which field: 422 causes under spec, or 400 "unknown field \\"spec...\\"" (Strict).

    413 (request entity too large) names no field and counts as a rejection (the body is what is too large).
    """
    if o.rejected_status == 413:
        return True
    if o.rejected_status == 422:
        # "<nil>": "some validation rules were not checked because the object was invalid" (CEL skipped)
        named = [f for f in o.rejected_fields if f != "<nil>"]
        return bool(named) and all(f.startswith("spec") for f in named)
    if o.rejected_status == 400:
        return "spec." in o.rejected_message
    return False


def handled(bm: dict[str, Any]) -> bool:
    status = bm.get("status") or {}
    return bool(status.get("conditions")) and status.get("observedGeneration") == bm["metadata"].get("generation")


def verdict(bm: dict[str, Any]) -> str:
    """planned: Planned=True; condition: ConfigValid/SLAFeasible/Planned False naming a spec. field; else ""."""
    conditions = {c.get("type"): c for c in (bm.get("status") or {}).get("conditions") or []}
    if (conditions.get(ConditionType.PLANNED) or {}).get("status") == "True":
        return "planned"
    for t in CONDITION_TYPES:
        c = conditions.get(t) or {}
        if c.get("status") == "False" and "spec." in (c.get("message") or ""):
            return "condition"
    return ""


def tracebacks(log: str) -> list[str]:
    lines = log.splitlines()
    hits = [i for i, line in enumerate(lines) if any(m in line for m in TRACEBACK_MARKERS)]
    return ["\n".join(lines[max(0, i - 2) : i + 25]) for i in hits[:3]]


@pytest.fixture(scope="module")
def fuzzed(kube: Kube, operator: Operator) -> Iterator[tuple[str, list[Outcome]]]:
    """Every spec created in one namespace (with the model volume and a pod quota); deleted afterwards."""
    with temp_namespace(kube, prefix="bf-fuzz-", delete_timeout_s=240) as ns:
        kube.core.create_namespaced_resource_quota(
            ns, {"metadata": {"name": "cap"}, "spec": {"hard": {"pods": "12", "requests.nvidia.com/gpu": "4"}}}
        )
        model_volume(kube, ns)
        # no warm-up: 40 handlers start at once and race on API discovery (Kube holds a lock for it)
        outcomes = [
            create(kube, ns, name, spec, strict=i % 2 == 1) for i, (name, spec) in enumerate(specs_under_test())
        ]
        yield ns, outcomes


def test_rejections_name_the_field(fuzzed: tuple[str, list[Outcome]]) -> None:
    _, outcomes = fuzzed
    rejected = [o for o in outcomes if o.rejected_status is not None]
    print("\n" + "\n".join(o.describe() for o in outcomes))
    unnamed = [f"{o.describe()}: {o.rejected_message[:400]}" for o in rejected if not names_a_spec_field(o)]
    assert not unnamed, "rejections that name no spec field:\n" + "\n".join(unnamed)
    assert 0 < len(rejected) < len(outcomes), "the specs should be neither all accepted nor all rejected"
    by_name = {o.name: o for o in outcomes}
    assert by_name["largest-escaped"].rejected_status is None, by_name["largest-escaped"].rejected_message
    assert by_name["args-non-ascii"].rejected_status == 422
    assert any(f.startswith("spec.triton.args[0]") for f in by_name["args-non-ascii"].rejected_fields)


def test_accepted_specs_are_planned_or_get_a_field_named_condition(
    kube: Kube, operator: Operator, fuzzed: tuple[str, list[Outcome]]
) -> None:
    ns, outcomes = fuzzed
    accepted = {o.name: o for o in outcomes if o.rejected_status is None}
    assert accepted

    def all_handled() -> dict[str, dict[str, Any]] | None:
        models = list_models(kube, ns)
        return models if all(n in models and handled(models[n]) for n in accepted) else None

    deadline = time.monotonic() + HANDLED_TIMEOUT_S
    models = all_handled()
    while models is None and time.monotonic() < deadline and operator.proc.poll() is None:
        time.sleep(3)
        models = all_handled()
    models = models or list_models(kube, ns)
    problems = []
    for name, o in accepted.items():
        bm = models.get(name)
        if bm is None:
            problems.append(f"{name}: gone")
            continue
        status = bm.get("status") or {}
        if not handled(bm):
            problems.append(
                f"{name}: not handled in {HANDLED_TIMEOUT_S:.0f} s (observedGeneration "
                f"{status.get('observedGeneration')} vs generation {bm['metadata'].get('generation')}); spec "
                f"{json.dumps(o.spec)[:300]}"
            )
            continue
        o.verdict = verdict(bm)
        if KOPF_COPY not in (bm["metadata"].get("annotations") or {}):
            problems.append(f"{name}: kopf's copy of the handled spec ({KOPF_COPY}) was not stored")
        if not o.verdict:
            problems.append(
                f"{name}: neither Planned=True nor a condition naming a spec. field: {status['conditions']}"
            )
        json.dumps(status, allow_nan=False)
        if not all(math.isfinite(x) for x in numbers(status)):
            problems.append(f"{name}: a non-finite number in status {status}")
    print("\n" + "\n".join(o.describe() for o in accepted.values()))
    log = operator.text()
    assert not problems, "\n".join(problems) + "\n\noperator log (tail):\n" + log[-6000:]
    assert {o.verdict for o in accepted.values()} == {"planned", "condition"}


def test_nothing_keeps_writing(kube: Kube, operator: Operator, fuzzed: tuple[str, list[Outcome]]) -> None:
    """The BatchedModels' resourceVersions stop changing: no status write, kopf retry or annotation repeats."""
    ns, _ = fuzzed
    writes: dict[str, int] = {}
    last: dict[str, dict[str, Any]] = {}
    previous: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    quiet_since = time.monotonic()
    while True:
        models = list_models(kube, ns)
        for name, bm in models.items():
            old = last.get(name)
            if old is not None and old["metadata"]["resourceVersion"] != bm["metadata"]["resourceVersion"]:
                writes[name] = writes.get(name, 0) + 1
                previous[name] = old
                quiet_since = time.monotonic()
            last[name] = bm
        if time.monotonic() - quiet_since >= QUIET_SECONDS:
            break
        if time.monotonic() > deadline:
            busy = sorted(writes, key=lambda n: -writes[n])[:5]
            detail = "\n".join(
                f"{n}: {writes[n]} writes; last two statuses:\n  {json.dumps(previous[n].get('status'))[:1500]}\n"
                f"  {json.dumps(last[n].get('status'))[:1500]}\n  annotations "
                f"{json.dumps(last[n]['metadata'].get('annotations'))[:1500]}"
                for n in busy
            )
            pytest.fail(f"BatchedModels still written after {SETTLE_TIMEOUT_S:.0f} s:\n{detail}")
        time.sleep(2)
    print(f"\nsettled; writes seen while settling: {writes}")


def test_operator_alive_without_tracebacks(operator: Operator, fuzzed: tuple[str, list[Outcome]]) -> None:
    assert operator.proc.poll() is None, f"the operator exited:\n{operator.text()[-4000:]}"
    found = tracebacks(operator.text())
    assert not found, "tracebacks in the operator's log:\n\n" + "\n\n".join(found)


def test_all_delete_and_the_namespace_empties(
    kube: Kube, operator: Operator, fuzzed: tuple[str, list[Outcome]]
) -> None:
    ns, _ = fuzzed
    for name in list_models(kube, ns):
        with suppress(ApiException):
            custom(kube).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def leftovers() -> list[str]:
        out = [
            f"BatchedModel/{n} (finalizers {bm['metadata'].get('finalizers')})"
            for n, bm in list_models(kube, ns).items()
        ]
        out += [f"Deployment/{d.metadata.name}" for d in kube.apps.list_namespaced_deployment(ns).items]
        out += [f"Pod/{p.metadata.name}" for p in kube.core.list_namespaced_pod(ns).items]
        out += [f"Service/{s.metadata.name}" for s in kube.core.list_namespaced_service(ns).items]
        out += [
            f"ConfigMap/{c.metadata.name}"
            for c in kube.core.list_namespaced_config_map(ns).items
            if c.metadata.name != "kube-root-ca.crt"
        ]
        return out

    wait_for("every BatchedModel and child to be deleted", lambda: not leftovers() or None, 180)
    assert operator.proc.poll() is None, f"the operator exited:\n{operator.text()[-4000:]}"
    found = tracebacks(operator.text())
    assert not found, "tracebacks in the operator's log:\n\n" + "\n\n".join(found)


def test_undeployable_repositories_get_a_condition(kube: Kube, operator: Operator) -> None:
    no_repository = copy.deepcopy(SEED_SPEC)  # examples/seed-example.yaml as it is: plannable, not deployable
    object_store = copy.deepcopy(SEED_SPEC)
    object_store["model"]["repository"] = {"uri": "s3://bucket/models"}
    with temp_namespace(kube, prefix="bf-fuzz-repo-") as ns:
        for name, spec in (("seed-example-as-is", no_repository), ("object-store", object_store)):
            assert create(kube, ns, name, spec, strict=True).rejected_status is None

        def verdicts() -> dict[str, str] | None:
            models = list_models(kube, ns)
            out = {n: verdict(bm) if handled(bm) else "" for n, bm in models.items()}
            return out if all(out.values()) else None

        wait_for("conditions naming spec.model.repository", verdicts, 90)
