"""Short fuzzing profile for CI (scripts/fuzz.sh runs the long one)."""
import random
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import CKPT, FIXTURES, mutate, mutated_copy, run_one

BASES = ["b4-asym-act-gptq-sharded", "b3-asym-noact-gptq_v2-single", "int8-b4-asym-gptq_v2"]
FORMAT_BASES = ["ct-b4-asym-g32", "ct-b3-asym-g32", "ct-b4-sym-g32-sharded", "awq-b4-g32"]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), base=st.sampled_from(BASES))
def test_mutated_checkpoints_never_crash(tmp_path_factory, seed, base):
    root = tmp_path_factory.mktemp("fz")
    d = root / "c"
    mutated_copy(CKPT / base, d, random.Random(seed))
    assert run_one(d, root / "out") in ("clean", "refused")
    shutil.rmtree(root)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), base=st.sampled_from(FORMAT_BASES))
def test_mutated_format_checkpoints_never_crash(tmp_path_factory, seed, base):
    """compressed-tensors and AWQ readers, checks and convert under the same mutations."""
    root = tmp_path_factory.mktemp("fzf")
    d = root / "c"
    mutated_copy(FIXTURES / "formats" / base, d, random.Random(seed))
    assert run_one(d, root / "out") in ("clean", "refused")
    shutil.rmtree(root)


def test_unreadable_config_of_an_awq_checkpoint_is_refused(tmp_path):
    """Found by fuzzing the formats: a config.json that is not JSON left an AWQ checkpoint
    (recognised by its tensors) to be converted, and writing its configs crashed."""
    d = tmp_path / "c"
    mutated_copy(FIXTURES / "formats" / "awq-b4-g32", d, random.Random(22))
    assert run_one(d, tmp_path / "out") == "refused"


def test_non_finite_scales_where_a_runtime_misreads_zeros(tmp_path):
    """Found by the fuzzer: an inf scale in a group whose zero points a runtime reads right
    (scale x 0) warned inside verify's runtime section, which the CLI turned into a crash."""
    d = tmp_path / "c"
    mutated_copy(CKPT / "b4-asym-act-gptq-sharded", d, random.Random(227541))
    assert run_one(d, tmp_path / "out") in ("clean", "refused")


def test_signalling_nan_scales_where_a_runtime_misreads_zeros(tmp_path):
    """Found by the fuzzer too: a mutated scale that is a signalling NaN warned in the same
    product even where the zero point moves."""
    d = tmp_path / "c"
    mutated_copy(CKPT / "int8-b4-asym-gptq_v2", d, random.Random(72639))
    assert run_one(d, tmp_path / "out") in ("clean", "refused")


def test_mutate_changes_bytes():
    blob = (CKPT / BASES[1] / "model.safetensors").read_bytes()
    assert all(mutate(blob, random.Random(i)) != blob for i in range(20))
