"""Every test of the suite is bounded (setup.cfg's ``timeout``, pytest-timeout): a hang fails one test, it does not
use up CI's time. Checked here in a real pytest run, with the bound shortened, on a test that sleeps past it."""

from __future__ import annotations

import configparser
import subprocess
import sys
import time

from locations import REPO


def test_setup_cfg_bounds_every_test_with_a_method_that_ends_a_stuck_thread() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert "pytest-timeout" in cfg["options.extras_require"]["test"], "the test extra must bring pytest-timeout"
    assert 0 < int(cfg["tool:pytest"]["timeout"]) <= 1800, "a bound under CI's 90 minutes, per test"
    assert cfg["tool:pytest"]["timeout_method"] == "thread", "the signal method cannot end a thread stuck in C"


def test_a_test_that_hangs_is_ended_at_the_bound_and_named(tmp_path) -> None:
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(120)\n")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "setup.cfg"),
         "--rootdir", str(tmp_path), "-o", "timeout=2", str(tmp_path / "test_hang.py")],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    took = time.monotonic() - began
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert "Timeout" in out and "test_hangs" in out, out[-2000:]
    assert took < 100, f"ended after {took:.0f} s, not at the 2-s bound"
