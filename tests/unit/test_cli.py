"""`batchfill plan` and `batchfill crd` as a user runs them: exit codes, output shapes, no tracebacks."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchfill.api.reasons import PlanWarningReason
from batchfill.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed-example.yaml"


def test_plan_json_has_plan_seed_rule_and_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED), "-o", "json", "--rps", "500"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"plan", "seedRule", "config"}
    assert out["seedRule"]["maxQueueDelayMicroseconds"] == 40000
    assert out["plan"]["maxBatchSize"] == 7
    assert "max_batch_size: 7" in out["config"]
    assert out["replicas"]["replicas"] == 6  # ceil(500 / (0.85 * 110.0))


def test_plan_table_shows_seed_rule_and_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED), "--rps", "500"]) == 0
    out = capsys.readouterr().out
    assert "40000" in out
    assert "max_queue_delay_microseconds: 100" in out
    assert "replicas for 500 req/s" in out


def test_several_documents_are_each_planned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(SEED.read_text())
    other = json.loads(json.dumps(doc))
    other["metadata"]["name"] = "other"
    other["spec"]["sla"]["latencyP99Ms"] = 200
    f = tmp_path / "two.yaml"
    f.write_text(yaml.safe_dump_all([doc, other]))
    assert main(["plan", str(f), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in out] == ["resnet50", "other"]


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_plan_warnings_print_in_every_output(tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str) -> None:
    """A warning's reason is a StrEnum member: YAML (safe_dump refuses str subclasses) and JSON print its value."""
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["batching"] = {"maxBatchSize": 4096}  # above the profile: capped, with a warning
    f = tmp_path / "capped.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f), "-o", output]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out) if output == "yaml" else json.loads(out)
    assert [(w["reason"], w["path"]) for w in printed["warnings"]] == [
        (PlanWarningReason.MAX_BATCH_SIZE_CAPPED, "spec.batching.maxBatchSize")
    ]


def test_bad_input_exits_2_with_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["batching"] = {"maxBatchSize": 8, "preferredBatchSizes": [4, 16]}
    doc["spec"]["scaling"] = {"minReplicas": 3, "maxReplicas": 1}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == [
        f"{f}: spec.batching.preferredBatchSizes[1]=16 exceeds spec.batching.maxBatchSize=8",
        f"{f}: spec.scaling.minReplicas=3 exceeds spec.scaling.maxReplicas=1",
    ]
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: [unclosed", "YAML does not parse"),
        ("just a string", "(document): must be a mapping"),
        ("kind: Pod\nspec: {}", "kind: must be BatchedModel"),
        ("spec: {}", "spec.model: is required"),
    ],
)
def test_malformed_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "/nonexistent/x.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_infeasible_sla_exits_2_with_the_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["sla"] = {"latencyP99Ms": 130, "networkOverheadMs": 40}
    doc["spec"]["profile"] = [{"batchSize": 1, "latencyMs": 120}]
    f = tmp_path / "slow.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    assert "latency at batch 1 is 120 ms, budget is 90 ms" in capsys.readouterr().err


def test_a_spec_without_a_profile_points_to_batchfill_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(SEED.read_text())
    del doc["spec"]["profile"]
    f = tmp_path / "unprofiled.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{f}: spec.profile: is required to plan: give each batch size's execution latency (measure it with "
        "`batchfill profile`)"
    ]


def test_crd_command_prints_the_committed_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out.strip() == (ROOT / "crds" / "batchedmodel.yaml").read_text().strip()


def test_no_kopf_handler_is_declared_with_zero_retries_or_a_timer() -> None:
    """docs/field-cases.md#retries: ``retries=0`` means "never run" in kopf; and a timer or daemon would add a
    finalizer, so a BatchedModel could not be deleted while the operator is down (scaling runs in
    controller.loops.ScalingLoop)."""
    import kopf

    import batchfill.controller.handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    changing = list(registry._changing.get_all_handlers())
    spawning = list(registry._spawning.get_all_handlers())
    assert {str(h.id) for h in changing} >= {"reconcile_handler", "deleted"}
    assert all(h.retries is None or h.retries >= 1 for h in changing), [(h.id, h.retries) for h in changing]
    assert spawning == [], [h.id for h in spawning]
    assert all(not h.requires_finalizer for h in changing), [h.id for h in changing if h.requires_finalizer]


def _alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases stand for 9**levels strings (the billion-laughs document)."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join([*lines, "apiVersion: batchfill.io/v1alpha1", "kind: BatchedModel", "metadata: {name: bomb}",
                      f"spec:\n  model: *a{levels - 1}"])  # fmt: skip


def test_a_yaml_alias_bomb_is_refused_at_once_not_expanded(tmp_path: Path) -> None:
    """Issue 15 item 10: 500 bytes that expand to 387 million values. A subprocess with a deadline, so a regression
    fails instead of hanging the suite (the deadline is a hang guard, not a speed target: it ends in well under 1 s)."""
    import subprocess
    import sys

    f = tmp_path / "bomb.yaml"
    f.write_text(_alias_bomb())
    assert len(f.read_bytes()) < 600
    r = subprocess.run(
        [sys.executable, "-m", "batchfill.cli", "plan", str(f)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    assert "(document): expands to more than 100,000 values (YAML aliases?)" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: " + "[" * 70 + "]" * 70, "nests deeper than 64 levels"),
        ("# " + "x" * (1 << 20) + "\nspec: {}", "bytes, over the 1,048,576 bytes a file of BatchedModels may have"),
    ],
    ids=["deep", "big"],
)
def test_oversized_inputs_exit_2_with_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    assert main(["plan", str(f)]) == 2
    assert expected in capsys.readouterr().err


