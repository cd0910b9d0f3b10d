"""inspect, verify and convert keep a small record per module and nothing more: the memory they
allocate (tracemalloc's peak, in this process) grows with the module count by at most
PER_MODULE bytes a module. A MoE checkpoint has tens of thousands of modules; keeping a
module's arrays, findings or evidence text, or a future per module, shows here as kilobytes a
module. Allocations are counted, not timed, so the measure does not depend on the machine."""
import gc
import json
import shutil
import tracemalloc

import numpy as np
import pytest

from gptqfmt.bits.conventions import sym_field
from gptqfmt.bits.packing import pack
from gptqfmt.conversion import convert
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.safetensors_io import save_file

SMALL, LARGE = 96, 384          # modules
SHARDS = 4
K, N = 256, 1024
# Bytes a module, with room: what the checkpoint's model (its header entries, the module, its
# verdict) and the command's own record of it (a JSON row, a plan, a gate check) take, 3.6 to
# 5.5 KB today; convert holds two models at once (its gate opens the output). A module's
# scales kept would add 4 KB here, its zero points unpacked 2 KB, its qweight 128 KB.
PER_MODULE = {"inspect": 6000, "verify": 6500, "convert": 8000, "convert --in-place": 8000}


def build(d, modules):
    """A symmetric 4-bit gptq checkpoint of `modules` small experts in SHARDS shards."""
    d.mkdir()
    rng = np.random.default_rng(0)
    qzeros = pack(np.full((K // 128, N), sym_field(4, "gptq")), 4, 32, 1)
    weight_map = {}
    per = modules // SHARDS
    for s in range(SHARDS):
        tensors = {}
        for e in range(s * per, (s + 1) * per):
            p = f"model.layers.{e // 16}.mlp.experts.{e % 16}.up_proj"
            tensors[f"{p}.qweight"] = rng.integers(-2**31, 2**31, (K // 8, N)).astype(np.int32)
            tensors[f"{p}.qzeros"] = qzeros
            tensors[f"{p}.scales"] = np.full((K // 128, N), 0.01, np.float16)
            tensors[f"{p}.g_idx"] = (np.arange(K) // 128).astype(np.int32)
        name = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        save_file(tensors, d / name)
        weight_map.update(dict.fromkeys(tensors, name))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "checkpoint_format": "gptq"}))


def peak(run) -> int:
    """The most memory `run()` had allocated at once (bytes), counted by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


COMMANDS = {
    "inspect": lambda src, dst: inspect_checkpoint(src).to_json(),
    "verify": lambda src, dst: validate(src).to_json(),
    "convert": lambda src, dst: convert(src, dst),
    "convert --in-place": lambda src, dst: convert(src, None, in_place=True),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_memory_grows_by_a_small_record_per_module(tmp_path, command):
    run = COMMANDS[command]
    for modules in (SMALL, LARGE):
        build(tmp_path / f"src-{modules}", modules)
    shutil.copytree(tmp_path / f"src-{SMALL}", tmp_path / "warm")
    run(tmp_path / "warm", tmp_path / "warm-dst")  # imports, schemas and caches, once
    small, large = (peak(lambda m=m: run(tmp_path / f"src-{m}", tmp_path / f"dst-{m}"))
                    for m in (SMALL, LARGE))
    per_module = (large - small) / (LARGE - SMALL)
    assert per_module < PER_MODULE[command], (
        f"{command}: {per_module:.0f} bytes a module ({small} bytes at {SMALL} modules, "
        f"{large} at {LARGE})")
