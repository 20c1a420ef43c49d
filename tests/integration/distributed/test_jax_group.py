"""JaxGroup over the JAX coordination service, and its one private JAX access (a tripwire).

The group's meeting points are tested in two real processes (``jax.distributed`` on localhost);
the tripwire fails loudly when JAX moves the coordination client that
``candle_ckpt.distributed.jax_group.coordination_client`` reaches for.
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("jax")


def test_private_jax_gateway_still_finds_the_coordination_client():
    """Tripwire: jax._src.distributed.global_state.client exists and has the KV calls JaxGroup uses."""
    from jax._src import distributed

    assert hasattr(distributed.global_state, "client"), "JAX moved its coordination client: fix jax_group"
    from jax._src.lib import _jax  # the client class

    client_type = getattr(_jax, "DistributedRuntimeClient", None)
    assert client_type is not None, "JAX renamed DistributedRuntimeClient: fix jax_group"
    for name in ("key_value_set", "blocking_key_value_get"):
        assert hasattr(client_type, name), f"JAX's coordination client lost {name}: fix jax_group"


def test_outside_jax_distributed_there_is_no_group():
    """One process (no jax.distributed): no group, so today's one-process format and paths are kept."""
    from candle_ckpt.distributed.jax_group import jax_group, process_place

    assert jax_group().size == 1  # SOLO
    assert process_place() == (0, 1)


_SCRIPT = textwrap.dedent(
    """
    import sys, jax
    rank, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(f"localhost:{port}", 2, rank)
    from candle_ckpt.core.errors import GroupTimeout
    from candle_ckpt.distributed.jax_group import jax_group
    g = jax_group()
    assert (g.rank, g.size) == (rank, 2), g
    g.barrier("t/ready", 60)
    print("B", g.broadcast("t/b", "hello" if rank == 0 else None, 60))
    print("A", g.all_agree("t/a", rank == 0, 60), g.all_agree("t/c", True, 60))
    print("X", g.exchange("t/x", f"r{rank}", 60))
    if rank == 1:
        try:
            g.barrier("t/alone", 2)
        except GroupTimeout as err:
            print("T", err)
    g.barrier("t/end", 60)
    # The client calls JaxStore relies on (jaxlib's coordination client, found by experiment):
    c, s = g.store.client, g.store
    g.barrier("api/start", 60)
    won = s.set("x/notice", f"r{rank}")  # first writer wins: the other gets ALREADY_EXISTS, i.e. False
    g.barrier("api/set", 60)
    print("W", won, s.get("x/notice", 5))
    if rank == 0:
        for k in ("x/a/0", "x/a/1", "x/ab"):
            s.set(k, "v")
        print("D", c.key_value_dir_get("x/a"))  # children only, never the sibling x/ab
        s.delete("x/a")  # the key's subtree goes, the sibling stays
        print("K", s.keys("x/"))
        print("G", s.get("x/none", 0.2))  # DEADLINE_EXCEEDED after the timeout: None
        print("I", s.increment("x/n"), s.increment("x/n"))
        s.delete("x/")
        print("E", s.keys(""))
    g.barrier("api/end", 60)
    """
)


@pytest.mark.slow
def test_meeting_points_in_two_real_processes(tmp_path):
    """barrier, broadcast, all_agree and exchange across 2 processes; a lone rank times out naming the missing one."""
    from cluster import free_ports, run_pair

    script = tmp_path / "g.py"
    script.write_text(_SCRIPT)
    port = str(free_ports(1)[0])
    outs = run_pair(script, [[str(i), port] for i in (0, 1)], {"JAX_PLATFORMS": "cpu"}, 120)
    for out in outs:
        assert "B hello" in out and "A False True" in out and "X ['r0', 'r1']" in out
    assert "T the processes did not all reach 't/alone' within 2 s (rank(s) 0 never came)" in outs[1]
    won = [out.split("W ")[1].split()[0] for out in outs]
    assert sorted(won) == ["False", "True"], outs
    assert all(f"W {w} r{won.index('True')}" in out for w, out in zip(won, outs, strict=True)), outs
    assert "D [('x/a/0', 'v'), ('x/a/1', 'v')]" in outs[0] and "K ['x/ab', 'x/notice']" in outs[0]
    assert "G None" in outs[0] and "I 1 2" in outs[0] and "E []" in outs[0], outs[0]
