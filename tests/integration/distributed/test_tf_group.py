"""TfStore / tf_group over TensorFlow's coordination service, in two real MultiWorkerMirroredStrategy workers.

The calls TfStore relies on were found by experiment (TF 2.21): ``set_config_key_value`` on an existing key
raises AlreadyExistsError (the first writer wins), ``get_config_key_value`` with a timeout raises
DeadlineExceededError, ``delete_config_key_value`` deletes a key's subtree. The StoreGroup protocol then runs
over them as over JAX's service.
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.slow, pytest.mark.tf_only]

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    rank, p0, p1 = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    workers = [f"localhost:{p0}", f"localhost:{p1}"]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    import tensorflow as tf
    from candle_ckpt.core.errors import GroupTimeout
    from candle_ckpt.distributed.tf_group import tf_group
    g = tf_group(tf.distribute.MultiWorkerMirroredStrategy(), 2)
    print("R", g.rank, g.size)
    g.barrier("t/start", 60)
    won = g.store.set("x/notice", f"r{rank}")
    g.barrier("t/set", 60)
    print("W", won, g.store.get("x/notice", 5))
    print("X", g.exchange("t/x", f"r{rank}", 60), g.all_agree("t/a", rank == 0, 60))
    print("I", g.store.increment(f"x/n/{rank}"), g.store.increment(f"x/n/{rank}"))
    if rank == 0:
        for k in ("x/a/0", "x/ab"):
            g.store.set(k, "v")
        g.store.delete("x/a")
        print("S", g.store.get("x/a/0", 0.1), g.store.get("x/ab", 1))
    if rank == 1:
        try:
            g.barrier("t/alone", 2)
        except GroupTimeout as err:
            print("T", err)
    g.barrier("t/end", 60)
    """
)


def test_tf_group_meets_over_tensorflows_coordination_service(tmp_path):
    """Two workers: ranks from the cluster, first writer wins, exchange/all_agree, per-rank counters, subtree
    delete, and a lone rank's GroupTimeout naming the primary."""
    from cluster import free_ports, run_pair
    from pace import wait_s

    script = tmp_path / "g.py"
    script.write_text(_SCRIPT)
    ports = [str(p) for p in free_ports(2)]
    outs = run_pair(script, [[str(i), *ports] for i in (0, 1)], {"CUDA_VISIBLE_DEVICES": ""}, wait_s(90))
    assert "R 0 2" in outs[0] and "R 1 2" in outs[1]
    won = [out.split("W ")[1].split()[0] for out in outs]
    assert sorted(won) == ["False", "True"], outs
    first = f"r{won.index('True')}"
    for w, out in zip(won, outs, strict=True):
        assert f"W {w} {first}" in out and "X ['r0', 'r1'] False" in out and "I 1 2" in out
    assert "S None v" in outs[0]
    assert "T the processes did not all reach 't/alone' within 2 s (rank(s) 0 never came)" in outs[1]
