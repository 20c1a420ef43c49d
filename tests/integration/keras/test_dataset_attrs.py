"""What a PyDataset without get_state() has saved: its index, what on_epoch_end changes, never the data it reads."""

from __future__ import annotations

import keras
import numpy as np

from candle_ckpt.engine import dataset_attrs

BASE = set(vars(keras.utils.PyDataset()))  # what PyDataset.__init__ sets: not the dataset's state


class Shuffling(keras.utils.PyDataset):
    """Data it only reads (x), an index and weights it shuffles in place, a counter, and an object it rebinds."""

    def __init__(self) -> None:
        super().__init__()
        self.x = np.arange(4000.0).reshape(1000, 4)
        self.index = np.arange(1000)
        self.weights = np.linspace(0.0, 1.0, 1000)
        self.epochs_seen = 0
        self.names = ["a", "b", "c"]
        self.table = object()

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        return self.x[self.index[i * 100 : (i + 1) * 100]]

    def on_epoch_end(self) -> None:
        np.random.shuffle(self.index)
        np.random.shuffle(self.weights)
        self.epochs_seen += 1
        self.table = object()


def test_saves_the_index_what_on_epoch_end_changes_and_not_the_data(tmp_path) -> None:
    """After one on_epoch_end: the index, the weights shuffled in place and the JSON values are saved, x is not;
    restored into a fresh dataset they are equal and x is untouched; the rebound object is named in a warning."""
    np.random.seed(0)
    ds, changed, said = Shuffling(), set(), []
    dataset_attrs.watch(ds, ds.on_epoch_end, changed, said.append, BASE)
    doc, arrays = dataset_attrs.capture(ds, changed, BASE)
    assert sorted(arrays) == ["pipe.attr.index", "pipe.attr.weights"]
    assert sorted(doc["json"]) == ["epochs_seen", "names"]
    assert doc["changed"] == ["epochs_seen", "index", "table", "weights"]
    assert said == [
        "Shuffling.on_epoch_end() changes table, which candle_ckpt cannot save (only NumPy arrays up to 64 MiB and "
        "JSON values are): a resumed run will not be bit-identical; add get_state() -> dict and set_state(dict) to "
        "the dataset"
    ]
    fresh = Shuffling()
    view = fresh.index[:10]
    assert dataset_attrs.restore(fresh, doc, arrays) == ["epochs_seen", "index", "names", "weights"]
    for name in ("index", "weights", "x"):
        assert getattr(fresh, name).tobytes() == getattr(ds, name).tobytes(), name
    assert fresh.epochs_seen == 1 and view.base is fresh.index  # overwritten in place: views stay views
