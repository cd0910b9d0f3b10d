"""The wheel, as a user gets it: built from the tree, installed into a venv WITHOUT system
site-packages (so an editable install elsewhere cannot serve a module the wheel lacks), with its
runtime dependencies resolved by pip; then every module imports and every command runs on
shipped fixtures."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.support import CKPT, ROOT, c_compiler


def source_modules() -> list[str]:
    """Every module of the source tree, so a subpackage missing from the wheel fails.
    (__main__ runs the CLI when imported; `python -m gptqfmt` covers it.)"""
    out = []
    for p in sorted((ROOT / "gptqfmt").rglob("*.py")):
        if p.name == "__main__.py":
            continue
        parts = p.relative_to(ROOT).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def clean_copy(dst):
    """The tree as a fresh clone has it: tracked and untracked-but-not-ignored files only, so
    a stale build/ or *.egg-info cannot put a module into the wheel that setup would drop."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (ROOT / name).is_file() and not name.startswith("fixtures/"):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    tree = clean_copy(tmp / "tree")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(tree)], check=True, cwd=tmp)
    wheel = next(dist.glob("gptqfmt-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the runtime dependencies come from the wheel's own metadata, as for a user
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {"wheel": wheel, "venv": venv, "py": py, "bin": venv / "bin" / "gptqfmt",
            "env": env, "cwd": tmp}


def run(installed, *args, ok=(0,)):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       cwd=installed["cwd"], env=installed["env"])
    assert r.returncode in ok, (args, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return r


@pytest.mark.slow
def test_every_source_module_imports_from_the_wheel(installed):
    mods = source_modules()
    assert "gptqfmt.ops.equivalence" in mods and len(mods) > 20
    # the CuPy backend is the optional extra [cuda12]/[cuda13]: without CuPy it may fail to
    # import for that reason alone
    probe = ("import importlib, sys, gptqfmt\n"
             "assert gptqfmt.__file__.startswith(sys.prefix), gptqfmt.__file__\n"
             f"for m in {mods!r}:\n"
             "    try:\n"
             "        importlib.import_module(m)\n"
             "    except ModuleNotFoundError as e:\n"
             "        if e.name != 'cupy' or m != 'gptqfmt.numerics.cupy_backend': raise\n"
             "print(len(mods := [m for m in sys.modules if m.startswith('gptqfmt')]))")
    assert int(run(installed, installed["py"], "-c", probe).stdout) >= len(mods) - 1


@pytest.mark.slow
def test_the_wheel_ships_data_files_and_py_typed(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    schemas = {p.name for p in (ROOT / "schemas").glob("*.json")}
    kernels = {p.name for p in (ROOT / "kernels").iterdir() if p.is_file()}
    assert {f"gptqfmt/schemas/{n}" for n in schemas} <= names
    assert {f"gptqfmt/kernels/{n}" for n in kernels} <= names
    assert "gptqfmt/py.typed" in names
    # the compiled loops and header reader, where this machine's build could compile them
    if c_compiler():
        for ext in ("gptqfmt/bits/_native.", "gptqfmt/safetensors_io/_native."):
            assert any(n.startswith(ext) for n in names), sorted(names)
    assert not any(n.startswith(("tests/", "fixtures/", "bench/")) for n in names)
    probe = ("import gptqfmt.resources as r; print(r.data_dir('schemas')); "
             "print(r.data_dir('kernels'))")
    lines = run(installed, installed["py"], "-c", probe).stdout.split()
    assert all(line.startswith(str(installed["venv"])) for line in lines), lines


@pytest.mark.slow
def test_every_command_runs_from_the_wheel(installed, tmp_path):
    from gptqfmt.version import __version__

    exe = installed["bin"]
    assert run(installed, exe, "--version").stdout.strip().endswith(__version__)
    src = CKPT / "b4-sym-noact-gptq_v2-sharded"
    doc = json.loads(run(installed, exe, "inspect", src, "--format", "json").stdout)
    assert doc["checkpoint_format"]["detected"] == "gptq_v2"
    assert doc["config_sources"] == ["config.json:quantization_config", "quantize_config.json"]
    doc = json.loads(run(installed, exe, "verify", src, "--format", "json").stdout)
    assert doc["status"] == "ok"
    bad = json.loads(run(installed, exe, "verify", CKPT / "mislabelled-b4-sym-v2-as-gptq",
                         "--format", "json", ok=(1,)).stdout)
    assert "GQ401" in {f["code"] for f in bad["findings"]}
    dst = tmp_path / "v1"
    doc = json.loads(run(installed, exe, "convert", src, dst, "--to", "gptq", "--format",
                         "json").stdout)
    assert doc["written"] and doc["to"] == "gptq" and dst.is_dir()
    run(installed, exe, "verify", src, "--against", dst)  # kernels/ read from the wheel
    run(installed, installed["py"], "-m", "gptqfmt", "inspect", dst)
    # the CI formats, and the pre-commit hook's entry point (.pre-commit-hooks.yaml)
    log = json.loads(run(installed, exe, "verify", src, "--format", "sarif").stdout)
    assert log["version"] == "2.1.0" and log["runs"][0]["invocations"][0]["exitCode"] == 0
    hook = installed["venv"] / "bin" / "gptqfmt-pre-commit"
    assert "OK (configs, index and headers" in run(installed, hook, src / "config.json").stdout


@pytest.mark.slow
def test_a_machine_without_a_compiler_installs_and_runs_the_numpy_loops(tmp_path):
    """The extension is optional: with no working C compiler (CC=false) the wheel builds
    without it, installs, and verify gives the same document as this process."""
    from gptqfmt.ops.verify import validate

    tree = clean_copy(tmp_path / "tree")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "dist"), str(tree)], check=True, cwd=tmp_path,
                   env={**env, "CC": "false", "LDSHARED": "false"})
    wheel = next((tmp_path / "dist").glob("gptqfmt-*.whl"))
    assert not any(n.startswith(("gptqfmt/bits/_native.", "gptqfmt/safetensors_io/_native."))
                   for n in zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                   check=True, env=env)
    src = CKPT / "b4-asym-act-gptq-sharded"
    installed = {"cwd": tmp_path, "env": env}
    probe = "from gptqfmt.bits import native; print(native.available())"
    assert run(installed, venv / "bin" / "python", "-c", probe).stdout.strip() == "False"
    got = json.loads(run(installed, venv / "bin" / "gptqfmt", "verify", src, "--format",
                         "json").stdout)
    want = validate(src).to_json()
    assert got.pop("exit_code") == 0
    assert {k: v for k, v in got.items() if k != "tool"} == \
        {k: v for k, v in want.items() if k != "tool"}
