"""GPU-hours at SLA: batchfill's policy against HPA, KEDA, static peak and the lower bound; simulator speed.

One run regenerates ``docs/benchmarks.md`` and its plots in ``docs/benchmarks/``:

0. **End to end** (the report's first section, :mod:`end_to_end`): batchfill against what teams run today
   (batching off, ``dynamic_batching {}`` defaults, the seed rule; each behind the HPA on GPU utilization at
   80 % and at its best target, and static peak) and KEDA on request rate at u·C, for three profile shapes; and
   the 1,000 req/s figures the comparison rests on.
1. **Cost** on a diurnal day (the headline), a bursty hour and a spike, for the seed example's realistic profile
   (``examples/seed-example.yaml``: l(1) = 10 ms, l(4) = 28 ms, l(8) = 50 ms, p99 SLA 100 ms, 10 ms outside
   Triton; ``maxReplicas`` raised to 64 so no policy is capped), every policy on the same arrivals
   (:mod:`batchfill.compare.run`). It prints the table and the targets (met, or missed by how much).
2. **Speed**: one simulated hour at a mean of 2,000 req/s under batchfill's policy, wall time against the 30 s
   target, side by side with the bare single-replica batcher on the same number of requests (the ratio is the
   fleet's overhead per request).
3. **Simulator against the real tritonserver**: the figures the component test
   ``tests/component/test_plan_meets_sla.py`` wrote to ``benchmarks/out/sim_vs_real.json`` (run that test first;
   the section says so when the file is missing).
4. **Shared GPUs**: the headline figures of ``benchmarks/fleet_shared.py`` (``benchmarks/out/shared.json``; run it
   first), linking to its page ``docs/benchmarks/shared.md``.

Prints figures; not a pass/fail test. About 10 minutes on 2 cores.

Run: .venv/bin/python benchmarks/fleet_cost.py [--quick] [--docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

import end_to_end
from batchfill.api.spec import BatchedModelSpec
from batchfill.api.validate import load_model
from batchfill.cli.simulate import print_comparison
from batchfill.compare.report import COLUMN_LEGEND, checks, figure, markdown_table
from batchfill.compare.run import POLICIES, Comparison, Options, compare, one_replica_at, prepare
from batchfill.policy.scaling import FAST_SCALE_IN_S
from batchfill.sim import traces
from batchfill.sim.batcher import poisson_unit_arrivals, simulate_batcher

ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = ROOT / "examples" / "seed-example.yaml"
SIM_VS_REAL = ROOT / "benchmarks" / "out" / "sim_vs_real.json"
#: Written by benchmarks/fleet_shared.py (run it first).
SHARED_JSON = ROOT / "benchmarks" / "out" / "shared.json"
#: Written by ``benchmarks/policy.py`` (its ``SUMMARY_JSON``; policy.py imports this module, so not from there).
POLICY_JSON = ROOT / "benchmarks" / "out" / "policy.json"
MAX_REPLICAS = 64
DIURNAL_MEAN_RPS = 500.0
SPEED_MEAN_RPS = 2000.0
SPEED_TARGET_S = 30.0
#: Tuned HPA-on-GPU targets run next to the common 80 % on the diurnal day.
HPA_SWEEP = ("hpa-gpu@85", "hpa-gpu@88", "hpa-gpu@90")


def load_spec() -> BatchedModelSpec:
    doc = yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8"))
    doc["spec"].setdefault("scaling", {})["maxReplicas"] = MAX_REPLICAS
    return load_model(doc).spec


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    trace: traces.Trace


def scenarios(quick: bool) -> list[Scenario]:
    day = 7200.0 if quick else 86_400.0
    return [
        Scenario(
            "diurnal",
            "Diurnal day (the headline)",
            traces.diurnal(DIURNAL_MEAN_RPS, duration_s=day, period_s=day, peak_to_trough=5.0, seed=1),
        ),
        Scenario("bursty", "Bursty hour", traces.bursty(DIURNAL_MEAN_RPS, cv=4.0, duration_s=3600.0, seed=2)),
        Scenario(
            "spike",
            "Spike: 3x for 10 minutes",
            traces.spike(300.0, 900.0, start_s=1200.0, length_s=600.0, duration_s=3600.0, seed=3),
        ),
    ]


def speed(spec: BatchedModelSpec, out: Console) -> dict[str, Any]:
    """One simulated hour at 2,000 req/s under batchfill's policy, against the bare batcher."""
    setup = prepare(spec)
    hour = traces.diurnal(SPEED_MEAN_RPS, duration_s=3600.0, period_s=3600.0, peak_to_trough=2.0, seed=4)
    t0 = time.perf_counter()
    result = compare(spec, hour, ["batchfill"], setup=setup)
    fleet_s = time.perf_counter() - t0
    run = result.runs[0]
    # the bare batcher on one replica, the same number of requests at the per-replica rate of the fleet
    per_replica = run.requests / max(1.0, run.gpu_seconds)
    unit = poisson_unit_arrivals(run.requests, 5) * (1000.0 / per_replica)
    t0 = time.perf_counter()
    simulate_batcher(unit.tolist(), setup.batcher, setup.latency_ms)
    bare_s = time.perf_counter() - t0
    figures = {
        "requests": run.requests,
        "fleetSeconds": fleet_s,
        "bareBatcherSeconds": bare_s,
        "overhead": fleet_s / bare_s,
        "targetSeconds": SPEED_TARGET_S,
        "met": fleet_s <= SPEED_TARGET_S,
        "peakReplicas": run.peak_replicas,
    }
    out.print(
        f"speed: 1 h at a mean of {SPEED_MEAN_RPS:g} req/s ({run.requests:,} requests, up to {run.peak_replicas} "
        f"replicas) in {fleet_s:.1f} s (target {SPEED_TARGET_S:g} s: {'met' if figures['met'] else 'MISSED'}); "
        f"bare one-replica batcher on as many requests {bare_s:.1f} s (fleet/bare {fleet_s / bare_s:.2f})",
        highlight=False,
    )
    return figures


