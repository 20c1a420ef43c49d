"""Where this process sits in a ``tf.distribute`` cluster (its task, the number of workers, the chief).

Read from the strategy's cluster resolver, or ``TF_CONFIG`` (no TensorFlow
import here).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from candle_ckpt.core.group import is_primary_rank


@dataclass(frozen=True)
class WorkerInfo:
    """Where this process sits in the cluster."""

    task_type: str | None
    task_id: int
    num_workers: int
    is_chief: bool

    @property
    def name(self) -> str:
        """How this worker is named in log lines and errors: ``worker worker:1``."""
        return f"worker {self.task_type}:{self.task_id}"


def _cluster_from_tf_config() -> tuple[dict[str, Any], str | None, int]:
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}, None, 0
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON: {err}") from None
    if not isinstance(conf, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object; got {type(conf).__name__}")
    task = conf.get("task") or {}
    return dict(conf.get("cluster") or {}), task.get("type"), int(task.get("index", 0) or 0)


def worker_info(strategy: Any = None) -> WorkerInfo:
    """Return this worker's role, from ``strategy.cluster_resolver`` or ``TF_CONFIG``.

    The chief is the task of type ``"chief"``, or worker 0 when the cluster
    has no chief (as ``multi_worker_util.is_chief`` decides). A process
    outside any cluster is the chief of a one-worker cluster.

    Raises:
        ValueError: ``TF_CONFIG`` is malformed, or the cluster has parameter
            servers (``ParameterServerStrategy`` is not supported).
    """
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if resolver is not None and getattr(resolver, "task_type", None) is not None:
        spec = resolver.cluster_spec().as_dict()
        task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    else:
        spec, task_type, task_id = _cluster_from_tf_config()
    if spec.get("ps"):
        raise ValueError(
            "the cluster has parameter servers ('ps' tasks): ParameterServerStrategy is not supported; "
            "use MultiWorkerMirroredStrategy"
        )
    num_workers = len(spec.get("chief") or []) + len(spec.get("worker") or [])
    if task_type is None or num_workers <= 1:
        return WorkerInfo(task_type, task_id, max(num_workers, 1), task_type in (None, "chief", "worker"))
    is_chief = task_type in ("chief", "worker") and is_primary_rank(_rank_in_cluster(spec, task_type, task_id))
    return WorkerInfo(task_type, task_id, num_workers, is_chief)


def _rank_in_cluster(spec: dict[str, Any], task_type: str, task_id: int) -> int:
    """A chief's or a worker's rank among the workers as TensorFlow numbers them (``multi_worker_util.id_in_cluster``,
    which :func:`~candle_ckpt.distributed.tf_group.tf_group` reaches): the chief task first, then the workers."""
    return task_id + (len(spec.get("chief") or []) if task_type == "worker" else 0)


def is_tf_keras(model: Any) -> bool:
    """True for a tf_keras (Keras 2) model, False for a Keras 3 one (read from its classes; imports neither)."""
    return any(cls.__module__.split(".")[0] == "tf_keras" for cls in type(model).__mro__)


def multi_worker_strategy(model: Any) -> Any:
    """The model's ``tf.distribute`` strategy if it spans several workers, else None."""
    # Keras 3's (TensorFlow backend) and tf_keras's property: the strategy the model was built under, else the
    # one in scope now.
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or type(strategy).__module__.split(".")[0] != "tensorflow":
        return None
    return strategy if worker_info(strategy).num_workers > 1 else None
