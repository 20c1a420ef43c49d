"""``candle-ckpt``: the command line, plotting and the demo job."""
