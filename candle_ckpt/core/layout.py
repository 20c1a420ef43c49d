"""Pure path arithmetic for a checkpoint directory. No I/O.

::

    <ckpt_directory>/
        ckpt.log                  operations log
        ckpts/
            lock                  held (flock) by the one writer
            work/                 the checkpoint being written
            restarts.jsonl        the restart history (core/history.py)
            compile-cache/        JAX's persistent compilation cache (ckpt_compile_cache; not a checkpoint)
            epochs/NNN/           committed checkpoints (NNN = completed epochs)
            steps/GGG/            the newest mid-epoch (step) checkpoint (GGG = its commit generation)
            best -> epochs/NNN    relative symlink (or a pointer file)
            last -> epochs/NNN
            trash-*/              directories being deleted (cleaned at start)

That is the ``nested`` layout (Benchmarks master's ``CandleCheckpointCallback``).
The ``flat`` layout (candle_lib develop's ``CandleCkptKeras``) has no ``ckpts/``
level: ``lock``, ``work/``, ``epochs/``, ``best`` and ``last`` sit in
``<ckpt_directory>`` itself, beside ``ckpt.log``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from candle_ckpt.config.params import CkptConfig

LINK_NAMES = ("best", "last")
SIDECAR = "ckpt-info.json"
WEIGHTS_FILE = "model.weights.h5"
MODEL_FILE = "model.keras"
EXTRA_FILE = "model.extra.npz"  # variables save_weights omits (RNG seed states)
# The two kinds of checkpoint directory, by the name of the folder that holds them (the persistent tier's too):
# every other module names them through these, link_target and step_name (tests/unit/test_architecture.py).
EPOCHS = "epochs"
STEPS = "steps"
_KINDS = {"epoch": EPOCHS, "step": STEPS}
_EPOCH_RE = re.compile(r"^[0-9]{3,9}$")
_LINK_TARGET_RE = re.compile(r"^epochs/([0-9]{3,9})/?$")
_STEP_NAME_RE = re.compile(r"^steps/([0-9]{3,9})$")
_SAFE_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def epoch_name(epoch: int) -> str:
    """Return the directory name of ``epoch``: at least three digits."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0; got {epoch!r}")
    return f"{epoch:03d}"


def parse_epoch(name: str) -> int | None:
    """Return the epoch of an ``epochs/`` entry name, or None if it is not one."""
    if _EPOCH_RE.match(name):
        return int(name)
    return None


def parse_link_target(target: str) -> int | None:
    """Return the epoch a ``best``/``last`` link points to, or None if unsafe.

    Only the exact relative form ``epochs/NNN`` is accepted: an absolute path,
    ``..`` or anything else is refused, so a link can never lead outside
    ``ckpts/``.
    """
    m = _LINK_TARGET_RE.match(target.strip())
    return int(m.group(1)) if m else None


def resolve_link_target(target: str, ckpts_dirs: tuple[str, ...]) -> tuple[int | None, str]:
    """Return ``(epoch, "")`` for a ``best``/``last`` target that leads to ``epochs/NNN``, else ``(None, why)``.

    Our links are relative (``epochs/NNN``). CANDLE wrote absolute ones (the
    resolved path of ``ckpts/epochs/NNN``), and users may link relatively. An
    absolute or relative target is followed only if, spelled out, it is
    ``<ckpts>/epochs/NNN`` for one of ``ckpts_dirs`` (the directory as given
    and its real path); anything else is refused with the reason.

    Args:
        target: The link's text.
        ckpts_dirs: Absolute, normalised spellings of the directory holding ``epochs/``.
    """
    epoch = parse_link_target(target)
    if epoch is not None:
        return epoch, ""
    text = target.strip()
    base = ckpts_dirs[0]
    full = os.path.normpath(text if os.path.isabs(text) else os.path.join(base, text))
    parent, name = os.path.split(full)
    number = parse_epoch(name)
    for ckpts in ckpts_dirs:
        if parent == os.path.join(ckpts, EPOCHS) and number is not None:
            return number, ""
    if any(full == c or full.startswith(c + os.sep) for c in ckpts_dirs):
        return None, f"it points to {target!r}, inside {base} but not to an epochs/NNN checkpoint"
    return None, (
        f"it points to {target!r}, which is outside {base}; a link is followed only to "
        f"{os.path.join(base, EPOCHS, 'NNN')}"
    )


def link_target(epoch: int) -> str:
    """Return the relative target stored in a ``best``/``last`` link."""
    return f"{EPOCHS}/{epoch_name(epoch)}"


