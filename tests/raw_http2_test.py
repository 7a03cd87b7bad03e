#!/usr/bin/env python3
"""The server against a client speaking HTTP/2 directly (python3-h2), doing what gRPC's own
clients never do: it answers pings, so keepalive finds its connection alive, but grants no
flow-control window, so a reply of more than 64 KiB never goes out. Such a reply would hold its
job's buffers and admission for good; the server cancels it after --stream_idle_seconds. And a
client that grants no window at all, then cancels: the reply it never got is not counted OK. And
unary requests cut off partway, which gRPC still hands the server: counted by why they ended.

Usage: raw_http2_test.py --server PATH_TO_transpose_server
"""
import argparse
import socket
import struct
import subprocess
import sys
import time
import unittest
import urllib.request

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings

ARGS = None


def start_server(*flags):
    """The server on free loopback ports: its port and its metrics URL."""
    server = subprocess.Popen(
        [ARGS.server, "--backend=cpu", "--address=127.0.0.1:0",
         "--metrics_address=127.0.0.1:0", "--log_level=error", *flags],
        stdout=subprocess.PIPE, text=True)
    listening = server.stdout.readline()
    metrics = server.stdout.readline()
    if not listening.startswith("listening on ") or not metrics.startswith("metrics on "):
        server.kill()
        raise RuntimeError(f"the server did not start: {listening!r} {metrics!r}")
    port = int(listening.strip().rsplit(":", 1)[1])
    return server, port, "http://" + metrics.strip().rsplit(" ", 1)[1] + "/metrics"


def metric(url, sample):
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def transpose_request(rows, cols):
    """A TransposeRequest of a rows x cols float32 matrix, as a gRPC length-prefixed message."""
    shape = field(2, 0, rows) + field(3, 0, cols)
    message = field(1, 0, 1) + field(2, 2, shape) + field(3, 2, b"\x01" * (rows * cols * 4))
    return b"\x00" + struct.pack(">I", len(message)) + message


def first(events, kinds):
    """The first of `events` of one of `kinds`, or None."""
    return next((event for event in events if isinstance(event, kinds)), None)


class RawCall:
    """One call on a connection of its own: `headers` sent for `method`, then its events read as
    they come."""

    def __init__(self, port, method, headers=(), window=None):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.connection = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True))
        if window is not None:
            self.connection.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.connection.initiate_connection()
        self.stream = self.connection.get_next_available_stream_id()
        self.connection.send_headers(self.stream, [
            (":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
            (":path", f"/transpose.v1.TransposeService/{method}"),
            ("content-type", "application/grpc"), ("te", "trailers"), *headers])
        self.events = []

    def send(self, data, end_stream):
        self.connection.send_data(self.stream, data, end_stream=end_stream)
        self.sock.sendall(self.connection.data_to_send())

    def receive_until(self, kinds, timeout=30):
        """Reads until an event of one of `kinds` has arrived (that event), the connection
        closes or `timeout` seconds pass (None)."""
        start = time.monotonic()
        while first(self.events, kinds) is None and time.monotonic() - start < timeout:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            self.events += self.connection.receive_data(data)
            self.sock.sendall(self.connection.data_to_send())
        return first(self.events, kinds)

    def cancel(self):
        self.connection.reset_stream(self.stream, h2.errors.ErrorCodes.CANCEL)
        self.sock.sendall(self.connection.data_to_send())


class InfoCallWithoutWindow(RawCall):
    """A GetServerInfo call on a connection that grants no stream any window: the server's reply
    headers can arrive, its message cannot."""

    def __init__(self, port):
        super().__init__(port, "GetServerInfo", window=0)
        self.send(b"\x00" + struct.pack(">I", 0), end_stream=True)


class PartialTranspose(RawCall):
    """A Transpose call that sends the first `sent` bytes of its request's message and no more,
    with a grpc-timeout when `timeout` is given, ending the stream there when `end_stream`."""

    def __init__(self, port, sent, timeout=None, end_stream=False):
        super().__init__(port, "Transpose",
                         [("grpc-timeout", timeout)] if timeout is not None else [])
        self.send(transpose_request(256, 256)[:sent], end_stream=end_stream)


class ServerTest(unittest.TestCase):
    """Runs a server per test, started with FLAGS."""
    FLAGS = ()

    def setUp(self):
        self.server, self.port, self.metrics = start_server(*self.FLAGS)
        self.addCleanup(self.stop)

    def stop(self):
        self.server.kill()
        self.server.wait(timeout=30)
        self.server.stdout.close()

    def await_metric(self, sample, value, timeout):
        deadline = time.monotonic() + timeout
        while metric(self.metrics, sample) != value:
            if time.monotonic() > deadline:
                self.fail(f"{sample} is {metric(self.metrics, sample)}, not {value}")
            time.sleep(0.05)


class WithheldWindowTest(ServerTest):
    FLAGS = ("--stream_idle_seconds=1",)

    def test_an_unread_unary_reply_is_cancelled_and_gives_back_its_admission(self):
        sock = socket.create_connection(("127.0.0.1", self.port))
        self.addCleanup(sock.close)
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        sock.sendall(connection.data_to_send())
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{self.port}"),
            (":path", "/transpose.v1.TransposeService/Transpose"),
            ("content-type", "application/grpc"), ("te", "trailers")])
        body = transpose_request(1024, 1024)  # 4 MiB each way.
        sent = 0
        ended = None
        start = time.monotonic()
        # Sends the request as the server's window allows; reads what comes, acknowledging pings
        # (h2 does so itself) and settings, and no data: the server's window for its reply stays
        # at the 64 KiB HTTP/2 starts with.
        while ended is None and time.monotonic() - start < 30:
            while sent < len(body):
                window = min(connection.local_flow_control_window(stream),
                             connection.max_outbound_frame_size)
                if window == 0:
                    break
                chunk = body[sent:sent + window]
                sent += len(chunk)
                connection.send_data(stream, chunk, end_stream=sent == len(body))
            sock.sendall(connection.data_to_send())
            sock.settimeout(0.2)
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended = event
            sock.sendall(connection.data_to_send())
            if sent == len(body) and metric(self.metrics, "transpose_admitted_bytes") == 0 \
                    and metric(self.metrics, 'transpose_requests_total{code="DEADLINE_EXCEEDED",'
                                             'method="Transpose"}') == 1:
                break
        self.assertEqual(sent, len(body))
        # The server cancelled the reply (RST_STREAM), gave back the job's admission, and counted
        # the call as timed out, while this connection stayed open.
        self.await_metric("transpose_admitted_bytes", 0, timeout=10)
        self.await_metric('transpose_requests_total{code="DEADLINE_EXCEEDED",method="Transpose"}',
                          1, timeout=10)
        self.assertGreaterEqual(time.monotonic() - start, 1)

    def test_an_unread_server_info_reply_is_cancelled(self):
        call = InfoCallWithoutWindow(self.port)
        self.addCleanup(call.sock.close)
        self.assertIsNotNone(call.receive_until(h2.events.ResponseReceived),
                             "the server sent no response headers")
        # The reply's message cannot go out; the server cancels the call after
        # --stream_idle_seconds, ending the stream without it, and counts it as timed out.
        ended = call.receive_until((h2.events.StreamEnded, h2.events.StreamReset))
        self.assertIsNotNone(ended, "the server did not end the call")
        self.assertEqual(ended.stream_id, call.stream)
        self.assertIsNone(first(call.events, h2.events.DataReceived))
        trailers = first(call.events, h2.events.TrailersReceived)
        if trailers is not None:
            self.assertNotEqual(dict(trailers.headers).get(b"grpc-status"), b"0")
        self.await_metric('transpose_requests_total{code="DEADLINE_EXCEEDED",'
                          'method="GetServerInfo"}', 1, timeout=10)
        self.assertEqual(
            metric(self.metrics, 'transpose_requests_total{code="OK",method="GetServerInfo"}'), 0)
        self.await_metric("transpose_inflight_requests", 0, timeout=10)


