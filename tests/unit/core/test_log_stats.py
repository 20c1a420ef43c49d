"""``candle_ckpt.core.log``: the one bytes/seconds/MB/s record behind every ``stats()``."""

from __future__ import annotations

from candle_ckpt.core.log import mb_per_s, seconds, transfer_record


def test_record_keeps_what_then_bytes_then_durations_then_speed() -> None:
    """The record lists what was moved, the bytes, each duration and the MB/s over their sum, in that order."""
    record = transfer_record(3_000_000, {"epoch": 4, "file": "w.h5"}, verify_s=0.5, load_s=1.0)
    assert record == {"epoch": 4, "file": "w.h5", "bytes": 3_000_000, "verify_s": 0.5, "load_s": 1.0, "mb_per_s": 2.0}
    assert list(record) == ["epoch", "file", "bytes", "verify_s", "load_s", "mb_per_s"]


def test_durations_round_to_the_microsecond_and_speed_to_three_places() -> None:
    """Durations are rounded to 6 places and MB/s to 3, as the records always were."""
    assert seconds(0.12345678) == 0.123457
    assert mb_per_s(1_000_000, 3.0) == 0.333
    assert transfer_record(10, upload_s=0.0000001)["upload_s"] == 0.0


def test_an_instant_transfer_has_a_finite_speed() -> None:
    """A zero duration divides by a nanosecond, never by zero."""
    assert mb_per_s(1_000, 0.0) == 1_000_000.0
    assert transfer_record(0, {"epoch": 1}, upload_s=0.0)["mb_per_s"] == 0.0
