"""The recorder's durable spool: one fsync'd frame per batch, ``length (u32 LE) | crc32 (u32 LE)
| JSON``, in numbered segments replayed oldest first and deleted once committed (a crash between
replays one twice: the request ids absorb it). A torn last frame was never acknowledged and is
truncated at open; a bad frame elsewhere is corruption: its segment is kept aside as ``*.corrupt``
and the good frames before it replay."""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from allocator.artifacts.files import fsync_path

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct("<II")
SEGMENT_SUFFIX = ".spool"
QUARANTINE_FILE = "quarantine.frames"
CORRUPT_SUFFIX = ".corrupt"
MAX_FRAME_BYTES = 1 << 30


class SpoolError(OSError):
    """The spool cannot be written (disk full, permissions); the records stay with the caller."""


@dataclass(frozen=True)
class Segment:
    path: Path
    records: int
    size: int


def encode_frame(payload: dict[str, Any]) -> bytes:
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)  # records are finite
    return FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


def _frames(data: bytes) -> Iterator[tuple[dict[str, Any], int]]:
    """Frames decoded from ``data`` one at a time, each with the byte offset where it ends;
    stops at the first torn or bad frame."""
    offset = 0
    while offset + FRAME_HEADER.size <= len(data):
        length, crc = FRAME_HEADER.unpack_from(data, offset)
        start = offset + FRAME_HEADER.size
        end = start + length
        if length > MAX_FRAME_BYTES or end > len(data):
            return
        body = data[start:end]
        if zlib.crc32(body) != crc:
            return
        try:
            frame = orjson.loads(body)
        except ValueError:
            return
        yield frame, end
        offset = end


def _count(frame: dict[str, Any]) -> int:
    return len(frame.get("d", ()))


class Spool:
    """Append-only segments in ``directory``, one writer at a time; ``segment_bytes`` bounds a
    segment so that replay frees space as it goes."""

    def __init__(self, directory: str | Path, segment_bytes: int = 64 << 20) -> None:
        self.directory = Path(directory)
        self.segment_bytes = int(segment_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._current: Any = None  # open file of the newest segment
        self._recover()

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def records(self) -> int:
        with self._lock:
            return sum(s.records for s in self._segments)

    def __len__(self) -> int:
        with self._lock:
            return len(self._segments)

    def segments(self) -> list[Segment]:
        """Segments oldest first (a snapshot)."""
        with self._lock:
            return list(self._segments)

    def _recover(self) -> None:
        """Index existing segments, truncating a torn tail and setting corrupt ones aside."""
        paths = sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))
        for i, path in enumerate(paths):
            data = path.read_bytes()
            frames = list(_frames(data))
            good = frames[-1][1] if frames else 0
            if good < len(data) and i == len(paths) - 1:
                log.warning(
                    "spool %s: dropping a torn last frame (%d bytes, never acknowledged)",
                    path,
                    len(data) - good,
                )
                with path.open("r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            elif good < len(data):
                corrupt = path.with_suffix(CORRUPT_SUFFIX)
                log.error(
                    "spool %s: corrupt frame at byte %d; kept as %s, the %d good frames "
                    "before it replay from a copy",
                    path,
                    good,
                    corrupt,
                    len(frames),
                )
                path.rename(corrupt)
                if frames:
                    path.write_bytes(data[:good])
            if good == 0:
                path.unlink(missing_ok=True)  # gone already when set aside as corrupt
                continue
            self._segments.append(Segment(path, sum(_count(f) for f, _ in frames), good))
        fsync_path(self.directory)

    def append(self, payload: dict[str, Any]) -> int:
        """Append one frame and fsync it; returns the frame's size. Raises ``SpoolError``."""
        frame = encode_frame(payload)
        records = _count(payload)
        try:
            with self._lock:
                # the open file is always the newest segment's (a sealed one is closed)
                if (
                    self._current is None
                    or self._segments[-1].size + len(frame) > self.segment_bytes
                ):
                    self._open_new()
                f = self._current
                f.write(frame)
                f.flush()
                os.fsync(f.fileno())
                last = self._segments[-1]
                self._segments[-1] = Segment(
                    last.path, last.records + records, last.size + len(frame)
                )
        except OSError as exc:
            raise SpoolError(
                exc.errno, f"cannot write the spool in {self.directory}: {exc}"
            ) from exc
        return len(frame)

    def _open_new(self) -> None:
        self._close_current()
        last = self._segments[-1].path if self._segments else None
        number = int(last.stem) + 1 if last is not None else 1
        path = self.directory / f"{number:020d}{SEGMENT_SUFFIX}"
        self._current = path.open("ab")
        fsync_path(self.directory)
        self._segments.append(Segment(path, 0, 0))

    def quarantine(self, payload: dict[str, Any]) -> Path:
        """Keep records the database refused, fsync'd, in ``QUARANTINE_FILE`` (never replayed)."""
        path = self.directory / QUARANTINE_FILE
        with path.open("ab") as f:
            f.write(encode_frame(payload))
            f.flush()
            os.fsync(f.fileno())
        return path

    def read(self, segment: Segment) -> Iterator[dict[str, Any]]:
        """The frames of ``segment``'s durable bytes, each decoded as it is reached."""
        with segment.path.open("rb") as f:
            data = f.read(segment.size)
        yield from (frame for frame, _ in _frames(data))

    def seal(self, segment: Segment) -> None:
        """Append no more to ``segment`` (one being replayed is deleted afterwards, so it must
        hold only the frames it was read with)."""
        with self._lock:
            self._close_current(segment.path)

    def remove(self, segment: Segment) -> None:
        """Delete a fully replayed segment (durably)."""
        with self._lock:
            self._close_current(segment.path)
            segment.path.unlink(missing_ok=True)
            self._segments = [s for s in self._segments if s.path != segment.path]
        fsync_path(self.directory)

    def close(self) -> None:
        with self._lock:
            self._close_current()

    def _close_current(self, path: Path | None = None) -> None:
        """Close the open segment file (only if it is ``path``, when given); lock held."""
        if self._current is not None and path in (None, Path(self._current.name)):
            self._current.close()
            self._current = None
