"""engine.epoch_shape: where a fit resumed from a step checkpoint starts when its epoch has another step count."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from candle_ckpt.engine.epoch_shape import EpochShape, steps_to_skip

SAME = "the same epoch resumes as it was: the steps done are skipped and nothing is said"


def test_an_unchanged_or_unknown_epoch_skips_the_steps_done_and_says_nothing():
    assert steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(12, 32)) == (8, None), SAME
    assert steps_to_skip(8, 2, EpochShape(), EpochShape(6, 64)) == (8, None)  # a checkpoint from before the shape
    assert steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(None, 32)) == (8, None)  # an endless input
    # The same steps in batches of another size: a DataParallel job's shards in another number of processes.
    assert steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(12, 8)) == (8, None)


def test_larger_batches_skip_the_samples_done():
    skip, line = steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(6, 64))
    assert skip == 4
    assert line == (
        "restart: the checkpoint was taken at epoch 3, step 8 of 12 steps of batch size 32, but this fit's epoch has "
        "6 steps of batch size 64: 4 steps skipped, the 256 samples done before. The run is not bit-identical to "
        "one that kept its batch size and data; resume from an epoch checkpoint (ckpt_restart_epoch) to train the "
        "epoch whole again"
    )


def test_batches_that_do_not_divide_the_samples_done_round_down_and_give_both_counts():
    skip, line = steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(8, 48))
    assert skip == 5 and "5 steps skipped, 240 samples, against 256 done before." in line


def test_an_input_without_a_batch_size_skips_the_same_share_of_its_epoch():
    skip, line = steps_to_skip(3, 0, EpochShape(10), EpochShape(20))  # a PyDataset whose batches were halved
    assert skip == 6 and "6 steps skipped, the same share of the epoch (3 of 10)." in line
    assert "of 10 steps, but this fit's epoch has 20 steps:" in line


def test_the_skip_is_a_whole_number_of_executions_and_leaves_a_step_to_run():
    assert steps_to_skip(8, 2, EpochShape(12, 32), EpochShape(6, 64), per=3)[0] == 3  # steps_per_execution=3
    skip, line = steps_to_skip(9, 0, EpochShape(10, 10), EpochShape(4, 10))  # the data shrank: 90 samples done
    assert skip == 3 and "3 steps skipped, 30 samples, against 90 done before." in line


def test_a_positioned_input_counts_its_steps_on_and_says_so():
    skip, line = steps_to_skip(2, 1, EpochShape(3, 16), EpochShape(6, 8), positioned=True)
    assert skip == 2
    assert line is not None and "its input was put back where it was; its steps count on from 2." in line


def test_a_recorded_shape_is_read_back_and_anything_else_is_unknown():
    assert EpochShape.of({"step": 2, "of": 12, "batch": 32}) == EpochShape(12, 32)
    assert EpochShape.of({"step": 2}) == EpochShape()  # written before the shape was recorded
    assert EpochShape.of({"of": True, "batch": -1}) == EpochShape() == EpochShape.of(None)
    assert EpochShape.make(12, None) == EpochShape(12)
    assert EpochShape.make(np.int64(12), np.int32(32)) == EpochShape(12, 32)  # steps_per_epoch computed with NumPy
    assert type(EpochShape.make(np.int64(12), None).steps) is int  # it goes into train.state.npz's JSON


@given(
    done=st.integers(1, 500), then=st.integers(2, 501), now=st.integers(1, 1000), per=st.integers(1, 8),
    b1=st.one_of(st.none(), st.integers(1, 256)), b2=st.one_of(st.none(), st.integers(1, 256)),
)  # fmt: skip
def test_the_skip_is_always_inside_the_new_epoch(done, then, now, per, b1, b2):
    """Whatever the shapes: a multiple of ``per``, never the whole new epoch, and a line exactly when the count
    changed."""
    done = min(done, then - 1)
    skip, line = steps_to_skip(done, 0, EpochShape(then, b1), EpochShape(now, b2), per=per)
    if then == now:
        assert (skip, line) == (done, None)
    else:
        assert 0 <= skip <= max(now - 1, 0) and skip % per == 0 and line is not None