def step_name(generation: int) -> str:
    """``steps/GGG``: the name, relative to ``ckpts/``, of the step checkpoint of commit generation ``generation``."""
    return f"{STEPS}/{epoch_name(generation)}"


def checkpoint_name(kind: str, number: int) -> str:
    """``epochs/NNN`` for ``("epoch", NNN)``, ``steps/GGG`` for ``("step", GGG)``: a checkpoint's name by its kind.

    Raises:
        ValueError: ``kind`` is neither ``"epoch"`` nor ``"step"``.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'epoch' or 'step'; got {kind!r}")
    return link_target(number) if kind == "epoch" else step_name(number)


def split_epoch_path(path: str) -> tuple[str, int] | None:
    """``(ckpt_directory, NNN)`` for a path ``<ckpt_directory>/ckpts/epochs/NNN`` (the nested layout), else None."""
    epochs_dir, name = os.path.split(os.path.abspath(path).rstrip(os.sep))
    ckpts, folder = os.path.split(epochs_dir)
    epoch = parse_epoch(name)
    if epoch is None or folder != EPOCHS or os.path.basename(ckpts) != "ckpts":
        return None
    return os.path.dirname(ckpts), epoch


def parse_step_name(name: str) -> int | None:
    """The generation of a ``steps/GGG`` name (:func:`step_name`'s), or None if ``name`` is not one."""
    m = _STEP_NAME_RE.match(name)
    return int(m.group(1)) if m else None


def is_safe_filename(name: str) -> bool:
    """True if ``name`` is a plain file name inside a checkpoint directory."""
    return bool(_SAFE_FILE_RE.match(name)) and name not in (".", "..")


@dataclass(frozen=True)
class Layout:
    """The paths of one checkpoint directory (``flat``: no ``ckpts/`` level)."""

    root: str
    flat: bool = False

    @classmethod
    def at(cls, directory: str | os.PathLike[str], *, flat: bool = False) -> Layout:
        return cls(os.path.abspath(os.fspath(directory)), flat)

    @classmethod
    def of(cls, cfg: CkptConfig) -> Layout:
        """The paths of a job's configuration: its ``ckpt_directory`` in its ``ckpt_layout``.

        Every path a job builds or prints comes from here, so both layouts name real places.
        """
        return cls.at(cfg.directory, flat=cfg.flat)

    @property
    def ckpts(self) -> str:
        """The directory holding ``epochs/``, ``best``, ``last``, ``work/`` and ``lock``."""
        return self.root if self.flat else os.path.join(self.root, "ckpts")

    @property
    def other(self) -> Layout:
        """The same root in the other layout (to detect a directory written the other way)."""
        return Layout(self.root, not self.flat)

    @property
    def name(self) -> str:
        return "flat" if self.flat else "nested"

    @property
    def work(self) -> str:
        return os.path.join(self.ckpts, "work")

    @property
    def history(self) -> str:
        """The restart history (:mod:`candle_ckpt.core.history`): ``<ckpts>/restarts.jsonl``."""
        return os.path.join(self.ckpts, "restarts.jsonl")

    @property
    def compile_cache(self) -> str:
        """JAX's persistent compilation cache (``ckpt_compile_cache=auto``): ``<ckpts>/compile-cache``.

        Not a checkpoint: nothing lists, verifies, prunes or drains it.
        """
        return os.path.join(self.ckpts, "compile-cache")

    @property
    def epochs(self) -> str:
        return os.path.join(self.ckpts, EPOCHS)

    @property
    def steps(self) -> str:
        """Where step (mid-epoch) checkpoints live: ``steps/GGG``, GGG their commit generation."""
        return os.path.join(self.ckpts, STEPS)

    def step_dir(self, generation: int) -> str:
        return os.path.join(self.steps, epoch_name(generation))

    @property
    def log(self) -> str:
        return os.path.join(self.root, "ckpt.log")

    @property
    def lock(self) -> str:
        return os.path.join(self.ckpts, "lock")

    def link(self, name: str) -> str:
        if name not in LINK_NAMES:
            raise ValueError(f"link name must be one of {LINK_NAMES}; got {name!r}")
        return os.path.join(self.ckpts, name)

    def epoch_dir(self, epoch: int) -> str:
        return os.path.join(self.epochs, epoch_name(epoch))

    def trash_dir(self, tag: str) -> str:
        return os.path.join(self.ckpts, f"trash-{tag}")

    def is_debris(self, name: str) -> bool:
        """True for entries of ``ckpts/`` that a crashed writer leaves behind."""
        return name == "work" or name.startswith("trash-") or name.startswith(".tmp-")
