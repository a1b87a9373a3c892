"""The spool's on-disk contract: fsync'd frames survive reopening, a torn tail is dropped,
corruption is set aside (kept), and segments roll and are removed once replayed."""

from __future__ import annotations

from pathlib import Path

from allocator.recording.spool import FRAME_HEADER, Spool


def payload(i: int) -> dict[str, object]:
    return {"m": [], "d": [[f"r{i}", i]]}


def test_frames_survive_reopening_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(payload(i))
    spool.close()
    again = Spool(tmp_path)
    assert again.records == 5
    frames = [f for s in again.segments() for f in again.read(s)]
    assert frames == [payload(i) for i in range(5)]


def test_torn_last_frame_is_truncated_and_appending_resumes(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(payload(0))
    spool.append(payload(1))
    spool.close()
    (segment,) = tmp_path.glob("*.spool")
    data = segment.read_bytes()
    segment.write_bytes(data[:-3])  # killed mid-write: the last frame was never acknowledged
    again = Spool(tmp_path)
    assert again.records == 1
    again.append(payload(2))
    frames = [f for s in again.segments() for f in again.read(s)]
    assert frames == [payload(0), payload(2)]


def test_corruption_before_the_tail_is_kept_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1)  # one frame per segment
    for i in range(3):
        spool.append(payload(i))
    spool.close()
    _, second, _ = sorted(tmp_path.glob("*.spool"))
    data = bytearray(second.read_bytes())
    data[FRAME_HEADER.size + 2] ^= 0xFF  # flip a payload byte: the checksum no longer matches
    second.write_bytes(bytes(data))
    again = Spool(tmp_path)
    frames = [f for s in again.segments() for f in again.read(s)]
    assert frames == [payload(0), payload(2)]
    assert second.with_suffix(".corrupt").read_bytes() == bytes(data)


def test_segments_roll_and_replayed_ones_are_removed(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=200)
    for i in range(10):
        spool.append(payload(i))
    segments = spool.segments()
    assert len(segments) > 1
    assert sum(s.records for s in segments) == 10
    spool.remove(segments[0])
    assert spool.records == 10 - segments[0].records
    assert not segments[0].path.exists()
    assert spool.bytes == sum(s.size for s in segments[1:])
