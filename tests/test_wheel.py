"""A wheel built from the repo, installed in a fresh venv, runs inspect and finds its data files."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CKPT, ROOT


@pytest.mark.slow
def test_wheel_installs_and_finds_schemas_and_kernels(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(ROOT)], check=True, cwd=tmp_path)
    wheel = next(dist.glob("gptqfmt-*.whl"))
    venv = tmp_path / "venv"
    # system site-packages provide numpy/click/jsonschema offline; gptqfmt comes from the wheel
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--force-reinstall", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import gptqfmt, gptqfmt.resources as r; print(gptqfmt.__file__); "
             "print(r.data_dir('schemas')); print(r.data_dir('kernels'))")
    lines = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True,
                           cwd=tmp_path, env=env).stdout.split()
    site = Path(lines[0]).parent
    assert str(site).startswith(str(venv)), lines
    assert Path(lines[1]) == site / "schemas" and (site / "schemas" / "inspect.schema.json").is_file()
    assert Path(lines[2]) == site / "kernels" and (site / "kernels" / "gptq_dequant.h").is_file()
    r = subprocess.run([str(venv / "bin" / "gptqfmt"), "inspect",
                        str(CKPT / "b4-sym-noact-gptq_v2-sharded"), "--format", "json"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["checkpoint_format"]["detected"] == "gptq_v2"
    assert doc["config_sources"] == ["config.json:quantization_config", "quantize_config.json"]
