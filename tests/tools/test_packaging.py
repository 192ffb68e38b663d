"""The two ways to install minicb ask for the same packages, and nothing installs as `kernels`."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_packages() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r
                                              for extra in project["optional-dependencies"].values()
                                              for r in extra]
    return {_name(r) for r in requirements}


def environment_packages(text: str | None = None) -> set[str]:
    """The packages under `dependencies:` (conda lines and the pip section; not the channels)."""
    text = text if text is not None else (ROOT / "environment.yml").read_text()
    names = set()
    for line in text.split("dependencies:", 1)[1].splitlines():
        item = re.match(r"^\s*-\s+([A-Za-z0-9_.\-\[\]]+.*?)\s*(#.*)?$", line)
        if item and not item.group(1).endswith(":"):
            names.add(_name(item.group(1)))
    return names - {"python", "pip"}


def test_every_folder_of_the_package_is_installed():
    """The package list is written out (kernels/ is mapped to minicb.kernels), so a new room
    missing from it would be absent from a wheel while an editable install still finds it."""
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                   ["packages"])
    folders = {".".join(path.parent.relative_to(ROOT).parts)
               for path in (ROOT / "minicb").rglob("__init__.py")}
    assert folders - declared == set(), f"add to pyproject.toml's packages: {folders - declared}"


def test_environment_yml_and_pyproject_list_the_same_packages():
    in_pyproject, in_environment = pyproject_packages(), environment_packages()
    assert in_pyproject - in_environment == set(), ("in pyproject.toml but missing from "
                                                    "environment.yml")
    assert in_environment - in_pyproject == set(), ("in environment.yml but missing from "
                                                    "pyproject.toml")


def test_the_check_notices_a_removed_package():
    text = (ROOT / "environment.yml").read_text()
    removed = "\n".join(line for line in text.splitlines() if "tokenizers" not in line)
    assert "tokenizers" in pyproject_packages() - environment_packages(removed)


def test_torch_pin_is_the_same_in_makefile_and_environment():
    pin = re.search(r"TORCH_SPEC\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert f"- {pin}" in (ROOT / "environment.yml").read_text()


def test_kernels_is_reached_as_minicb_kernels_never_as_top_level():
    assert importlib.util.find_spec("minicb.kernels") is not None
    spec = importlib.util.find_spec("kernels")
    assert spec is None or "minicb" not in str(spec.origin or ""), \
        "a top-level `kernels` module would shadow Hugging Face's kernels package"


# --- the commands a newcomer runs first ----------------------------------------------------------
def test_env_check_lists_every_declared_package_and_runs_a_kernel():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "minicb", "env-check"], capture_output=True,
                          text=True, timeout=300,
                          env={**__import__("os").environ, "TRITON_INTERPRET": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    checked = {line.split()[1].rstrip(":").lower() for line in done.stdout.splitlines() if line[:4]
               in ("OK  ", "WARN")}
    assert pyproject_packages() <= checked, ("env-check does not check "
                                             f"{pyproject_packages() - checked}")
    assert re.search(r"^OK   triton: (interpreter|compiled)", done.stdout, re.M), done.stdout
    assert re.search(r"^OK   cpu attention kernel: compiled \((\w+: )?-O3", done.stdout, re.M), \
        done.stdout
    assert done.stdout.rstrip().endswith("verdict: ready")


def test_env_check_warns_but_passes_without_a_c_compiler(monkeypatch, tmp_path, reload_cpu_kernel):
    from minicb.tools import env_check

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("MINICB_CACHE", str(tmp_path))
    line = env_check.cpu_kernel_line()
    assert (line.startswith("WARN cpu attention kernel:") and "no-such-cc" in line
            and "attention='torch'" in line)


def test_env_check_fails_on_a_missing_package_and_a_broken_kernel(monkeypatch):
    from packaging.requirements import Requirement

    from minicb.tools import env_check

    runtime, dev = env_check.requirements()
    monkeypatch.setattr(env_check, "requirements",
                        lambda: (runtime + [Requirement("minicb-no-such-package>=1")], dev))
    lines, ok = env_check.check(run_kernel=False)
    assert not ok
    assert any(line.startswith("FAIL minicb-no-such-package: missing") for line in lines), lines

    monkeypatch.setattr(env_check, "_TRITON_SMOKE", "raise SystemExit('kernel exploded')")
    kernel_ok, message = env_check.triton_smoke(cuda=False)
    assert not kernel_ok and "kernel exploded" in message


def test_demo_runs_every_system_and_they_agree():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "minicb", "demo", "--num-prompts", "6",
                           "--max-num-seqs", "3", "--workload",
                           "seed-example"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split() and line.split()[0]
            in {"naive+paged", "static+paged", "continuous+contiguous", "continuous+paged"}]
    assert len(rows) == 4, done.stdout
    assert all(row[-1] == "True" for row in rows), done.stdout


# --- the lock: a fresh clone installs the versions the notebooks were recorded with -------------
def _pins() -> dict[str, str]:
    from minicb.tools.env_check import locked_versions

    return locked_versions(ROOT / "constraints.txt")


def test_every_declared_package_is_pinned_within_its_declared_range():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in project["dependencies"]
                + [r for extra in project["optional-dependencies"].values() for r in extra]]
    pins = _pins()
    unpinned = [r.name for r in declared if canonicalize_name(r.name) not in pins]
    assert not unpinned, f"not pinned in constraints.txt (run make lock): {unpinned}"
    outside = [f"{r.name}=={pins[canonicalize_name(r.name)]} (pyproject wants {r.specifier})"
               for r in declared
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, outside


def test_the_lock_pins_torch_as_the_makefile_installs_it():
    pin = re.search(r"TORCH_SPEC\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert _pins()["torch"] == pin


def test_setup_installs_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"\$\(call install,\$\(VENV\),-c \$\(LOCK\) -e", makefile)
    # both of the install macro's installers (uv, and pip when uv cannot) get the arguments
    macro = re.search(r"^install = (.*?)\n(?!\t)", makefile, re.M | re.S).group(1)
    assert re.search(r"uv pip install .*\$\(2\)", macro) and re.search(
        r"\|\|.*\$\(1\)/bin/python -m pip install [^\n]*\$\(2\)", macro, re.S), macro
    assert re.search(r"^\$\(STAMP\):.*\$\(LOCK\)", makefile, re.M), "a new lock must re-run setup"


def test_env_check_warns_when_a_package_differs_from_the_lock(tmp_path, monkeypatch):
    import importlib.metadata

    from minicb.tools import env_check

    installed = importlib.metadata.version("transformers")
    lock = tmp_path / "constraints.txt"
    lock.write_text(f"# recorded\ntransformers==0.0.1 ; python_version >= '3.0'\n"
                    f"tqdm=={importlib.metadata.version('tqdm')}\n")
    read = env_check.locked_versions
    monkeypatch.setattr(env_check, "locked_versions", lambda: read(lock))
    lines, ok = env_check.check(run_kernel=False)
    line = next(line for line in lines if line.split()[1].rstrip(":") == "transformers")
    assert line.startswith("WARN transformers:") and installed in line and "0.0.1" in line, line
    assert any(line.startswith("OK   tqdm ") for line in lines), lines

