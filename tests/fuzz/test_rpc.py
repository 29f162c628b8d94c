"""Fuzzed gRPC payloads (issue #29): every undecodable request to any DevicePlugin
RPC answers INVALID_ARGUMENT and logs exactly one line, without a traceback; IDs
with control characters never reach the text log raw. Seeded, so a failure
reproduces; bounded to a few hundred calls."""

from __future__ import annotations

import logging
import random

import grpc
import pytest

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.kits.logs import TextFormatter
from tests.core.scripted import Scripted, make_devices

A = "example.com/fuzz"
RPCS = ["Allocate", "GetPreferredAllocation", "PreStartContainer", "GetDevicePluginOptions"]
CALLS = 200
# Field 1 of every request is a repeated message: a length that runs past the end,
# or invalid UTF-8 in a string field, cannot decode.
UNDECODABLE = [b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x03\x0a\x01\xff", b"\xff", b"\x0a"]


def _bodies(rng: random.Random) -> list[bytes]:
    out = list(UNDECODABLE)
    while len(out) < CALLS:
        n = rng.choice([1, 2, 5, 17, 300])
        out.append(bytes(rng.getrandbits(8) for _ in range(n)))
    return out


async def test_undecodable_requests_answer_invalid_argument_with_one_log_line(
    fake_kubelet, plugin_runner, caplog
):
    daemon = await plugin_runner.start(Scripted(make_devices(A, 2)))
    await fake_kubelet.wait_registered(A)
    socket = daemon.front_end.endpoints[A].socket_path
    rng = random.Random(29)
    caplog.set_level(logging.INFO)
    refused = 0
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        for i, body in enumerate(_bodies(rng)):
            rpc = RPCS[i % len(RPCS)]
            caplog.clear()
            try:
                await channel.unary_unary(f"/v1beta1.DevicePlugin/{rpc}")(body, timeout=5)
                continue  # it decoded (into something harmless)
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
            assert "Traceback" not in details
            if "not a valid protobuf message" in details:
                refused += 1
                ours = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert len(ours) == 1, [r.getMessage() for r in ours]
                assert ours[0].exc_info is None
                assert "\n" not in TextFormatter().format(ours[0])
            assert not [r for r in caplog.records if r.exc_info], rpc
    assert refused >= len(UNDECODABLE)  # the known-bad bodies were refused, not UNKNOWN
    resp = await fake_kubelet.allocate(A, ["dev0"])  # still serving
    assert resp.envs["VISIBLE"] == "0"


@pytest.mark.parametrize("bad", ["dev0\n12:00:00 INFO forged", "dev\x1b[2J", "d\u2028x", "d\x00"])
async def test_control_characters_in_requested_ids_never_reach_the_text_log_raw(
    fake_kubelet, plugin_runner, caplog, bad
):
    await plugin_runner.start(Scripted(make_devices(A, 2)))
    await fake_kubelet.wait_registered(A)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fake_kubelet.allocate(A, [bad])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = [TextFormatter().format(r) for r in caplog.records if not r.exc_info]
    assert any("Allocate refused" in line for line in lines)
    for line in lines:
        assert not any(c in line for c in "\n\r\x1b\x00\u2028"), repr(line)


def test_an_empty_request_message_still_decodes():
    assert pb.AllocateRequest.FromString(b"") == pb.AllocateRequest()
