"""The local Triton image's build script (inputs hash, modes) and the operator setting that runs it
(BATCHFILL_TRITON_CPU_IMAGE: the image and KIND_CPU instance groups, nothing else of the pod changes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from batchfill.controller import desired as desired_mod
from batchfill.controller.desired import desired_state, render_on_cpu
from batchfill.controller.settings import OperatorSettings
from batchfill.render.kube import Owner, build_deployment
from batchfill.testbed import images

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-triton-image.sh"
EXAMPLE = ROOT / "deploy" / "examples" / "ocr-recognizer.yaml"
LOCAL_IMAGE = "batchfill.local/tritonserver:2.51-0123456789abcdef"
OWNER = Owner(name="text-recognizer", namespace="ocr", uid="u-1")


def run_script(*args: str, env: dict[str, str], script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def script_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFILL_")}
    return {
        **env,
        "BATCHFILL_IMAGE_CACHE": str(tmp_path / "cache"),
        "BATCHFILL_PYPROJECT": str(ROOT / "pyproject.toml"),
    }


def archive_of(image: str, env: dict[str, str], script: Path = SCRIPT) -> str:
    out = run_script(image, "--print-path", env=env, script=script)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_archive_is_named_by_a_hash_of_the_inputs_and_only_they_change_it(
    script_env: dict[str, str], tmp_path: Path
) -> None:
    base = archive_of("triton", script_env)
    cache = script_env["BATCHFILL_IMAGE_CACHE"]
    assert base.startswith(cache + "/tritonserver-")
    assert base.endswith(".tar")
    assert archive_of("triton", script_env) == base  # deterministic
    # a mirror is not an input; every overridable input is
    assert archive_of("triton", {**script_env, "http_proxy": "http://127.0.0.1:9"}) == base
    changed = {
        "BATCHFILL_IMAGE_SUITE": "trixie",
        "BATCHFILL_IMAGE_DEB_PACKAGES": "python3.11 libpython3.11 tini curl",
        "BATCHFILL_IMAGE_NUMPY": "1.26.3",
        "BATCHFILL_IMAGE_ONNXRUNTIME": "1.31.0",
        "BATCHFILL_IMAGE_EXTRA_WHEELS": "packaging==26.4",
    }
    seen = {base}
    for key, value in changed.items():
        path = archive_of("triton", {**script_env, key: value})
        assert path not in seen, key
        seen.add(path)
    # the nvidia-pytriton pin is read from pyproject.toml
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        (ROOT / "pyproject.toml").read_text().replace("nvidia-pytriton==0.7.0", "nvidia-pytriton==0.6.0")
    )
    assert archive_of("triton", {**script_env, "BATCHFILL_PYPROJECT": str(pyproject)}) not in seen
    # the script's own text is an input (a copy next to scripts/lib, with one comment added)
    copy_dir = tmp_path / "scripts"
    shutil.copytree(ROOT / "scripts" / "lib", copy_dir / "lib")
    edited = copy_dir / SCRIPT.name
    edited.write_text(SCRIPT.read_text() + "# edited\n")
    assert archive_of("triton", script_env, script=edited) not in seen


def test_check_print_ref_and_a_cache_hit(script_env: dict[str, str]) -> None:
    assert run_script("--check", env=script_env).returncode == 1
    ref = run_script("--print-ref", env=script_env).stdout.strip()
    path = Path(archive_of("triton", script_env))
    assert ref.startswith("batchfill.local/tritonserver:2.51-")
    assert ref.endswith(path.stem.removeprefix("tritonserver-"))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    assert run_script("--check", env=script_env).returncode == 0
    hit = run_script(env=script_env)  # a build that finds the archive builds nothing, as any user
    assert hit.returncode == 0
    assert hit.stdout.strip().splitlines()[-1] == str(path)
    assert "up to date" in hit.stderr
    assert run_script("--bogus", env=script_env).returncode == 2


def test_ensure_image_forwards_progress_and_names_the_log_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python side against a stand-in script: progress lines forwarded, the archive returned, errors named."""
    cache = tmp_path / "cache"
    fake = tmp_path / "fake-build.sh"
    fake.write_text(
        "#!/bin/bash\n"
        f"archive={cache}/$1-test.tar\n"
        'case "$2" in --print-path) echo "$archive"; exit 0 ;;\n'
        '  --print-ref) echo "batchfill.local/$1:test"; exit 0 ;; esac\n'
        '[ -n "$FAIL" ] && { echo "[build-image] FAILED: no mirror" >&2; echo "noise" >&2; exit 3; }\n'
        'echo "[build-image] step one" >&2; echo "not a progress line" >&2\n'
        'mkdir -p "$(dirname "$archive")"; echo tar > "$archive"; echo "$archive"\n'
    )
    monkeypatch.setenv("BATCHFILL_BUILD_IMAGE_SCRIPT", str(fake))
    monkeypatch.setenv("BATCHFILL_IMAGE_CACHE", str(cache))
    with pytest.raises(images.ImageUnavailableError, match="missing; run"):
        images.ensure_image("sample", build=False)
    lines: list[str] = []
    got = images.ensure_image("sample", progress=lines.append)
    assert got == images.ImageArchive(cache / "sample-test.tar", "batchfill.local/sample:test")
    assert got.path.read_text() == "tar\n"
    assert lines[-1] == "[build-image] step one"
    assert "not a progress line" not in lines
    assert "not a progress line" in (cache / "sample-test.build.log").read_text()  # the whole output is logged
    assert images.ensure_image("sample", progress=lines.append) == got
    assert len(lines) == 2
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(images.ImageUnavailableError, match="exited with 3: a tool the build needs") as err:
        images.ensure_triton_image(progress=lines.append)
    assert "noise" in str(err.value)
    assert "triton-test.build.log" in str(err.value)


