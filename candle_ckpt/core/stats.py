"""The one statistics record of a transfer: bytes, named durations and MB/s.

Every ``stats()`` the library reports (a save, a restore, a partial load, an
upload) is built here, so the rounding and the MB/s arithmetic are the same
everywhere: durations to the microsecond, MB/s (10^6 bytes) to three places,
over the sum of the durations (never divided by zero).
"""

from __future__ import annotations

from typing import Any

_TINY = 1e-9  # the shortest duration divided by: an instant transfer is fast, not infinite


def seconds(value: float) -> float:
    """Round a duration the way every record reports it (to the microsecond)."""
    return round(value, 6)


def mb_per_s(nbytes: int, elapsed: float) -> float:
    """Throughput in MB/s (10^6 bytes per second) of ``nbytes`` moved in ``elapsed`` seconds, rounded."""
    return round(nbytes / max(elapsed, _TINY) / 1e6, 3)


def transfer_record(nbytes: int, what: dict[str, Any] | None = None, **durations: float) -> dict[str, Any]:
    """Return ``{**what, "bytes", <each duration>, "mb_per_s"}``, in that order.

    Args:
        nbytes: The bytes moved.
        what: What was moved (``epoch``, ``file``, ``url``...), first in the record.
        durations: The named durations in seconds (``verify_s=...``, ``load_s=...``);
            MB/s is over their sum.
    """
    record = dict(what or {})
    record["bytes"] = nbytes
    record.update({name: seconds(value) for name, value in durations.items()})
    record["mb_per_s"] = mb_per_s(nbytes, sum(durations.values()))
    return record
