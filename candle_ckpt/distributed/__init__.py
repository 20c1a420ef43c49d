"""Chief / non-chief roles under ``tf.distribute`` (``WorkerTrainingState``). It takes an
adapter and imports none.
"""
