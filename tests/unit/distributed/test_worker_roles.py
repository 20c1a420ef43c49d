"""Who is the chief of a tf.distribute cluster, decided without importing tensorflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from locations import REPO

from candle_ckpt.distributed.worker_state import WorkerInfo, worker_info


def _tf_config(monkeypatch: pytest.MonkeyPatch, cluster: dict, task_type: str, index: int) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))


def test_no_tf_config_is_a_one_worker_chief(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process outside any cluster is the chief of a one-worker cluster."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert worker_info() == WorkerInfo(None, 0, 1, True)


def test_worker_zero_is_chief_when_there_is_no_chief_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a "chief" task, worker 0 is the chief and worker 1 is not (as Keras decides)."""
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    _tf_config(monkeypatch, cluster, "worker", 0)
    assert worker_info() == WorkerInfo("worker", 0, 2, True)
    _tf_config(monkeypatch, cluster, "worker", 1)
    assert worker_info() == WorkerInfo("worker", 1, 2, False)


def test_chief_task_is_chief_and_worker_zero_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a "chief" task, it is the chief and every worker (index 0 included) is not."""
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]}
    _tf_config(monkeypatch, cluster, "chief", 0)
    assert worker_info() == WorkerInfo("chief", 0, 3, True)
    _tf_config(monkeypatch, cluster, "worker", 0)
    assert worker_info() == WorkerInfo("worker", 0, 3, False)


def test_a_cluster_resolver_is_preferred_to_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strategy's cluster resolver (e.g. SlurmClusterResolver) decides when there is one."""
    monkeypatch.delenv("TF_CONFIG", raising=False)

    class Spec:
        def as_dict(self) -> dict:
            return {"worker": ["n1:8888", "n2:8888", "n3:8888"]}

    class Resolver:
        task_type, task_id = "worker", 2

        def cluster_spec(self) -> Spec:
            return Spec()

    class Strategy:
        cluster_resolver = Resolver()

    assert worker_info(Strategy()) == WorkerInfo("worker", 2, 3, False)


def test_bad_tf_config_and_parameter_servers_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Malformed TF_CONFIG and ParameterServerStrategy clusters raise a ValueError saying what is wrong."""
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        worker_info()
    _tf_config(monkeypatch, {"ps": ["localhost:1"], "worker": ["localhost:2"]}, "worker", 0)
    with pytest.raises(ValueError, match="ParameterServerStrategy is not supported"):
        worker_info()


def test_importing_the_module_does_not_import_tensorflow_or_keras() -> None:
    """candle_ckpt.distributed.worker_state imports tensorflow lazily (only for the restore collectives)."""
    code = (
        "import sys, candle_ckpt.distributed.worker_state\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