def _pct(x: float) -> str:
    return f"{x:.4%}"


def note(key: str, c: Comparison, busy_at_capacity: float) -> str:
    """What the scenario shows, with its figures (computed, so a rerun keeps the text true)."""
    ours, static, queue = c.run("batchfill"), c.run("static-peak"), c.run("keda-queue")
    if ours is None or static is None or queue is None:
        raise SystemExit("the benchmark runs every policy; one is missing")
    if key == "diurnal":
        return (
            f"batchfill holds {ours.gpu_hours:.1f} GPU-hours, {ours.gpu_seconds / c.lower_bound_gpu_seconds:.3f} x "
            "the whole-replica lower bound: replicas follow the day up when their batches fill to the plan's "
            "fill at u·C (u raised on this calm day's traffic, policy/headroom.py; or, while the rate asks for "
            "more, to within the target's headroom of it) and down "
            "after the 300 s stabilization window (votes older than "
            f"{FAST_SCALE_IN_S:.0f} s count "
            "at full capacity, so the last minutes keep the target's headroom and older peaks only what their load "
            "needed). The HPA on GPU utilization at the common 80 % "
            "target holds more: a batching replica's busy fraction is concave in its load (small batches run "
            "back to back at low load, so the GPU looks busy per request), so proportional control on it "
            "over-provisions below capacity; the hpa-gpu@85/88/90 rows are the same HPA with tuned targets, and "
            "above about 90 % it stops scaling out at all (busy fraction at capacity: "
            f"{busy_at_capacity:.0%}). "
            f"keda-queue changes replicas {queue.scale_events} times: Triton's queue time is near zero while the "
            "fleet keeps up, so a proportional rule on it recommends minReplicas, the stabilization window then "
            "releases everything at once, the queue explodes, and the rule scales to maxReplicas — a bang-bang "
            "controller whatever the target."
        )
    if key == "bursty":
        return (
            f"No target applies: C is the capacity under Poisson arrivals, and with CV 4 bursts {c.static_replicas}"
            f" static replicas (the per-minute lower bound's count) keep only {static.slo_attainment:.2%} of "
            f"requests within the SLA. batchfill adds replicas when bursts saturate them and keeps "
            f"{ours.slo_attainment:.2%}, at {ours.gpu_hours:.2f} GPU-hours; the lower bound is not attainable "
            "for this traffic."
        )
    return (
        f"A 3 x step within a second, faster than the {c.options.startup_s:g} s replica start-up: every reactive "
        f"policy serves the first minute of the spike from the replicas it had, and its queue takes minutes to "
        f"drain (batchfill: {ours.slo_attainment:.2%} within the SLA). Only capacity held in advance (static "
        "peak, a higher minReplicas or a lower targetUtilization) covers a spike faster than start-up."
    )


