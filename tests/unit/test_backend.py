"""What the numerical backends share (gptqfmt/numerics/backend.py): the one sampler of output
columns for the gate and for verify --against and --reference."""
import numpy as np


def test_one_column_sampler_for_the_gate_and_for_verify():

    from gptqfmt.numerics.backend import sample_columns
    for seed in range(20):
        a = sample_columns(1000, 64, np.random.default_rng(seed), align=32)
        assert len(a) == 64 and a[0] % 32 == 0 and (np.diff(a) == 1).all()
        b = sample_columns(1000, 16, np.random.default_rng(seed), must=np.array([3, 999, 500]))
        assert {3, 999, 500} <= set(b.tolist()) and (np.diff(b) > 0).all()
    assert sample_columns(10, 64, np.random.default_rng(0)).tolist() == list(range(10))
    many = np.arange(500, 600, 5)  # 20 columns to include; at most width/2 = 8 of them are
    got = sample_columns(1000, 16, np.random.default_rng(1), must=many)
    assert len(np.intersect1d(got, many)) >= 8 and set(many[:8].tolist()) <= set(got.tolist())
