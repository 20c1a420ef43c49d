"""A Keras 3 model on several JAX processes: each process saves its share and reads its share back
(``save``, ``load``, ``replicas``), and ``restart()`` over a group (``group_restart``); and JAX's persistent
compilation cache, which keras/ and runner/ set for one process or many (``compile_cache``).

It sits below keras/ and runner/, which both call it, and above engine/, storage/ and distributed/ (the JAX
group). It reaches Keras through its public API only: what needs Keras's internals is done by the caller and
handed in.
"""
