"""Large CrcFile writes bypass the page cache (O_DIRECT) without changing a byte of what is written."""

from __future__ import annotations

import errno
import os
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candle_ckpt.core import fileobj
from candle_ckpt.core.checksum import CrcFile


@contextmanager
def small_direct_writes():
    """Direct writes from 8 KiB up, through a 16 KiB buffer: small examples exercise every edge."""
    with mock.patch.object(fileobj, "MIN_BYTES", 8192), mock.patch.object(fileobj, "BOUNCE", 16384):
        yield


def _fs_type(path: str) -> str:
    best, kind = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            mount_point, fs = line.split()[1:3]
            if path.startswith(mount_point) and len(mount_point) > len(best):
                best, kind = mount_point, fs
    return kind


def _direct_capable(path: Path) -> bool:
    """O_DIRECT is expected on the local disk file systems CI runs on."""
    return os.path.exists("/proc/mounts") and _fs_type(str(path)) in ("ext4", "xfs", "btrfs")


class _PwriteLog:
    """Counts the bytes each descriptor received through os.pwrite."""

    def __init__(self, fail_fd_with: int | None = None) -> None:
        self.bytes: dict[int, int] = {}
        self.fail_with = fail_fd_with
        self.fail_fd: int | None = None
        self._real = os.pwrite

    def __call__(self, fd, data, offset):
        if fd == self.fail_fd and self.fail_with is not None:
            raise OSError(self.fail_with, os.strerror(self.fail_with))
        n = self._real(fd, data, offset)
        self.bytes[fd] = self.bytes.get(fd, 0) + n
        return n


_WRITES = st.lists(
    st.tuples(st.integers(0, 70000), st.integers(0, 60000), st.integers(0, 255)),  # offset, length, fill
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(writes=_WRITES, truncate_at=st.one_of(st.none(), st.integers(0, 140000)))
def test_direct_and_buffered_writes_leave_the_same_bytes_and_crc(writes, truncate_at):
    """Any mix of large unaligned writes, overwrites, holes and a truncate reads back byte for byte, with its CRC."""
    with tempfile.TemporaryDirectory() as tmp, small_direct_writes():
        path = os.path.join(tmp, "f.bin")
        want = bytearray()
        with CrcFile(path) as f:
            for offset, length, fill in writes:
                data = bytes((fill + i) % 251 for i in range(length))
                f.seek(offset)
                assert f.write(data) == length
                if length:
                    want.extend(bytes(max(0, offset + length - len(want))))
                    want[offset : offset + length] = data
            if truncate_at is not None:
                f.truncate(truncate_at)
                want = want[:truncate_at] + bytes(max(0, truncate_at - len(want)))
            value = f.crc32()
        got = Path(path).read_bytes()
        assert got == bytes(want)
        assert value == zlib.crc32(got)


def test_the_aligned_middle_of_a_large_write_goes_through_the_direct_descriptor(tmp_path):
    """A large write at an odd offset sends its 4 KiB-aligned middle to the O_DIRECT descriptor, its edges elsewhere."""
    if not _direct_capable(tmp_path):
        pytest.skip(f"{tmp_path} is on {_fs_type(str(tmp_path)) or 'an unknown file system'}, not a local disk")
    log = _PwriteLog()
    data = os.urandom(3 * fileobj.MIN_BYTES + 777)
    with mock.patch.object(os, "pwrite", log), CrcFile(tmp_path / "f") as f:
        f.seek(1234)
        f.write(data)
        direct_fd = f._direct._fd
    head = -1234 % fileobj.ALIGN
    middle = (1234 + len(data)) // fileobj.ALIGN * fileobj.ALIGN - 1234 - head
    assert log.bytes[direct_fd] == middle
    assert sum(log.bytes.values()) == len(data)
    assert (tmp_path / "f").read_bytes()[1234:] == data


def test_a_file_system_that_refuses_o_direct_gets_buffered_writes(tmp_path):
    """Where opening with O_DIRECT fails (tmpfs says EINVAL), the file is written through the page cache, unchanged."""
    real_open = os.open

    def refuse(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    data = os.urandom(2 * fileobj.MIN_BYTES + 5)
    with mock.patch.object(os, "open", refuse), CrcFile(tmp_path / "f") as f:
        f.write(data)
        assert f._direct is None
        value = f.crc32()
    assert (tmp_path / "f").read_bytes() == data and value == zlib.crc32(data)


def test_a_direct_write_refused_midway_finishes_through_the_page_cache(tmp_path):
    """EINVAL from a direct write (an alignment stricter than 4 KiB) sends the rest through the page cache."""
    if not _direct_capable(tmp_path):
        pytest.skip(f"{tmp_path} is on {_fs_type(str(tmp_path)) or 'an unknown file system'}, not a local disk")
    log = _PwriteLog(fail_fd_with=errno.EINVAL)
    first, second = os.urandom(fileobj.MIN_BYTES + 99), os.urandom(fileobj.MIN_BYTES + 1)
    with mock.patch.object(os, "pwrite", log), CrcFile(tmp_path / "f") as f:
        log.fail_fd = f._direct_writer()._fd
        f.write(first)
        f.write(second)
        assert f._direct.refused
    assert (tmp_path / "f").read_bytes() == first + second


def test_a_failing_direct_write_raises_and_is_kept_for_the_store(tmp_path):
    """A disk error (ENOSPC) on the direct descriptor is raised and kept as the file's write_error, like any."""
    if not _direct_capable(tmp_path):
        pytest.skip(f"{tmp_path} is on {_fs_type(str(tmp_path)) or 'an unknown file system'}, not a local disk")
    log = _PwriteLog(fail_fd_with=errno.ENOSPC)
    f = CrcFile(tmp_path / "f")
    with mock.patch.object(os, "pwrite", log), pytest.raises(OSError, match="No space left"):
        log.fail_fd = f._direct_writer()._fd
        f.write(os.urandom(fileobj.MIN_BYTES))
    assert f.write_error is not None and f.write_error.errno == errno.ENOSPC
    f.abort()


def test_direct_writes_can_be_turned_off(tmp_path, monkeypatch):
    """CANDLE_CKPT_DIRECT_IO=0 keeps every write in the page cache."""
    monkeypatch.setenv("CANDLE_CKPT_DIRECT_IO", "0")
    with CrcFile(tmp_path / "f") as f:
        f.write(os.urandom(2 * fileobj.MIN_BYTES))
        assert f._direct is None