def markdown(
    spec: BatchedModelSpec,
    results: list[tuple[Scenario, Comparison, str]],
    speed_fig: dict[str, Any],
    quick: bool,
    busy_at_capacity: float,
    lead: list[str],
) -> str:
    """The whole report; ``lead`` (the end-to-end section's lines) comes first."""
    first = results[0][1]
    st = first.setup
    o = first.options
    lines = [
        "# Benchmarks",
        "",
        "Generated by `.venv/bin/python benchmarks/fleet_cost.py` in one run"
        + (" (`--quick`: a compressed 2-hour day; run without it for the real figures)" if quick else "")
        + f" on {platform.machine()} with {platform.python_implementation()} {platform.python_version()}."
        " Do not edit by hand.",
        "",
        *lead,
        *policy_section(),
        "## Cost: GPU-hours at SLA",
        "",
        f"Model: the seed example's profile (l(1) = 10 ms, l(4) = 28 ms, l(8) = 50 ms), p99 SLA "
        f"{spec.sla.latencyP99Ms:g} ms with {spec.sla.networkOverheadMs:g} ms outside Triton, so T = "
        f"{st.plan.serverBudgetMs:g} ms. Plan: max_batch_size {st.plan.maxBatchSize}, preferred 1..."
        f"{st.plan.maxBatchSize}, {st.plan.maxQueueDelayMicroseconds} µs delay, capacity at SLA C = "
        f"{st.capacity_rps:.4g} req/s per replica (1 GPU); targetUtilization u = {spec.scaling.targetUtilization:g}, "
        f"scaleDownStabilizationSeconds {spec.scaling.scaleDownStabilizationSeconds}, maxReplicas {MAX_REPLICAS}.",
        "",
        f"Fleet: replicas start {o.startup_s:g} s after they are created (GPU held from creation), round-robin "
        f"load balancing over Ready replicas, autoscalers tick every {o.tick_s:g} s on {o.window_s:g} s "
        f"windows of {o.scrape_s:g} s scrapes; a removed replica drains its queue. Every policy sees the same "
        "arrivals. The policies and the reasons for their targets are in `operator/batchfill/compare/run.py`; "
        "the HPA algorithm (tolerance 10 %, 300 s scale-down stabilization, scale-up at most max(100 %, 4 pods) "
        "per 15 s) in `operator/batchfill/compare/autoscalers.py`.",
        "",
        f"Baseline targets: keda-rps {st.per_replica_target_rps:.4g} req/s per replica (u·C); keda-queue "
        f"{st.queue_ms_at_target:.3g} ms (the simulated mean queue time at u·C); hpa-gpu the common "
        f"{o.hpa_gpu_target:.0%} (by coincidence, one replica at u·C is {st.gpu_busy_at_target:.0%} busy), and on "
        "the diurnal day also 85, 88 and 90 % (`hpa-gpu@<pct>`), so the comparison includes the best-tuned "
        "target. The lower bound is "
        "`∫ ceil(λ_m / C) dt` with λ_m each minute's arrival rate (whole GPUs, no start-up, no headroom); the "
        "fractional bound drops the ceiling.",
        "",
        COLUMN_LEGEND + ".",
        "",
    ]
    for sc, c, png in results:
        lines += [f"### {sc.title}", "", c.trace_description + ".", "", markdown_table(c), ""]
        found = checks(c)
        if sc.key == "diurnal":
            lines += ["Targets:", ""]
            lines += [f"- {'met' if k.met else '**missed**'}: {k.target}: {k.measured}" for k in found]
            lines += [""]
        lines += [note(sc.key, c, busy_at_capacity), "", f"![{sc.title}]({png})", ""]
    lines += [
        "The scaling policy on generated noisy traffic (tuned and held-out traces, against its previous version "
        "and KEDA-rps, with the policy targets met or missed): [benchmarks/policy.md](benchmarks/policy.md), "
        "generated by `benchmarks/policy.py`.",
        "",
        *shared_section(),
        "## Simulator speed",
        "",
        f"One simulated hour at a mean of {SPEED_MEAN_RPS:g} req/s ({speed_fig['requests']:,} requests, up to "
        f"{speed_fig['peakReplicas']} replicas) under batchfill's policy: **{speed_fig['fleetSeconds']:.1f} s** "
        f"(target ≤ {SPEED_TARGET_S:g} s, {'met' if speed_fig['met'] else 'missed'}). The bare single-replica "
        f"batcher on as many requests takes {speed_fig['bareBatcherSeconds']:.1f} s: the fleet costs "
        f"{speed_fig['overhead']:.2f} x that. Wall times on a shared 2-core machine vary by about 20 %.",
        "",
        "## Simulator against the real tritonserver",
        "",
    ]
    if SIM_VS_REAL.exists():
        data = json.loads(SIM_VS_REAL.read_text(encoding="utf-8"))
        tol = data["tolerances"]
        plan = data["plan"]
        lines += [
            "From the last run of `tests/component/test_plan_meets_sla.py`: the sleep model "
            f"({data['model']['alpha_ms']:g} + {data['model']['beta_ms']:g}·b ms) on the real tritonserver 2.51, its "
            f"profile measured there, planned (max_batch_size {plan['maxBatchSize']}, capacity "
            f"{plan['capacityPerReplicaRps']:g} req/s, T = {plan['serverBudgetMs']:g} ms), {data['load_seconds']:g} s "
            f"of Poisson load (seed {data['seed']}); the simulator gets the same arrival times. Tolerances the test "
            f"asserts: p99 within {tol['p99_relative']:.0%} + {tol['p99_slack_ms']:g} ms, throughput within "
            f"{tol['throughput_relative']:.0%}, mean batch size within {tol['avg_batch_relative']:.0%}. "
            "`only_max` is Triton with `preferred_batch_size: [B]`, which the simulator does not model and the plan "
            "never renders: the test requires it to miss.",
            "",
            "| preferred sizes | load | req/s | p99 real (ms) | p99 sim (ms) | difference | throughput real / sim "
            "| mean batch real / sim |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in sorted(data["rows"], key=lambda r: (r["batcher"] != "plan", r["load_fraction"])):
            real, sim = row["real"], row["sim"]
            lines.append(
                f"| {'1..B (plan)' if row['batcher'] == 'plan' else '[B] only'} | {row['load_fraction']:.0%} "
                f"| {row['rate_rps']:.1f} | {real['p99_ms']:.1f} | {sim['p99_ms']:.1f} | {row['p99_diff_ms']:+.1f} ms "
                f"(allowed ±{row['p99_allowed_ms']:.1f}) | {real['rps']:.1f} / {sim['rps']:.1f} "
                f"| {real['avg_batch']:.2f} / {sim['avg_batch']:.2f} |"
            )
        lines.append("")
    else:
        lines += [f"`{SIM_VS_REAL.relative_to(ROOT)}` is missing: run `make test` (or the component test) first.", ""]
    return "\n".join(lines)


def _summary(path: Path, title: str, producer: str) -> tuple[dict[str, Any] | None, list[str]]:
    """``(figures, lines)``: the JSON another benchmark wrote at ``path`` and the section's heading lines, or
    ``(None, lines)`` saying that ``producer`` has to run first."""
    head = [f"## {title}", ""]
    if not path.exists():
        return None, [*head, f"`{path.relative_to(ROOT)}` is missing: run `{producer}` first.", ""]
    return json.loads(path.read_text(encoding="utf-8")), head


POLICY_SETS = {"tuned": "tuned", "heldOut": "held out"}


def _missed_by(met: bool, text: str) -> str:
    return "met" if met else f"**missed** ({text})"


def policy_section() -> list[str]:
    """The scaling policy's targets on noisy traffic: the per-trace verdicts ``benchmarks/policy.py`` wrote
    (POLICY_JSON), met or missed by how much, and how many traces meet each."""
    data, head = _summary(POLICY_JSON, "Scaling policy targets on noisy traffic", "benchmarks/policy.py")
    if data is None:
        return head
    t = data["targets"]
    lines = [
        *head,
        f"From `benchmarks/policy.py --hours {data['hours']:g}` on the seed example: generated noisy days (several "
        "shapes, noise levels and seeds), bursty hours and steps, the held-out ones not used for tuning. Targets: "
        f"≤ {t['xBound']:.2f} x the whole-replica lower bound at ≥ {t['minSlo']:.1%} of requests within the SLA; "
        f"≥ {t['savingVsKeda']:.0%} fewer GPU-hours than KEDA on request rate at u·C at equal or better attainment; "
        "fewer scale events than it. `oracle` knows each minute's rate one start-up and one tick ahead and holds "
        "whole replicas at C without headroom: the reference for what the targets ask. Every run, the traces and "
        "two more references: [benchmarks/policy.md](benchmarks/policy.md).",
        "",
        "| set | trace | batchfill: x bound, in SLA | KEDA-rps: x bound, in SLA | batchfill vs KEDA-rps GPU-h "
        f"| scale events, batchfill / KEDA-rps | oracle: x bound | ≤ {t['xBound']:.2f} x at ≥ {t['minSlo']:.1%} "
        f"| ≥ {t['savingVsKeda']:.0%} under KEDA-rps | fewer events |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    met = [0, 0, 0]
    oracle_met = [0, 0]
    n = 0
    for key, title in POLICY_SETS.items():
        for rec in data["sets"][key]:
            runs = rec["runs"]
            ours, keda, oracle = runs["batchfill"], runs["keda-rps"], runs["oracle"]
            saving = 1 - ours["gpuHours"] / keda["gpuHours"]
            ok = ours["met"]
            met = [m + bool(o) for m, o in zip(met, ok, strict=True)]
            oracle_met = [m + bool(o) for m, o in zip(oracle_met, oracle["met"][:2], strict=True)]
            n += 1
            over = ours["xBound"] - t["xBound"]
            short = [f"by {over:.3f} x"] if over > 0 else []
            if ours["sloAttainment"] < t["minSlo"]:
                short.append(f"{ours['sloAttainment']:.3%} in SLA")
            bound_text = ", ".join(short)
            keda_text = (
                "attainment below KEDA-rps"
                if saving >= t["savingVsKeda"]
                else f"only {saving:.1%} fewer"
                if saving >= 0
                else f"{-saving:.1%} more"
            )
            cells = [
                _missed_by(ok[0], bound_text),
                _missed_by(ok[1], keda_text),
                _missed_by(ok[2], f"{ours['scaleEvents']} vs {keda['scaleEvents']}"),
            ]
            lines.append(
                f"| {title} | {rec['trace']} | {ours['xBound']:.3f} x, {ours['sloAttainment']:.3%} "
                f"| {keda['xBound']:.3f} x, {keda['sloAttainment']:.3%} "
                f"| {abs(saving):.1%} {'fewer' if saving >= 0 else 'more'} "
                f"| {ours['scaleEvents']} / {keda['scaleEvents']} | {oracle['xBound']:.3f} x | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        f"batchfill meets ≤ {t['xBound']:.2f} x at ≥ {t['minSlo']:.1%} on {met[0]} of {n} traces, ≥ "
        f"{t['savingVsKeda']:.0%} under KEDA-rps on {met[1]} of {n}, fewer scale events on {met[2]} of {n}; the "
        f"oracle meets the first two on {oracle_met[0]} and {oracle_met[1]} of {n}. Why the policy stops where it "
        "does, and what was measured and not shipped: [design-notes.md](design-notes.md#autoscaling-policyscalingpy"
        "-controllerscalingdecide_scale-controllerloopsscalingloop).",
        "",
    ]
    return lines


#: What the fleet of shared GPUs is called in each run of benchmarks/fleet_shared.py, in the order shown.
SHARED_RUNS = {
    "operator": "what the operator does: re-planned 120 s into each period on the rates observed in it",
    "oracle": "planned on each period's own mean rate (an oracle forecast)",
    "follow": "one placement per 30 min period, planned on the previous period's rates, dedicated GPUs following",
    "previous": "one placement per 30 min period, planned on the previous period's rates",
}


def shared_section() -> list[str]:
    """Shared GPUs over a day: the headline figures ``benchmarks/fleet_shared.py`` wrote (SHARED_JSON)."""
    data, head = _summary(SHARED_JSON, "Shared GPUs: a fleet of 50 models over a day", "benchmarks/fleet_shared.py")
    if data is None:
        return head
    t = data["targets"]
    lines = [
        *head,
        "50 models (Zipf popularity, 2,000 req/s in all, three profiles and SLAs, diurnal rates with noise) placed "
        "by the joint plan on shared GPUs, against one model per GPU (today's batchfill) and the fractional bound "
        f"Σ λ/C; targets: ≤ {t['xBound']:g} x the bound, ≥ {t['saving']:.0%} fewer GPU-hours than one model per "
        f"GPU, every model ≥ {t['worstModel']:.1%} within its SLA. How, and where and why the targets are missed: "
        "[benchmarks/shared.md](benchmarks/shared.md), generated by `benchmarks/fleet_shared.py`.",
        "",
        "| run | shared GPU-h | x bound | fewer than one model per GPU | worst model in SLA | one model per GPU: "
        "GPU-h, worst model | moves/day |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, title in SHARED_RUNS.items():
        r = data["runs"].get(key)
        if r is None:
            continue
        lines.append(
            f"| {title} | {r['gpuHoursShared']:.1f} | {r['gpuHoursShared'] / r['gpuHoursBound']:.3f} "
            f"| {1 - r['gpuHoursShared'] / r['gpuHoursOneModelPerGpu']:.1%} | {r['worstModel']:.3%} "
            f"({r['worstModelName']}) | {r['gpuHoursOneModelPerGpu']:.1f}, {r['worstModelOnePerGpu']:.3%} "
            f"| {r['movesPerDay']} |"
        )
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a compressed 2-hour day (for a smoke run)")
    parser.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown report to write")
    args = parser.parse_args()
    out = Console(soft_wrap=True, width=140)
    spec = load_spec()
    docs = Path(args.docs)
    png_dir = docs.parent / "benchmarks"
    png_dir.mkdir(parents=True, exist_ok=True)
    e2e, figures, settles, day = end_to_end.run(args.quick, out)
    lead = end_to_end.markdown_lines(e2e, figures, settles, day)
    setup = prepare(spec)
    results = []
    busy_at_capacity, _ = one_replica_at(setup.batcher, setup.latency_ms, setup.capacity_rps, seed=9, requests=50_000)
    for sc in scenarios(args.quick):
        t0 = time.perf_counter()
        policies = [*POLICIES, *HPA_SWEEP] if sc.key == "diurnal" else list(POLICIES)
        c = compare(spec, sc.trace, policies, Options(), setup=setup)
        out.rule(f"{sc.title} ({time.perf_counter() - t0:.0f} s)")
        print_comparison(c, out, targets=sc.key == "diurnal")
        png = png_dir / f"{sc.key}.png"
        figure(c, f"{sc.title}: {c.trace_description}").savefig(png, dpi=100)
        results.append((sc, c, f"benchmarks/{png.name}"))
    out.rule("Speed")
    speed_fig = speed(spec, out)
    docs.write_text(markdown(spec, results, speed_fig, args.quick, busy_at_capacity, lead) + "\n", encoding="utf-8")
    out.print(f"wrote {docs} and {png_dir}/*.png", highlight=False)
    # figures for tooling
    summary = {sc.key: [k.__dict__ for k in checks(c)] for sc, c, _ in results}
    summary["endToEnd"] = [
        {"profile": shape.key, "runs": {r.policy: [r.gpu_hours, r.slo_attainment] for r in c.runs}} for shape, c in e2e
    ]
    (ROOT / "benchmarks" / "out").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "out" / "fleet_cost.json").write_text(
        json.dumps({"checks": summary, "speed": speed_fig}, indent=2, default=float) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
