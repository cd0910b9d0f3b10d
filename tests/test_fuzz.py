"""Short fuzzing profile for CI (scripts/fuzz.sh runs the long one)."""
import random
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import CKPT, mutate, mutated_copy, run_one

BASES = ["b4-asym-act-gptq-sharded", "b3-asym-noact-gptq_v2-single", "int8-b4-asym-gptq_v2"]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), base=st.sampled_from(BASES))
def test_mutated_checkpoints_never_crash(tmp_path_factory, seed, base):
    root = tmp_path_factory.mktemp("fz")
    d = root / "c"
    mutated_copy(CKPT / base, d, random.Random(seed))
    assert run_one(d, root / "out") in ("clean", "refused")
    shutil.rmtree(root)


def test_mutate_changes_bytes():
    blob = (CKPT / BASES[1] / "model.safetensors").read_bytes()
    assert all(mutate(blob, random.Random(i)) != blob for i in range(20))
