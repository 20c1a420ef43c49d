"""Fuzzed parameters through the Keras adapters: ``CandleCheckpointCallback`` and ``restart()``.

Allowed: success; ValueError/TypeError naming a key; OSError naming
``ckpt_directory`` (the callback creates the directory at construction);
NoValidCheckpoint from ``restart()`` only when ``ckpt_restart_mode=required``
or ``ckpt_restart_epoch`` asks for a checkpoint that does not exist.
"""

from __future__ import annotations

import os

from locations import TESTS

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import sys
import tempfile

import keras
from hypothesis import HealthCheck, example, given, settings

from candle_ckpt.core.errors import NoValidCheckpoint
from candle_ckpt.keras.callback import CandleCheckpointCallback
from candle_ckpt.keras.restart import restart

sys.path.insert(0, str(TESTS / "unit" / "config"))
from test_fuzz_params import PARAMS, names_a_key  # noqa: E402

MODEL = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
MODEL.compile(optimizer="adam", loss="mse")


def test_callback_and_restart_fuzz_raise_only_documented_errors() -> None:
    """CandleCheckpointCallback(params) and restart(params, model) on fuzzed parameters raise only the documented,
    key-naming errors."""
    outcomes: dict[str, int] = {}

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(params=PARAMS)
    @example(params={"ckpt_directory": "run", "epochs": 3})  # the asserted outcomes, every run, not by luck
    @example(params={"ckpt_directory": "run", "epochs": 3, "ckpt_keep_limit": 0})
    def run(params: dict) -> None:
        old = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "x"), "w"):
                pass
            os.chdir(tmp)
            try:
                for name, build in (
                    ("callback", lambda: CandleCheckpointCallback(params, logger=None, verbose=False)),
                    ("restart", lambda: restart(params, MODEL, logger=None, verbose=False)),
                ):
                    try:
                        made = build()
                    except (ValueError, TypeError) as err:
                        assert names_a_key(err, params), f"{name}: {type(err).__name__} names no key: {err}"
                        outcome = "refused"
                    except NoValidCheckpoint as err:
                        assert name == "restart" and ("ckpt_restart_epoch=" in str(err) or "required" in str(err))
                        outcome = "no checkpoint"
                    except OSError as err:
                        assert "ckpt_directory" in str(err), f"{name}: OSError without the key: {err}"
                        outcome = "OSError"
                    else:
                        outcome = "ok"
                        if name == "callback":
                            made.engine.store.close()
                    outcomes[f"{name} {outcome}"] = outcomes.get(f"{name} {outcome}", 0) + 1
            finally:
                os.chdir(old)

    run()
    print(f"\nadapter fuzz outcomes: {outcomes}")
    assert outcomes.get("callback ok") and outcomes.get("restart refused"), outcomes
