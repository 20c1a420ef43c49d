"""``python -m candle_ckpt``: the ``candle-ckpt`` command line."""

from __future__ import annotations

import sys

from candle_ckpt.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