# --- BATCHFILL_TRITON_CPU_IMAGE ---------------------------------------------------------------------------------


@pytest.fixture
def production() -> Iterator[None]:
    render_on_cpu("")
    yield
    render_on_cpu("")


def example_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return spec


def triton_container(dep: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    return containers[0]


def test_the_setting_is_read_from_its_variable_and_rejects_spaces() -> None:
    assert OperatorSettings.from_env({}).triton_cpu_image == ""
    assert OperatorSettings.from_env({"BATCHFILL_TRITON_CPU_IMAGE": LOCAL_IMAGE}).triton_cpu_image == LOCAL_IMAGE
    with pytest.raises(ValidationError):
        OperatorSettings.from_env({"BATCHFILL_TRITON_CPU_IMAGE": "an image"})


def test_a_cpu_image_changes_the_image_and_the_instance_kind_and_nothing_else(production: None) -> None:
    spec = example_spec()
    prod = desired_state(spec)
    prod_dep = build_deployment(OWNER, prod.spec, prod.config_hash, 1)
    assert "kind: KIND_GPU" in prod.config
    assert prod.spec.triton.image != LOCAL_IMAGE

    render_on_cpu(LOCAL_IMAGE)
    local = desired_state(spec)
    local_dep = build_deployment(OWNER, local.spec, local.config_hash, 1)
    assert "kind: KIND_CPU" in local.config
    assert "KIND_GPU" not in local.config
    count = prod.plan_status.instanceCount * local.spec.triton.gpusPerReplica
    assert f"count: {count}" in local.config
    assert local.plan_status == prod.plan_status  # the same plan, only rendered for CPU
    assert triton_container(local_dep)["image"] == LOCAL_IMAGE
    assert local_dep["spec"]["template"]["spec"]["initContainers"][0]["image"] == LOCAL_IMAGE
    assert triton_container(local_dep)["resources"] == triton_container(prod_dep)["resources"]  # GPUs stay
    # everything else is production's: swap the two differences back and the Deployments are equal
    for c in (triton_container(local_dep), local_dep["spec"]["template"]["spec"]["initContainers"][0]):
        c["image"] = prod.spec.triton.image
    annotations = local_dep["spec"]["template"]["metadata"]["annotations"]
    annotations.update(prod_dep["spec"]["template"]["metadata"]["annotations"])  # the config hash
    # and the config's ConfigMap, which is named by the config's hash
    prod_config = next(v for v in prod_dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    volumes = local_dep["spec"]["template"]["spec"]["volumes"]
    volumes[:] = [prod_config if v["name"] == "config" else v for v in volumes]
    assert local_dep == prod_dep

    render_on_cpu("")
    assert desired_state(spec).config == prod.config  # back to production, from the same cache
    assert desired_mod.plan_cache.cache_info().hits >= 1
