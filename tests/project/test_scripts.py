"""The GPU check runs on a machine without network: it may install only from .whl/, and the
preparation step brings every runtime need of gptqfmt that the GPU image lacks."""
import re
import subprocess
import sys
from importlib.metadata import requires

import pytest

from tests.support import ROOT, load_script

SCRIPTS = ROOT / "scripts"
# What the GPU image has (its package list, /work/.library/device KINDS.md, 2026-11-17) of
# gptqfmt's runtime dependencies and theirs.
ON_GPU_IMAGE = {"numpy", "click", "tqdm", "attrs", "typing-extensions"}


@pytest.mark.parametrize("name", ["gpu-check.sh", "prepare-gpu-wheels.sh", "fuzz.sh"])
def test_scripts_parse(name):
    subprocess.run(["bash", "-n", str(SCRIPTS / name)], check=True)


def test_gpu_check_never_reaches_for_the_network():
    text = (SCRIPTS / "gpu-check.sh").read_text()
    installs = re.findall(r"pip install[^\n]*(?:\\\n[^\n]*)*", text)
    assert installs, "gpu-check.sh installs its missing wheels"
    assert all("--no-index" in i for i in installs), installs
    assert "-e ." not in text  # an editable install would need setuptools from an index


def _name(req: str) -> str:
    return re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0].lower().replace("_", "-")


def _applies(req: str) -> bool:
    """Does this requirement apply on the GPU machine (Linux x86-64, CPython 3.12, no extras)?"""
    from packaging.requirements import Requirement

    marker = Requirement(req).marker
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    return marker is None or marker.evaluate(env)


def test_prepared_wheels_cover_what_the_gpu_image_lacks():
    text = (SCRIPTS / "prepare-gpu-wheels.sh").read_text()
    listed = {_name(w) for w in re.findall(r"([A-Za-z0-9_.-]+==[0-9][^\s)]*)", text)}
    meta = (ROOT / "pyproject.toml").read_text()
    deps = {_name(d) for d in re.findall(r'^\s+"([^"]+)",?$',
                                          meta.split("dependencies = [")[1].split("]")[0], re.M)}
    # what the code imports outside the standard library, each declared
    assert deps == {"numpy", "click", "jsonschema", "referencing", "tqdm"}

    def closure(names):
        seen, todo = set(), list(names)
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo += [_name(r) for r in (requires(n) or []) if _applies(r)]
        return seen

    needed = closure(deps) - ON_GPU_IMAGE
    assert needed <= listed, f"prepare-gpu-wheels.sh lacks {sorted(needed - listed)}"


def test_the_code_imports_only_what_it_declares():
    """Every top-level import of the package is the standard library, the package itself, a
    declared dependency, or an optional one imported lazily (cupy, torch; huggingface_hub,
    the [hub] extra)."""
    import ast
    import sys

    declared = {"numpy", "click", "jsonschema", "referencing", "tqdm"}
    optional = {"cupy", "torch", "huggingface_hub"}
    found = set()
    for p in (ROOT / "gptqfmt").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    third_party = found - set(sys.stdlib_module_names) - {"gptqfmt", "__future__"}
    assert third_party - optional == declared


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH came with Python 3.11")
def test_bench_children_import_the_benchs_own_tree(tmp_path):
    """Run from another checkout, `python -c` and `-m` would put its gptqfmt ahead of the
    bench's PYTHONPATH: the children must import the tree the bench belongs to."""
    path = list(sys.path)
    try:
        bench = load_script(ROOT / "bench" / "convert_bench.py")
    finally:
        sys.path[:] = path
    decoy = tmp_path / "other-checkout"
    (decoy / "gptqfmt").mkdir(parents=True)
    (decoy / "gptqfmt" / "__init__.py").write_text("")
    env = bench.child_env(tmp_path)
    for args in (["-c", "import gptqfmt; print(gptqfmt.__file__)"],
                 ["-m", "gptqfmt", "--version"]):
        r = subprocess.run([sys.executable, *args], cwd=decoy, env=env, capture_output=True,
                           text=True, check=True)
        assert str(decoy) not in r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", "import gptqfmt; print(gptqfmt.__file__)"],
                       cwd=decoy, env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == str(ROOT / "gptqfmt" / "__init__.py")
