"""The installation: two Keras distributions installed over each other.

``keras`` and ``keras-nightly`` are two distributions of the one ``keras`` module. pip treats them
as unrelated, so installing a package that requires ``keras`` (this one does) into an environment
with ``keras-nightly`` writes the release's files over the nightly's: both stay "installed", and the
``keras`` module is a mix of whichever files were written last. A ``keras`` and a ``keras-nightly``
in *different* directories of ``sys.path`` (a virtual environment on top of the system's) are not
that: the first on the path is imported whole, as CI's nightly pass does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os

KERAS_DISTRIBUTIONS = ("keras", "keras-nightly")


def overlaid_keras() -> list[tuple[str, str]]:
    """``[(name, version), ...]`` of the Keras distributions installed into one directory, if there are
    two or more there (the first directory on ``sys.path`` that has them); else ``[]``."""
    by_place: dict[str, list[tuple[str, str]]] = {}
    for name in KERAS_DISTRIBUTIONS:
        for dist in importlib.metadata.distributions(name=name):
            place = os.path.realpath(str(dist.locate_file("")))
            found = (dist.metadata["Name"] or name, dist.version)
            if found not in by_place.setdefault(place, []):
                by_place[place].append(found)
    for found in by_place.values():
        if len({name.lower().replace("_", "-") for name, _ in found}) > 1:
            return found
    return []


def overlaid_keras_message() -> str | None:
    """The one-line warning about :func:`overlaid_keras`; None if there is nothing to say."""
    found = overlaid_keras()
    if not found:
        return None
    names = " and ".join(f"{name} {version}" for name, version in found)
    return (
        f"{names} are installed over each other (both provide the keras module, which is now a mix of their "
        "files); keep one: pip uninstall -y keras keras-nightly, then pip install keras-nightly (or keras) and "
        'install candle_ckpt with pip install --no-deps (docs/api.rst, "With keras-nightly")'
    )


@functools.cache
def warn_if_overlaid() -> None:
    """Say :func:`overlaid_keras_message` once per process, on the ``candle_ckpt`` console logger."""
    message = overlaid_keras_message()
    if message is not None:
        from candle_ckpt.core.log import get_logger  # noqa: PLC0415 (only when there is something to say)

        get_logger("DEFAULT").warning(message)
