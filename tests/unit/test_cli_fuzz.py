"""Bad input, command-line level: every file a command reads, fuzzed, ends in exit 0 or 2 within a time and memory
bound, with one line per problem on stderr naming the file, and never a traceback.

The files are YAML or JSON text: the near-valid specs of :mod:`tests.fuzz_specs` written as a whole BatchedModel,
the same text cut short or spliced, random bytes and unicode, alias bombs, deep nesting, many documents, huge
numbers, NaN and infinities, and tags PyYAML's safe loader refuses. Each goes through the real ``main`` in-process
(derandomized hypothesis) for ``batchfill plan``, ``simulate``, ``serve`` and ``profile -f``; the last three stop
where their real work would start (the simulation, tritonserver, the Triton client), after the file was read and
validated. A sample of the most hostile files also runs in a subprocess under an address-space limit.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from batchfill.api.documents import MAX_DOCUMENT_BYTES, MAX_DOCUMENTS, MAX_NESTING
from batchfill.api.errors import MAX_PROBLEMS
from batchfill.cli.main import main

from ..fuzz_specs import RICH_SPEC, SEED_SPEC, fuzzed_specs

ROOT = Path(__file__).resolve().parents[2]
#: CPU-time bounds per input, seconds (CPU, not wall-clock: the machine is shared): reading, parsing and refusing a
#: file take milliseconds, half a second for a file at the value bound; planning one (the batcher simulation, a few
#: tenths of a second per document) gets more.
REFUSE_SECONDS_MAX = 2.0
PLAN_SECONDS_MAX = 10.0
#: Peak Python allocations of a refused input (tracemalloc, in a second run: tracing slows the planner's simulation
#: twentyfold, so planned inputs are bounded by the subprocess test's address-space limit instead), bytes: the file
#: itself (<= 1 MiB, as bytes and as str) and what the parser and validation hold. An expanded alias bomb would
#: need gigabytes.
PEAK_BYTES_MAX = 64 << 20
#: Files per run of `batchfill plan` (a fifth of it for each other command); about two minutes on the shared 2-core
#: machine, where a file that plans takes a few tenths of a second. BATCHFILL_CLI_FUZZ_EXAMPLES runs more.
EXAMPLES = int(os.environ.get("BATCHFILL_CLI_FUZZ_EXAMPLES", "250"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _document(spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batchfill.io/v1alpha1", "kind": "BatchedModel", "metadata": {"name": "m"}, "spec": spec}


def _dump(doc: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(doc, default=str)  # NaN and Infinity as JSON's non-standard tokens, which YAML reads
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def alias_bomb(width: int, levels: int) -> str:
    """``width ** levels`` strings in a few hundred bytes (the billion-laughs document), under spec.model."""
    lines = [f"a0: &a0 [{','.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join([*lines, "kind: BatchedModel", f"spec: {{model: *a{levels - 1}, sla: {{latencyP99Ms: 1}}}}"])


def nested(depth: int, block: bool) -> str:
    """A spec whose model is ``depth`` lists deep, in flow style or as indented block mappings."""
    if block:
        return "spec:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, depth)) + "  " * depth + "x"
    return "spec: {model: " + "[" * depth + "1" + "]" * depth + "}"


HOSTILE: tuple[str, ...] = (
    alias_bomb(9, 9),
    alias_bomb(2, 40),
    alias_bomb(100, 3),
    "a: &a [*a]\nspec: *a",
    "a: &a {b: *a}\n<<: *a",
    nested(MAX_NESTING + 1, block=False),
    nested(MAX_NESTING + 1, block=True),
    nested(5000, block=False),
    "[" + "1," * 400_000 + "1]",
    ("---\n" + alias_bomb(9, 4) + "\n") * 3000,  # each document under the value bound, all of them far over it
    "--- {}\n" * 140_000,
    "spec: {sla: {latencyP99Ms: " + "9" * 5000 + "}}",
    "spec: {sla: {latencyP99Ms: 1e99999, networkOverheadMs: .nan}}",
    "spec: {sla: {latencyP99Ms: -.inf}}",
    "spec: !!python/object/apply:os.system [echo pwned]",
    "spec: !!binary aGVsbG8=",
    "spec: {model: {name: !!set {a, b}}}",
    "metadata: {name: 2001-13-45}\nspec: {}",
    "? [a, b]\n: c",
    "spec: *undefined",
    "\ufeffspec: {model: {name: ü名\u202e}}",
    "# " + "x" * MAX_DOCUMENT_BYTES,
    "spec:\n\t- tab",
    "spec: '" + "\\" * 1000,
    "kind: BatchedModel\nspec: " + json.dumps({**SEED_SPEC, "profile": [{"batchSize": 1, "latencyMs": 1}] * 70_000}),
)


#: What a hand edit or a bad paste splices into a file: anchors, aliases, brackets, a tab, a quote, a tag.
SPLICES = ("&a ", "*a", "{", "]", ": ", "\n- ", "\t", "'", "!!", "%")


@st.composite
def cli_files(draw: st.DrawFn) -> bytes:
    """The bytes of one input file."""
    kind = draw(st.sampled_from(("spec", "spec", "spec", "mutated", "documents", "hostile", "bytes", "text")))
    if kind == "bytes":
        return draw(st.binary(max_size=512))
    if kind == "text":
        return draw(st.text(max_size=256)).encode("utf-8", "surrogatepass")
    if kind == "hostile":
        return draw(st.sampled_from(HOSTILE)).encode("utf-8")
    as_json = draw(st.booleans())
    if kind == "documents":
        n = draw(st.sampled_from((2, 3, MAX_DOCUMENTS + 1)))  # 101: refused before any is planned
        specs = [draw(fuzzed_specs(json_only=False, max_mutations=1)) for _ in range(min(n, 3))]
        texts = [_dump(_document(specs[i % len(specs)]), as_json=False) for i in range(n)]
        return "---\n".join(texts).encode("utf-8")
    text = _dump(_document(draw(fuzzed_specs(json_only=False))), as_json)
    if kind == "mutated":
        at = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(("cut", "insert", "duplicate")))
        if how == "cut":
            text = text[:at]
        elif how == "insert":
            text = text[:at] + draw(st.sampled_from(SPLICES)) + text[at:]
        else:
            text = text[:at] + text
    return text.encode("utf-8")


def _stub_downstream(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfill.cli import profile, serve, simulate

    monkeypatch.setattr(simulate, "run_simulation", lambda *a, **k: None)
    monkeypatch.setattr(serve, "serve", lambda *a, **k: SimpleNamespace(sla_kept=True))
    monkeypatch.setattr(profile, "run_profile", lambda *a, **k: {})


def _argv(command: str, path: str, output: str) -> list[str]:
    if command == "plan":
        return ["plan", path, "-o", output]
    if command == "profile":
        return ["profile", "--url", "localhost:1", "--model", "resnet50", "-f", path]
    return [command, path]


def run_cli(argv: list[str], trace: bool = False) -> tuple[int, str, str, float, int]:
    """``main(argv)`` in-process: exit code, stdout, stderr, CPU seconds, and (``trace``) the peak traced allocation
    in bytes (else 0)."""
    out, err = io.StringIO(), io.StringIO()
    if trace:
        tracemalloc.start()
    start = time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse; never expected here
                code = int(e.code or 0)
        seconds = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
    finally:
        if trace:
            tracemalloc.stop()
    return code, out.getvalue(), err.getvalue(), seconds, peak


def check_bounded_and_named(path: Path, data: bytes, argv: list[str]) -> tuple[int, str]:
    """The property; returns the exit code and stderr."""
    path.write_bytes(data)
    code, out, err, seconds, _ = run_cli(argv)
    assert "Traceback" not in out + err, err
    assert "internal error" not in err, err
    assert code in (0, 2), (code, err[-2000:])
    lines = err.splitlines()
    if code == 2:
        assert lines, "exit 2 without saying why"
        docs = max(1, min(MAX_DOCUMENTS, data.count(b"---") + 1))
        assert len(lines) <= docs * (MAX_PROBLEMS + 1), len(lines)
        for line in lines:  # one problem per line, each naming the file (and after it, a field or a place)
            assert line.startswith((f"{path}", f"-f {path}")), line
            _, sep, problem = line.partition(": ")
            assert sep, line
            assert problem.strip(), line
            assert len(line) <= 2000, line
        if "spec." not in err:  # refused as a file, before any document was planned
            assert seconds <= REFUSE_SECONDS_MAX, (seconds, data[:200])
            peak = run_cli(argv, trace=True)[4]
            assert peak <= PEAK_BYTES_MAX, (peak, data[:200])
    elif argv[0] == "plan":
        assert out.strip()
    assert seconds <= PLAN_SECONDS_MAX, (seconds, data[:200])
    return code, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    main(["plan", str(ROOT / "examples" / "seed-example.yaml"), "-o", "json"])  # imports outside the time bound
    return tmp_path_factory.mktemp("clifuzz")


def _outcome(code: int, err: str) -> str:
    if code == 0:
        return "planned"
    return "spec field" if ": spec." in err else "file"


def test_plan_reads_any_file_within_bounds(workdir: Path) -> None:
    """The property for `batchfill plan`, and that the generator is worth running: plans, refusals by field and
    refusals of the file itself (size, YAML, bounds) all occur."""
    path = workdir / "plan.yaml"
    seen: Counter[str] = Counter()

    @SETTINGS
    @given(data=cli_files(), output=st.sampled_from(("json", "yaml", "table")))
    @example(data=_dump(_document(SEED_SPEC), as_json=False).encode(), output="json")
    @example(data=_dump(_document(RICH_SPEC), as_json=True).encode(), output="yaml")
    @example(data=b"\xff\xfe\x00", output="json")
    def run(data: bytes, output: str) -> None:
        seen[_outcome(*check_bounded_and_named(path, data, _argv("plan", str(path), output)))] += 1

    run()
    assert min(seen[k] for k in ("planned", "spec field", "file")) >= EXAMPLES // 20, seen


@pytest.mark.parametrize("command", ["simulate", "serve", "profile"])
def test_the_other_commands_read_any_file_within_bounds(
    workdir: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stub_downstream(monkeypatch)
    path = workdir / f"{command}.yaml"
    seen: Counter[str] = Counter()

    @settings(SETTINGS, max_examples=EXAMPLES // 5)
    @given(data=cli_files())
    @example(data=_dump(_document(SEED_SPEC), as_json=False).encode())
    def run(data: bytes) -> None:
        seen[_outcome(*check_bounded_and_named(path, data, _argv(command, str(path), "table")))] += 1

    run()
    assert seen["planned"] >= 1, seen  # the stub was reached: the file passed every check
    assert seen["spec field"] + seen["file"] >= EXAMPLES // 20, seen


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("text", HOSTILE[:12], ids=[f"hostile{i}" for i in range(12)])
def test_hostile_files_are_refused_in_a_subprocess_under_a_memory_limit(tmp_path: Path, text: str) -> None:
    """The whole program, as a user runs it, under a 2 GiB address-space limit (an expanded alias bomb needs far
    more) and a deadline: exit 2, one line naming the file, no traceback."""
    f = tmp_path / "hostile.yaml"
    f.write_text(text, encoding="utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "batchfill.cli", "plan", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_address_space,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines(), "exit 2 without saying why"
    assert all(line.startswith(f"{f}: ") for line in r.stderr.splitlines()), r.stderr
    assert len(r.stderr) < 4000, r.stderr[:4000]


def test_the_largest_plannable_files_plan_in_a_subprocess_under_the_memory_limit(tmp_path: Path) -> None:
    """The planned side of the memory bound (in-process tracing is too slow for the simulation): the largest spec
    the API accepts, and ten rich ones in one file, plan under the same 2 GiB address-space limit."""
    from .test_status_size import largest_plannable_spec

    f = tmp_path / "large.yaml"
    docs = [_document(largest_plannable_spec())] + [_document(RICH_SPEC)] * 10
    f.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "batchfill.cli", "plan", str(f), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_address_space,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)) == 11
