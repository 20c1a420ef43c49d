"""Which ``candle_ckpt`` modules a flow enters: docs/architecture.rst's walks, measured.

A profile hook (``sys.setprofile`` in this thread, ``threading.setprofile`` for every thread started after
:meth:`Walk.install`) records the module of every Python function called while the window is open
(:meth:`Walk.start` .. :meth:`Walk.stop`), in any of those threads: the writer thread's share of a save counts.
With ``out``, each module is also appended to that file when first seen, so that a process that ends with
``os._exit`` (a SIGTERM's exit) leaves its walk behind.

The count is of modules, not calls: "an epoch-end save enters 20 modules" means functions of 20 modules of the
package ran between the window's ends. A module's own body (its import) is not a function of it: call
:func:`import_all` before the window opens, so that a lazy import's decorators and class bodies are not counted
either. Install it before the flow starts its threads.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import threading

PACKAGE = "candle_ckpt"


class Walk:
    """The modules of :data:`PACKAGE` entered while the window is open (see the module docstring)."""

    def __init__(self, out: str | None = None) -> None:
        self.out, self.open, self.modules = out, False, set()
        self._lock = threading.Lock()

    def install(self) -> Walk:
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)
        return self

    def start(self) -> None:
        self.open = True

    def stop(self) -> list[str]:
        self.open = False
        return sorted(self.modules)

    def _hook(self, frame, event, arg) -> None:
        if event != "call" or not self.open or frame.f_code.co_name == "<module>":
            return
        name = frame.f_globals.get("__name__", "")
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and name not in self.modules:
            with self._lock:
                if name in self.modules:
                    return
                self.modules.add(name)
                if self.out:
                    fd = os.open(self.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    try:
                        os.write(fd, (name + "\n").encode())
                    finally:
                        os.close(fd)


def import_all() -> None:
    """Import every module of the package that this environment can (one needing torch, say, is passed over)."""
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional framework missing, or a __main__ that runs: not part of any walk here
            continue


def read(path: str) -> list[str]:
    """The modules a process with ``Walk(out=path)`` entered (none if it wrote nothing)."""
    try:
        with open(path) as f:
            return sorted({line.strip() for line in f if line.strip()})
    except FileNotFoundError:
        return []
