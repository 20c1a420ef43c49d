"""engine/writer's memory guard: the memory a process may still take, read from a directory laid out like /proc
and /sys."""

from __future__ import annotations

from pathlib import Path

from candle_ckpt.engine import writer


def _lay(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


MEMINFO = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def test_without_a_cgroup_limit_the_node_s_available_memory_counts(tmp_path: Path) -> None:
    root = _lay(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/user.slice\n"})
    assert writer.available_memory(root) == 20_000_000 * 1024


def test_the_tightest_cgroup_v2_limit_on_the_way_to_the_root_counts(tmp_path: Path) -> None:
    """Slurm sets the job's limit on an ancestor of the step's cgroup: the least room of them all counts."""
    root = _lay(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n",
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.max": "16000000000\n",
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.current": "15000000000\n",
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/memory.max": "max\n",
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/memory.current": "14000000000\n",
        },
    )
    assert writer.available_memory(root) == 1_000_000_000


def test_a_cgroup_v1_limit_counts_and_its_no_limit_value_does_not(tmp_path: Path) -> None:
    files = {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "4:memory:/job_9\n3:cpuset:/\n",
        "sys/fs/cgroup/memory/job_9/memory.limit_in_bytes": "8000000000\n",
        "sys/fs/cgroup/memory/job_9/memory.usage_in_bytes": "2000000000\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "30000000000\n",
    }
    assert writer.available_memory(_lay(tmp_path, files)) == 6_000_000_000


def test_nothing_to_read_says_none_and_refuses_nothing(tmp_path: Path) -> None:
    assert writer.available_memory(str(tmp_path)) is None
    assert writer.copy_refused(10**15, str(tmp_path)) is None


def test_a_copy_over_half_of_the_room_is_refused_with_both_sizes(tmp_path: Path) -> None:
    root = _lay(tmp_path, {"proc/meminfo": "MemAvailable:   2000000 kB\n", "proc/self/cgroup": ""})  # 2.048 GB
    assert writer.copy_refused(1_000_000_000, root) is None
    why = writer.copy_refused(1_100_000_000, root)
    assert why == (
        "the host copy of an asynchronous save (1.1 GB) would take more than half of the memory this process "
        "may still use (2.0 GB, within its cgroup's limit)"
    )


def test_this_machine_tells_a_positive_amount() -> None:
    """On Linux the real /proc answers (the integration tests patch it; this checks the reading itself)."""
    room = writer.available_memory()
    assert room is None or room > 0
