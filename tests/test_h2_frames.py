"""server/http/h2_frames.py's frame heads read by hyperframe, the frame layer of the `h2` package (installed
with hypercorn), as an independent reader of RFC 9113 4.1."""

from hyperframe.frame import Frame
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.server.http.h2_frames import frame, frame_head

LENGTHS = st.sampled_from(
    [0, 1, 255, 256, 16383, 16384, 65535, 65536, (1 << 20), (1 << 24) - 1]
) | st.integers(0, (1 << 24) - 1)
STREAM_IDS = st.integers(0, (1 << 31) - 1)


# Types hyperframe does not know (16 and up) are read as extension frames, whose stream ids and flags
# it keeps as they come (its known types refuse, say, a SETTINGS frame on a stream).
@given(length=LENGTHS, kind=st.integers(16, 255), flags=st.integers(0, 255), stream_id=STREAM_IDS)
def test_every_frame_head_reads_back_as_written(length: int, kind: int, flags: int, stream_id: int) -> None:
    head = frame_head(kind, flags, stream_id, length)
    assert len(head) == 9
    parsed, read_length = Frame.parse_frame_header(memoryview(head))
    assert read_length == length
    assert parsed.type == kind and parsed.flag_byte == flags and parsed.stream_id == stream_id


@given(payload=st.binary(max_size=300), stream_id=STREAM_IDS.filter(bool))
def test_a_data_frame_is_its_head_then_its_payload(payload: bytes, stream_id: int) -> None:
    written = frame(0, 1, stream_id, memoryview(payload))
    parsed, length = Frame.parse_frame_header(memoryview(written[:9]))
    parsed.parse_body(memoryview(written[9:]))
    assert length == len(payload) and parsed.stream_id == stream_id
    assert parsed.data == payload and "END_STREAM" in parsed.flags
