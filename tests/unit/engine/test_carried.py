"""engine/carried.py: the batches a PyDataset's workers fetched ahead, encoded for train.state.npz and back."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from candle_ckpt.engine import carried
from candle_ckpt.engine.state_file import pack, unpack

leaves = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
)
batches = st.recursive(
    leaves,
    lambda inner: (
        st.tuples(inner, inner)
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(batches, max_size=4))
def test_batches_come_back_as_they_went_through_the_state_file(queued) -> None:
    """Whatever nesting of tuples, lists and string-keyed dicts of arrays, the batches decoded from the packed
    state file equal those encoded: structure, dtypes, shapes and bytes."""
    structure, arrays = carried.encode(queued)
    doc, back = unpack(pack({"queued": json.loads(json.dumps(structure))}, arrays))
    assert all(_same(a, b) for a, b in zip(queued, carried.decode(doc["queued"], back), strict=True))


def test_encode_copies_so_a_batch_changed_later_does_not_change_the_checkpoint() -> None:
    """The arrays are copies: a worker's array reused after the save leaves the saved batch as it was."""
    x = np.arange(6, dtype=np.float32)
    structure, arrays = carried.encode([(x, None)])
    x[:] = -1
    (batch,) = carried.decode(structure, arrays)
    assert batch[0].tolist() == [0, 1, 2, 3, 4, 5] and batch[1] is None


@pytest.mark.parametrize(
    ("queued", "why"),
    [([(np.array([object()]),)], "object values"), ([{1: np.zeros(2)}], "keys that are not strings")],
)
def test_what_cannot_be_kept_is_said_once_with_the_remedy(queued, why) -> None:
    """A batch of Python objects or with non-string dict keys is not kept: one warning, naming why and what to do."""
    said: list[str] = []
    assert carried.capture(queued, said.append) == (None, {})
    assert len(said) == 1 and why in said[0] and "workers=1" in said[0], said


def test_batches_over_the_cap_are_not_kept(monkeypatch) -> None:
    """Queued batches larger than MAX_BYTES in all are not kept, and the warning names the cap."""
    monkeypatch.setattr(carried, "MAX_BYTES", 1 << 20)
    said: list[str] = []
    big = [(np.zeros(300_000, np.float32),), (np.zeros(10, np.float32),)]
    assert carried.capture(big, said.append) == (None, {})
    assert carried.capture(big[1:], said.append)[0] is not None
    assert len(said) == 1 and "pass 1 MiB" in said[0], said
