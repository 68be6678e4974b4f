#!/usr/bin/env python3
"""Install what the operator image installs into a fresh venv, without Docker, and run the operator's commands.

    python3 scripts/check_operator_image.py [--python python3.11] [--keep]     (make image-check)

Reads the Dockerfile: its ``COPY`` sources make the build context (filtered by .dockerignore, as ``docker build``
does) and its ``RUN pip install ...`` line is run as written, in that context, with the venv's pip. The
Dockerfile's ``ENV`` applies except ``PIP_NO_CACHE_DIR``, so that a warm pip cache is used. Then it checks what
the image must do and must not carry:

* ``batchfill run --help``, ``batchfill plan examples/seed-example.yaml`` and ``batchfill crd`` work, and the
  operator's modules (``batchfill.cli.run``, ``batchfill.controller.handlers``) import without the test bed;
* no matplotlib, tritonserver (pytriton) or onnxruntime is installed, and the commands that need them exit 2
  with the one line naming their extra;
* ``pip check`` finds the installed set consistent.

Prints one line per check; exits 0 when all passed, 1 otherwise, 2 when the install itself failed. Takes one to two
minutes on this machine (longer than a unit test should take), hence a script.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "seed-example.yaml"
#: The modules of the extras the image must not carry (pyproject.toml, [project.optional-dependencies]).
NOT_IN_IMAGE = ("matplotlib", "pytriton", "onnxruntime")
#: The commands that need an extra, and the one line each prints without it (batchfill.cli.common.missing_extra).
NEED_AN_EXTRA = {
    ("simulate", str(SEED)): "batchfill simulate needs matplotlib (the 'simulate' extra): "
    "pip install 'batchfill[simulate]'",
    ("serve", str(ROOT / "examples" / "ocr-recognizer.yaml")): "batchfill serve needs pytriton, onnxruntime "
    "(the 'testbed' extra): pip install 'batchfill[testbed]'",
}
OPERATOR_IMPORTS = (
    "import sys, batchfill.cli.run, batchfill.controller.handlers; "
    "print(sorted(m for m in sys.modules if m.split('.')[:2] == ['batchfill', 'testbed']))"
)


@dataclass(frozen=True)
class ImageRecipe:
    """What the Dockerfile copies into its WORKDIR and how it installs the package."""

    copies: tuple[tuple[tuple[str, ...], str], ...]  # (sources relative to the context, destination)
    pip_install: tuple[str, ...]  # the RUN line's command, e.g. ("pip", "install", ".")
    env: dict[str, str]


def read_recipe(dockerfile: Path) -> ImageRecipe:
    """The COPY lines, the ``pip install`` command of the RUN line and the ENV of ``dockerfile``.

    Raises:
        ValueError: no ``RUN pip install`` line, or a COPY with options (--from, --chown), which this does not mimic.
    """
    text = re.sub(r"\\\n", " ", dockerfile.read_text())  # continuation lines joined
    copies = []
    env: dict[str, str] = {}
    pip: tuple[str, ...] = ()
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "COPY":
            if any(w.startswith("--") for w in words[1:]):
                raise ValueError(f"Dockerfile: {line.strip()}: COPY options are not mimicked")
            copies.append((tuple(words[1:-1]), words[-1]))
        elif words[0] == "ENV":
            env.update(w.split("=", 1) for w in words[1:] if "=" in w)
        elif words[0] == "RUN" and words[1:3] == ["pip", "install"]:
            command = words[1:]
            pip = tuple(command[: command.index("&&")] if "&&" in command else command)
    if not pip:
        raise ValueError(f"{dockerfile}: no `RUN pip install ...` line")
    return ImageRecipe(copies=tuple(copies), pip_install=pip, env=env)


def dockerignore_rules(path: Path) -> list[tuple[bool, str]]:
    """(excluded, pattern) per line of a .dockerignore, in order; the last matching rule decides."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            rules.append((not line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def ignored(relative: str, rules: list[tuple[bool, str]]) -> bool:
    """Whether .dockerignore keeps ``relative`` (a path inside the context, '/'-separated) out of the context.

    Patterns as Docker's: ``*`` does not cross '/', ``**/`` matches any number of directories, and a directory
    that is kept brings its contents unless a later rule excludes them.
    """
    decision = False
    parts = relative.split("/")
    for excluded, pattern in rules:
        for depth in range(1, len(parts) + 1):  # the path itself or one of its parent directories
            prefix = "/".join(parts[:depth])
            if _match(prefix, pattern):
                decision = excluded
                break
    return decision