class CancelledServerInfoTest(ServerTest):
    """With the server's default idle limit, so that the client cancels first."""

    def test_a_server_info_reply_never_delivered_is_not_counted_ok(self):
        call = InfoCallWithoutWindow(self.port)
        self.addCleanup(call.sock.close)
        self.assertIsNotNone(call.receive_until(h2.events.ResponseReceived),
                             "the server sent no response headers")
        self.assertIsNone(first(call.events, (h2.events.DataReceived, h2.events.StreamEnded,
                                              h2.events.StreamReset)))
        # The server has answered; the call stays in flight while its reply is held back.
        self.await_metric("transpose_inflight_requests", 1, timeout=10)
        call.cancel()
        self.await_metric('transpose_requests_total{code="CANCELLED",method="GetServerInfo"}',
                          1, timeout=10)
        self.assertEqual(
            metric(self.metrics, 'transpose_requests_total{code="OK",method="GetServerInfo"}'), 0)
        self.await_metric("transpose_inflight_requests", 0, timeout=10)


class CutOffUnaryUploadTest(ServerTest):
    """gRPC runs a unary handler even when its request's message never arrived whole."""

    @staticmethod
    def count(code):
        return f'transpose_requests_total{{code="{code}",method="Transpose"}}'

    def test_a_request_cut_off_is_counted_by_why_not_as_malformed(self):
        # Cancelled by the client, 1000 bytes into a 256 KiB message.
        cancelled = PartialTranspose(self.port, 1000)
        self.addCleanup(cancelled.sock.close)
        # The server has the first part, and waits for the rest.
        self.assertIsNone(cancelled.receive_until(h2.events.StreamEnded, timeout=0.5))
        cancelled.cancel()
        self.await_metric(self.count("CANCELLED"), 1, timeout=10)
        # Its deadline passed with the message still short: gRPC answers for the server.
        timed_out = PartialTranspose(self.port, 1000, timeout="300m")
        self.addCleanup(timed_out.sock.close)
        self.assertIsNotNone(timed_out.receive_until(h2.events.StreamEnded))
        self.await_metric(self.count("DEADLINE_EXCEEDED"), 1, timeout=10)
        self.assertEqual(metric(self.metrics, self.count("INVALID_ARGUMENT")), 0)
        # Not cut off: the client ended its stream short of the message, which is its mistake,
        # and hears so.
        short = PartialTranspose(self.port, 1000, end_stream=True)
        self.addCleanup(short.sock.close)
        self.assertIsNotNone(short.receive_until(h2.events.StreamEnded))
        trailers = dict(first(short.events, (h2.events.ResponseReceived,
                                             h2.events.TrailersReceived)).headers)
        self.assertEqual(trailers.get(b"grpc-status"), b"3")
        self.assertEqual(trailers.get(b"grpc-message"),
                         b"the request's message did not arrive whole")
        self.await_metric(self.count("INVALID_ARGUMENT"), 1, timeout=10)
        self.assertEqual(metric(self.metrics, self.count("CANCELLED")), 1)
        self.assertEqual(metric(self.metrics, self.count("DEADLINE_EXCEEDED")), 1)
        self.await_metric("transpose_inflight_requests", 0, timeout=10)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
