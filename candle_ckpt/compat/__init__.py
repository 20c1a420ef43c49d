"""candle_lib's checkpoint API by its own names (``CandleCkptKeras``, ``CandleCkpt``,
``MultiGPUCheckpoint``), over the Keras 3 callback."""