def test_a_huge_value_in_an_error_is_rendered_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(yaml.safe_dump([list(range(20_000))] * 3))  # a list, not a mapping
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert "(document): must be a mapping" in err
    assert len(err) < 400, err


def test_a_profile_of_one_point_above_batch_size_1_is_refused_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15 item 8: one point at batch size 8 planned 'feasible' at 0.9 req/s per replica."""
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["profile"] = [{"batchSize": 8, "latencyMs": 50}]
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    assert "spec.profile: has one point (batchSize 8): at least two batch sizes are needed" in capsys.readouterr().err
    doc["spec"]["profile"] = [{"batchSize": 1, "latencyMs": 50}]  # one point at 1: no batching, a sound plan
    doc["spec"].pop("batching", None)
    f.write_text(yaml.safe_dump(doc))
    main(["plan", str(f)])
    assert "spec.profile: has one point" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sla", "batching"), [((100.3, 90.3), {"maxBatchSize": 0}), ((20.2, 10.2), {"maxBatchSize": 0})]
)
def test_a_budget_equal_to_the_latency_is_feasible_despite_float_rounding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sla: tuple[float, float], batching: dict[str, int]
) -> None:
    """Issue 15 item 9: 100.3 - 90.3 is 9.999999999999996 in floats, which failed l(1) = 10 ms."""
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["sla"] = {"latencyP99Ms": sla[0], "networkOverheadMs": sla[1]}
    doc["spec"]["batching"] = batching
    f = tmp_path / "edge.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f), "-o", "json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["plan"]["serverBudgetMs"] == 10


def test_at_the_edge_with_batching_the_error_names_the_queue_delay_not_a_field_never_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["sla"] = {"latencyP99Ms": 100.3, "networkOverheadMs": 90.3}
    f = tmp_path / "edge.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert "budget is 10 ms" in err
    assert "shortest queue delay (0.1 ms) does not fit" in err
    assert "spec.batching.maxBatchSize: 0" in err
    assert "preferredBatchSizes" not in err


def _plan_subprocess(args: list[str], stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """`batchfill plan ARGS` as a user runs it, under a 2 GiB address-space limit and a deadline, so a regression
    fails instead of filling the machine's memory or hanging the suite (both are guards, not speed targets)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        [sys.executable, "-m", "batchfill.cli", "plan", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit,
    )


def test_an_endless_file_or_stdin_is_read_only_up_to_the_bound() -> None:
    """/dev/zero and an endless pipe were read whole into memory (MemoryError, exit 1) before the size check."""
    r = _plan_subprocess(["/dev/zero"])
    assert (r.returncode, r.stderr) == (
        2,
        "/dev/zero: (file): is more than 1,048,576 bytes, over the 1,048,576 bytes a file of BatchedModels may have\n",
    )
    with open("/dev/zero", "rb") as zero:
        r = _plan_subprocess(["-"], stdin=zero)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("-: (file): is more than 1,048,576 bytes, over the"), r.stderr


def test_a_file_over_the_bound_names_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.yaml"
    f.write_bytes(b"#" * (3 << 20))
    assert main(["plan", str(f)]) == 2
    assert capsys.readouterr().err == (
        f"{f}: (file): is 3,145,728 bytes, over the 1,048,576 bytes a file of BatchedModels may have\n"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (("---\n" + _alias_bomb(4) + "\n") * 3000, "(document): expands to more than 100,000 values (YAML aliases?)"),
        ("[" + "1," * 400_000 + "1]", "(document): expands to more than 100,000 values (YAML aliases?)"),
        ("--- {}\n" * 100_000, "(file): holds more than 100 YAML documents"),
        ("spec: {sla: {latencyP99Ms: " + "9" * 5000 + "}}", "(document): YAML value cannot be read: Exceeds the limit"),
        ("metadata: {name: 2001-13-45}\nspec: {}", "(document): YAML value cannot be read: month must be in 1..12"),
        ("a: &a [1, *a]\nspec: *a", "(document): alias *a refers to a value that contains it"),
        ("spec: \x07", "character 7: YAML does not parse: control characters are not allowed (#x0007)"),
    ],
    ids=["bomb-documents", "flat-list", "empty-documents", "big-integer", "bad-date", "recursive", "control-char"],
)
def test_files_that_were_slow_or_crashed_are_refused_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    """3,000 small alias bombs, each under the bound alone, were parsed whole and each planned (6,000 lines); a
    1 MiB list 13 s; a 5,000-digit number or a bad date ended in an internal error (exit 1)."""
    f = tmp_path / "x.yaml"
    f.write_text(text)
    start = time.monotonic()
    r = _plan_subprocess([str(f)])
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"{f}: "), lines[0]
    assert expected in lines[0], lines[0]
    assert time.monotonic() - start < 30  # seconds, wall-clock: a hang guard on a shared machine
