"""The hand-over's schedule (issue 28 point 2): when the kubelet ends our stream while
it is up, the first Register again goes at once (a single hand-over does not wait);
losses in a row soon after registering back off, doubling up to one a second; a
stream that lasted starts the count again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetero_dp.deviceplugin.contract import Session
from hetero_dp.deviceplugin.streamwatch import (
    HANDOVER_BACKOFF,
    HANDOVER_MAX_BACKOFF,
    STABLE_STREAM,
    StreamWatch,
)


def watch() -> StreamWatch:
    def unused(*_a: Any) -> Any:
        raise AssertionError("not called by handover_delay")

    return StreamWatch(
        None,  # type: ignore[arg-type]
        Session(),
        kubelet_socket=Path("/nonexistent/kubelet.sock"),
        classic=True,
        stream_timeout=lambda: 30.0,
        running=lambda: True,
        stale=unused,
        keep=unused,
        register_again=unused,
        request_restart=unused,
    )


def test_one_hand_over_does_not_wait_and_repeats_back_off_to_one_a_second():
    w = watch()
    delays = [w.handover_delay(0.1) for _ in range(8)]
    assert delays[0] == 0.0
    assert delays[1:4] == [HANDOVER_BACKOFF, 2 * HANDOVER_BACKOFF, 4 * HANDOVER_BACKOFF]
    assert delays == sorted(delays) and delays[-1] == HANDOVER_MAX_BACKOFF == 1.0


def test_a_stream_that_lasted_starts_the_count_again():
    w = watch()
    for _ in range(5):
        w.handover_delay(0.1)
    assert w.handover_delay(STABLE_STREAM) == 0.0  # the next rolling update, hours later
    assert w.handover_delay(0.1) == HANDOVER_BACKOFF