def _match(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(_match("/".join(path.split("/")[i:]), tail) for i in range(len(path.split("/"))))
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def build_context(recipe: ImageRecipe, workdir: Path) -> list[str]:
    """Copy the COPY sources into ``workdir`` as the image's WORKDIR holds them; returns the problems found."""
    rules = dockerignore_rules(ROOT / ".dockerignore")
    problems = []
    for sources, destination in recipe.copies:
        for source in sources:
            if ignored(source, rules):
                problems.append(f"COPY {source}: .dockerignore keeps it out of the build context")
                continue
            target = workdir / destination / (Path(source).name if destination.endswith("/") else "")
            if (ROOT / source).is_dir():
                _copy_tree(ROOT / source, target, source, rules)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target)
    return problems


def _copy_tree(src: Path, dst: Path, relative: str, rules: list[tuple[bool, str]]) -> None:
    for path in sorted(src.rglob("*")):
        rel = f"{relative}/{path.relative_to(src).as_posix()}"
        if path.is_file() and not ignored(rel, rules):
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / path.relative_to(src))


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def check_installed(venv: Path) -> list[tuple[bool, str]]:
    """(passed, description) for each thing the image must do or must not carry."""
    bin_dir = venv / "bin"
    batchfill, python = str(bin_dir / "batchfill"), str(bin_dir / "python")
    results = []
    done = _run([batchfill, "run", "--help"])
    results.append((done.returncode == 0 and "--prometheus-url" in done.stdout, "batchfill run --help"))
    done = _run([batchfill, "plan", str(SEED), "-o", "json"])
    results.append((done.returncode == 0 and '"maxBatchSize": 7' in done.stdout, f"batchfill plan {SEED.name}"))
    done = _run([batchfill, "crd"])
    committed = (ROOT / "crds" / "batchedmodel.yaml").read_text().strip()
    results.append((done.returncode == 0 and done.stdout.strip() == committed, "batchfill crd is the committed CRD"))
    done = _run([python, "-c", OPERATOR_IMPORTS])
    results.append(
        (done.returncode == 0 and done.stdout.strip() == "[]", "the operator's modules import without the test bed")
    )
    for module in NOT_IN_IMAGE:
        done = _run([python, "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is None)"])
        results.append((done.stdout.strip() == "True", f"{module} is not installed"))
    for args, line in NEED_AN_EXTRA.items():
        done = _run([batchfill, *args])
        results.append((done.returncode == 2 and done.stderr == line + "\n", f"batchfill {args[0]} exits 2: {line}"))
    done = _run([python, "-m", "pip", "check"])
    results.append((done.returncode == 0, f"pip check: {done.stdout.strip() or done.stderr.strip()}"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--python", default="python3.11", help="interpreter for the venv (default python3.11)")
    parser.add_argument("--keep", action="store_true", help="keep the venv and the build context (path printed)")
    args = parser.parse_args(argv)
    recipe = read_recipe(ROOT / "Dockerfile")
    tmp = Path(tempfile.mkdtemp(prefix="batchfill-image-"))
    try:
        workdir = tmp / "src"
        problems = build_context(recipe, workdir)
        for problem in problems:
            print(f"FAIL {problem}")
        venv = tmp / "venv"
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
        env = {**os.environ, **recipe.env, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("PIP_NO_CACHE_DIR", None)  # the image starts empty; here the warm cache saves the downloads
        print(f"in {workdir}: {' '.join(recipe.pip_install)}", flush=True)
        log = tmp / "pip-install.log"
        with log.open("w") as out:
            installed = subprocess.run(
                list(recipe.pip_install), cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
            )
        if installed.returncode != 0:
            print(log.read_text()[-4000:], end="")
            print(f"FAIL {' '.join(recipe.pip_install)} exited {installed.returncode}")
            return 2
        version = _run(
            [str(venv / "bin" / "python"), "-c", "import sys, numpy; print(sys.version.split()[0], numpy.__version__)"]
        )
        print(f"installed on CPython {version.stdout.split()[0]} with numpy {version.stdout.split()[-1]}")
        results = check_installed(venv)
        for passed, what in results:
            print(f"{'ok  ' if passed else 'FAIL'} {what}")
        failed = len(problems) + sum(not passed for passed, _ in results)
        print(f"{len(results) + len(problems) - failed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
