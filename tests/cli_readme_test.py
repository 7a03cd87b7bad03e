#!/usr/bin/env python3
"""The README's run command starts a working server, and the `transpose` CLI transposes files
against it: .npy for every dtype of the API (results equal NumPy's A.T), raw files, batches, and
the info, health and bench commands. Clear errors for bad files.

Usage: cli_readme_test.py --repo REPO --cli PATH_TO_transpose [--build_dir DIR]
"""
import argparse
import io
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

ARGS = None

# NumPy dtypes for the API's data types; bfloat16 is stored as 2-byte void, as ml_dtypes saves it.
DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "bfloat16": np.dtype("V2"), "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
    "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
    "uint64": np.uint64, "complex64": np.complex64, "complex128": np.complex128,
}


def random_array(dtype, shape, rng):
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same(a, b):
    """Bytewise equality (NaN payloads in random float bits compare unequal as floats)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def refused_address(test):
    """A loopback address that refuses connections for the rest of `test`: a port bound and never
    listening, held so that no other process takes it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    test.addCleanup(held.close)
    return "127.0.0.1:%d" % held.getsockname()[1]


def silent_address(test):
    """A loopback address that accepts connections and never answers (a hung server): the
    kernel completes the TCP handshakes into a listening socket nobody accepts from."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(16)
    test.addCleanup(held.close)
    return "127.0.0.1:%d" % held.getsockname()[1]


def skip_where_address_sanitized(test, binary):
    with open(binary, "rb") as f:
        if b"__asan_init" in f.read():
            test.skipTest("AddressSanitizer reserves terabytes of address space at start-up, "
                          "which no ulimit -v leaves it")


def address_space_limiter(limit):
    """A preexec_fn that runs the child under ulimit -v `limit`."""
    def limit_address_space():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        # ulimit -s 8192, most shells' default, which sizes each thread's stack.
        hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
        resource.setrlimit(resource.RLIMIT_STACK, (
            8 << 20 if hard == resource.RLIM_INFINITY else min(8 << 20, hard), hard))
    return limit_address_space


class SlowUploadRelay:
    """A TCP relay to `target` that passes what clients send at `rate` bytes a second, and the
    answers as they come: the connection (a handshake of a few hundred bytes) is made at once, and
    a matrix then takes its size / `rate` to go up, as over a slow link."""

    def __init__(self, test, target, rate):
        self.rate = rate
        host, port = target.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets = []
        self.closed = False
        test.addCleanup(self.close)
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # Closed.
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()  # No server: the client learns so.
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    server.close()
                    return
                self.sockets += [client, server]
            threading.Thread(target=self.pipe, args=(client, server, self.rate),
                             daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, None), daemon=True).start()

    @staticmethod
    def pipe(source, sink, rate):
        piece = 1024 if rate else 65536
        try:
            while data := source.recv(piece):
                sink.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # A side closed.

    def reset(self):
        """Resets every connection (RST, as a server that died or a proxy that dropped it)."""
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def close(self):
        with self.lock:
            self.closed = True
            sockets, self.sockets = self.sockets, []
        # A thread blocked in accept() wakes only at a shutdown, not a close.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in sockets:
            s.close()


class CliReadmeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        env = dict(os.environ, BUILD_DIR=ARGS.build_dir)
        cls.tmp = tempfile.TemporaryDirectory()
        # The server's log, kept to read the limits it settled on (and shown should it not start).
        cls.server_log = open(os.path.join(cls.tmp.name, "server.log"), "w+")
        # The README's run command, on free loopback ports.
        cls.server = subprocess.Popen(
            [os.path.join(ARGS.repo, "scripts/run_server.sh"), "--address=127.0.0.1:0",
             "--metrics_address=127.0.0.1:0", "--max_message_bytes=1048576",
             "--response_chunk_bytes=65536"],
            stdout=subprocess.PIPE, stderr=cls.server_log, text=True, env=env,
            start_new_session=True)
        cls.target = None
        deadline = time.time() + 1200
        while time.time() < deadline:
            line = cls.server.stdout.readline()
            if not line:
                break
            if line.startswith("listening on "):
                cls.target = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
                break
        cls.server_log.seek(0)
        log = cls.server_log.read()
        if cls.target is None:
            cls.server.kill()
            cls.tmp.cleanup()
            raise RuntimeError("the README's run command did not start a server:\n" + log)
        # The README's 4 GiB, unless this machine's memory lowered the admission budget below it
        # (the server warns at start which limit binds).
        lowered = re.search(r"matrices are limited to (\d+) bytes", log)
        cls.matrix_limit = int(lowered.group(1)) if lowered else 4 << 30

    @classmethod
    def tearDownClass(cls):
        os.killpg(cls.server.pid, signal.SIGTERM)
        cls.server.wait(timeout=60)
        cls.server_log.close()
        cls.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def cli(self, *args, check=True, server=None):
        result = subprocess.run([ARGS.cli, f"--server={server or self.target}", *args],
                                capture_output=True, text=True, timeout=600)
        if check:
            self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        return result

    def test_every_dtype_npy_equals_numpy_transpose(self):
        rng = np.random.default_rng(1)
        for name, dtype in DTYPES.items():
            for shape in [(1, 1), (1, 37), (37, 1), (13, 7), (301, 257)]:
                with self.subTest(dtype=name, shape=shape):
                    a = random_array(dtype, shape, rng)
                    np.save(self.path("a.npy"), a)
                    self.cli("transpose", f"--in={self.path('a.npy')}",
                             f"--out={self.path('b.npy')}")
                    b = np.load(self.path("b.npy"))
                    self.assertTrue(same(b, np.ascontiguousarray(a.T)))

    def test_batch_npy_transposes_each_matrix(self):
        a = random_array(np.float32, (3, 65, 129), np.random.default_rng(2))
        np.save(self.path("batch.npy"), a)
        self.cli("transpose", f"--in={self.path('batch.npy')}", f"--out={self.path('out.npy')}")
        b = np.load(self.path("out.npy"))
        self.assertTrue(same(b, np.ascontiguousarray(np.swapaxes(a, 1, 2))))

    def test_large_matrix_streams_past_the_unary_limit(self):
        a = random_array(np.float32, (1500, 1001), np.random.default_rng(3))
        np.save(self.path("big.npy"), a)
        result = self.cli("transpose", f"--in={self.path('big.npy')}",
                          f"--out={self.path('big_t.npy')}")
        self.assertTrue(same(np.load(self.path("big_t.npy")), np.ascontiguousarray(a.T)))
        self.assertIn("GB/s", result.stderr)

    def test_raw_files(self):
        a = random_array(np.int16, (2, 30, 50), np.random.default_rng(4))
        a.tofile(self.path("a.bin"))
        self.cli("transpose", f"--in={self.path('a.bin')}", f"--out={self.path('b.bin')}",
                 "--batch=2", "--rows=30", "--cols=50", "--dtype=int16")
        b = np.fromfile(self.path("b.bin"), dtype=np.int16).reshape(2, 50, 30)
        self.assertTrue(same(b, np.ascontiguousarray(np.swapaxes(a, 1, 2))))
        # Raw in, .npy out.
        self.cli("transpose", f"--in={self.path('a.bin')}", f"--out={self.path('b.npy')}",
                 "--batch=2", "--rows=30", "--cols=50", "--dtype=int16")
        self.assertTrue(same(np.load(self.path("b.npy")), np.ascontiguousarray(np.swapaxes(a, 1, 2))))

    def test_bad_inputs_get_clear_errors(self):
        np.save(self.path("object.npy"), np.array([[1, "a"]], dtype=object))
        result = self.cli("transpose", f"--in={self.path('object.npy')}",
                          f"--out={self.path('x.npy')}", check=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("'|O' is not supported", result.stderr)
        np.save(self.path("vector.npy"), np.ones(5, np.float32))
        result = self.cli("transpose", f"--in={self.path('vector.npy')}",
                          f"--out={self.path('x.npy')}", check=False)
        self.assertIn("array has 1 dimension;", result.stderr)
        with open(self.path("short.bin"), "wb") as f:
            f.write(b"\0" * 10)
        result = self.cli("transpose", f"--in={self.path('short.bin')}",
                          f"--out={self.path('x.bin')}", "--rows=3", "--cols=3",
                          "--dtype=float32", check=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("short.bin holds 10 bytes; float32 3x3 needs 36", result.stderr)
        self.assertNotIn("INVALID_ARGUMENT", result.stderr)
        result = self.cli("transpose", f"--in={self.path('missing.npy')}",
                          f"--out={self.path('x.npy')}", check=False)
        # This machine's error, not labelled with a status code as if the server had answered.
        self.assertTrue(result.stderr.startswith("error: cannot open "), result.stderr)
        self.assertNotIn("NOT_FOUND", result.stderr)
        result = self.cli("frobnicate", check=False)
        self.assertEqual(result.returncode, 2)

    def test_a_damaged_npy_file_is_an_error_of_this_machine(self):
        # An empty or cut-off download of a .npy file, or text under its name: exit 1, as a
        # header that does not parse is, not a usage error (it used to exit 2 for the first).
        for name, content in (("empty.npy", b""), ("text.npy", b"not numpy at all\n"),
                              ("cut.npy", b"\x93NUMPY\x01\x00")):
            with open(self.path(name), "wb") as f:
                f.write(content)
            result = self.cli("transpose", f"--in={self.path(name)}",
                              f"--out={self.path('x.npy')}", check=False)
            self.assertEqual(result.returncode, 1, f"{name}: {result.stderr}")
            self.assertIn(f"{name}: not a usable .npy file", result.stderr)
            self.assertNotIn("usage error", result.stderr)
        self.assertFalse(os.path.exists(self.path("x.npy")))

    def test_fortran_order_files_transpose_as_numpy_does(self):
        # np.save of a transposed view writes Fortran order.
        rng = np.random.default_rng(12)
        for dtype, shape in ((np.float32, (37, 53)), (np.int8, (5, 31, 17)),
                             (np.complex128, (3, 64, 65)), (np.uint16, (1, 7, 9))):
            a = np.asfortranarray(random_array(dtype, shape, rng))
            np.save(self.path("f.npy"), a)
            with open(self.path("f.npy"), "rb") as f:
                self.assertIn(b"'fortran_order': True", f.read(128))
            result = self.cli("transpose", f"--in={self.path('f.npy')}",
                              f"--out={self.path('f_t.npy')}")
            expected = np.ascontiguousarray(np.swapaxes(a, -1, -2))
            self.assertTrue(same(np.load(self.path("f_t.npy")), expected), (dtype, shape))
            # One matrix (a batch of one too) needs no call; the summary keeps the batch.
            if len(shape) == 2 or shape[0] == 1:
                self.assertIn("no call to the server", result.stderr)
            else:
                self.assertIn("backend ", result.stderr)
            dims = "x".join(map(str, shape))
            dims_t = "x".join(map(str, shape[:-2] + (shape[-1], shape[-2])))
            self.assertIn(f" {dims} -> {dims_t} written to", result.stderr)

    def test_other_numpy_types_keep_their_dtype(self):
        """NumPy's other plain types, big-endian numbers included, go as a type of their size,
        and the output is the same dtype: np.load gives exactly a.T."""
        rng = np.random.default_rng(11)
        arrays = {
            "bool": rng.integers(0, 2, (17, 9)).astype(bool),
            "datetime": rng.integers(0, 1 << 40, (6, 13)).astype("datetime64[s]"),
            "void": random_array(np.dtype("V4"), (5, 8), rng),
            "big_f4": random_array(np.dtype(">f4"), (7, 5), rng),
            "big_i8": random_array(np.dtype(">i8"), (2, 9, 4), rng),
            "big_c8": random_array(np.dtype(">c8"), (3, 11), rng),
            "big_c16": random_array(np.dtype(">c16"), (4, 3), rng),
            "unicode": np.array([["ab", "c"], ["d", "ef"], ["g", "h"]], dtype="<U2"),
        }
        for name, a in arrays.items():
            np.save(self.path(f"{name}.npy"), a)
            result = self.cli("transpose", f"--in={self.path(name + '.npy')}",
                              f"--out={self.path(name + '_t.npy')}")
            self.assertIn(f"'{a.dtype.str}' as ", result.stderr, name)
            self.assertTrue(same(np.load(self.path(name + "_t.npy")),
                                 np.ascontiguousarray(np.swapaxes(a, -1, -2))), name)
        # --dtype names the type they go as; the output still keeps the file's.
        self.cli("transpose", f"--in={self.path('big_f4.npy')}",
                 f"--out={self.path('big_f4_t.npy')}", "--dtype=int32")
        self.assertTrue(same(np.load(self.path("big_f4_t.npy")),
                             np.ascontiguousarray(arrays["big_f4"].T)))
        # An element size no type of the service has: a clear refusal.
        np.save(self.path("bytes3.npy"), np.array([[b"abc", b"de"]], dtype="S3"))
        result = self.cli("transpose", f"--in={self.path('bytes3.npy')}",
                          f"--out={self.path('x.npy')}", check=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("dtype '|S3' has 3-byte elements, and none of the service's types has",
                      result.stderr)

    def test_info_health_and_bench(self):
        info = self.cli("info").stdout
        self.assertIn("backend ", info)
        # Each limit in the largest unit that leaves at least 1 of it.
        self.assertIn("unary message 1.0 MiB", info)
        self.assertIn("response chunk 64.0 KiB", info)
        self.assertRegex(info, r"streams, \d+\.\d GiB memory, copy bandwidth")
        self.assertEqual(self.cli("health").stdout.strip(), "SERVING")
        self.assertEqual(self.cli("health", "--service=transpose.v1.TransposeService").stdout
                         .strip(), "SERVING (transpose.v1.TransposeService)")
        # An answer, not a lost server: 1, naming the service.
        unknown = self.cli("health", "--service=nope", check=False)
        self.assertEqual(unknown.returncode, 1, unknown.stderr)
        self.assertIn("nope: the server has no such service", unknown.stdout)
        bench = self.cli("bench", "--count=40", "--concurrency=4", "--shape=2x64x96",
                         "--dtype=uint16", "--verify").stdout
        self.assertIn("40 ok, 0 errors", bench)
        self.assertIn("p99", bench)

    def test_health_of_a_dead_server_fails(self):
        # 3: no answer, which a probe can tell from an answer of NOT_SERVING (1).
        result = subprocess.run([ARGS.cli, f"--server={refused_address(self)}", "--deadline=2s",
                                 "health"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 3)
        self.assertIn("UNAVAILABLE", result.stderr)

    def test_wait_for_ready_waits_out_the_deadline_for_a_server_out_of_reach(self):
        # Without the flag, info fails UNAVAILABLE at once; with it, it waits for the server up to
        # its deadline. Health answers for now either way.
        refused = refused_address(self)
        base = [ARGS.cli, f"--server={refused}", "--deadline=3s"]
        for flags, command, code, error in (
                ([], "info", 1, "UNAVAILABLE"),
                (["--wait_for_ready"], "info", 1, "DEADLINE_EXCEEDED"),
                (["--wait_for_ready"], "health", 3, "UNAVAILABLE")):
            start = time.time()
            result = subprocess.run(base + flags + [command], capture_output=True, text=True,
                                    timeout=60)
            elapsed = time.time() - start
            self.assertEqual(result.returncode, code, result.stderr)
            self.assertIn(error, result.stderr)
            if error == "DEADLINE_EXCEEDED":
                self.assertGreaterEqual(elapsed, 2.5, flags)
                self.assertIn(f"no connection to {refused} was made (wait_for_ready)",
                              result.stderr)
        # A transfer says so too.
        np.save(self.path("w.npy"), np.ones((3, 4), np.float32))
        result = subprocess.run(base + ["--wait_for_ready", "transpose",
                                        f"--in={self.path('w.npy')}",
                                        f"--out={self.path('w_t.npy')}"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"(the call's timeout of 3s passed; no connection to {refused} was made "
                      "(wait_for_ready))", result.stderr)
        self.assertNotIn("a longer --deadline", result.stderr)

    def test_health_of_a_hung_server_gives_up_within_seconds(self):
        # A listener that accepts and never answers: without --deadline, health and info (and
        # bench's question of the server's limits) wait 5 s, not the transfers' 10 minutes.
        # Health exits 4 (no answer in time from a server that took the connection), which a
        # liveness probe can tell from 3 (out of reach).
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            target = f"--server=127.0.0.1:{listener.getsockname()[1]}"
            # Each says that it never got as far as a gRPC connection.
            unconnected = (f"no connection to {target.split('=')[1]} was made: still connecting "
                           "(name lookup, TCP, TLS or HTTP/2 handshake unfinished)")
            for command in ("health", "info", "bench"):
                start = time.time()
                result = subprocess.run([ARGS.cli, target, command]
                                        + (["--count=1"] if command == "bench" else []),
                                        capture_output=True, text=True, timeout=120)
                self.assertEqual(result.returncode, 4 if command == "health" else 1,
                                 result.stderr)
                self.assertIn("DEADLINE_EXCEEDED", result.stderr)
                self.assertIn(unconnected, result.stderr)
                self.assertLess(time.time() - start, 30, command)
            # A transfer too, without the advice of a longer deadline, which is for a server
            # reached (below).
            np.save(self.path("h.npy"), np.ones((3, 4), np.float32))
            result = subprocess.run([ARGS.cli, target, "--deadline=2s", "transpose",
                                     f"--in={self.path('h.npy')}", f"--out={self.path('h_t.npy')}"],
                                    capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 1, result.stderr)
            # The request id names the call in the server's log.
            self.assertRegex(result.stderr, r"DEADLINE_EXCEEDED: Deadline Exceeded \(the call's "
                             r"timeout of 2s passed; " + re.escape(unconnected) +
                             r"\) \[request [0-9a-f]{16}\]\n")
            self.assertNotIn("a longer --deadline", result.stderr)

    def test_a_transfer_out_of_time_on_a_slow_link_says_the_deadline_can_be_longer(self):
        # 256 KiB at 64 KiB/s: connected at once, and 4 s to go up, past a 2 s deadline.
        relay = SlowUploadRelay(self, self.target, 64 << 10)
        np.save(self.path("slow.npy"), np.ones((256, 256), np.float32))
        for mode in ([], ["--stream"]):
            result = self.cli("--deadline=2s", "transpose", *mode, f"--in={self.path('slow.npy')}",
                              f"--out={self.path('slow_t.npy')}", check=False,
                              server=relay.address)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertRegex(result.stderr, r"DEADLINE_EXCEEDED: Deadline Exceeded \(the call's "
                             r"timeout of 2s passed\) \[request [0-9a-f]{16}\]; a longer "
                             r"--deadline gives large matrices and slow links their time\n")
            self.assertFalse(os.path.exists(self.path("slow_t.npy")))

    def test_a_connection_lost_mid_transfer_is_not_taken_for_a_tls_mismatch(self):
        # A plaintext call that a TLS server closes gets a hint to use TLS; one whose connection
        # went after part of the matrix had moved (the server died, a proxy dropped it) does not.
        relay = SlowUploadRelay(self, self.target, 1 << 20)
        np.save(self.path("lost.npy"), np.ones((2048, 1024), np.float32))  # 8 MiB: 8 s up.
        cli = subprocess.Popen([ARGS.cli, f"--server={relay.address}", "--attempts=1",
                                "transpose", f"--in={self.path('lost.npy')}",
                                f"--out={self.path('lost_t.npy')}"],
                               stderr=subprocess.PIPE, text=True)
        time.sleep(2.5)
        self.assertIsNone(cli.poll())
        relay.reset()
        _, stderr = cli.communicate(timeout=60)
        self.assertEqual(cli.returncode, 1, stderr)
        self.assertIn("error: UNAVAILABLE", stderr)
        self.assertNotIn("TLS", stderr)
        self.assertFalse(os.path.exists(self.path("lost_t.npy")))

    def test_a_deadline_that_is_not_positive_is_a_usage_error(self):
        for deadline in ("0s", "-1s"):
            result = self.cli(f"--deadline={deadline}", "health", check=False)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn("expected a positive duration", result.stderr)


    def test_flag_mistakes_are_usage_errors_naming_the_flag(self):
        np.save(self.path("m.npy"), np.ones((3, 4), np.float32))
        with open(self.path("m.bin"), "wb") as f:
            f.write(np.ones((3, 4), np.float32).tobytes())
        with open(self.path("text.npy"), "w") as f:
            f.write("not numpy at all\n")
        cases = [
            (["--attempts=0", "health"], "--attempts=0"),
            (["--connections=0", "health"], "--connections=0: expected 1 to 64"),
            (["--connections=65", "info"], "--connections=65: expected 1 to 64"),
            (["--tls_cert=client.pem", "health"], "--tls_cert=client.pem"),
            (["bench", "--duration=0s"], "--duration=0"),
            (["bench", "--concurrency=0"], "--concurrency=0"),
            (["bench", "--concurrency=100000"], "--concurrency=100000: expected 1 to 1024"),
            (["transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}",
              "--rows=5"], "--rows=5"),
            (["transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}",
              "--batch=2"], "--batch=2"),
            (["transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.bin')}",
              "--dtype=float32", "--rows=0", "--cols=4"], "--rows=0"),
            (["bench", "--shape=0x5"], "--shape=0x5"),
            (["bench", "--count=2", "--duration=1s"],
             "--count=2 and --duration=1s contradict each other"),
            # The default's value given explicitly is still given.
            (["bench", "--count=2", "--duration=10s"],
             "--count=2 and --duration=10s contradict each other"),
            # A flag for another command: a typo'd command, or a mistaken flag.
            (["health", "--count=5"], "--count is for bench, not health"),
            (["transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}",
              "--shape=3x4"], "--shape is for bench, not transpose"),
            (["--server=", "info"], "--server=: no target given"),
            (["--server=dns:///", "info"], "target dns:///: names no address"),
            (["--server=localhost:abc", "health"], "port 'abc' is not a number"),
            (["transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}",
              "--dtype=float64"], "--dtype=float64 has 8-byte elements, but"),
            (["transpose", f"--in={self.path('m.bin')}", f"--out={self.path('x.bin')}",
              "--rows=3", "--cols=4"], "m.bin is not a .npy file; raw input needs --dtype\n"),
            (["bench", "--count=0"], "--count=0: expected 1 or more"),
            (["transpose", f"--in={self.path('m.bin')}", f"--out={self.path('x.bin')}",
              "--dtype=float32", "--rows=18446744073709551615", "--cols=2"],
             "--batch, --rows and --cols give 18446744073709551615x2:"),
            # gRPC would take the port modulo 65536 and reach another server.
            ([f"--server=127.0.0.1:{int(self.target.rsplit(':', 1)[1]) + 65536}", "health"],
             "is past 65535"),
        ]
        for args, message in cases:
            result = self.cli(*args, check=False)
            self.assertEqual(result.returncode, 2, f"{args}: {result.stderr}")
            self.assertIn(message, result.stderr, args)
        self.assertFalse(os.path.exists(self.path("x.npy")))
        # --only_check_args checks the command, the flags every command takes and the command's
        # own flags' values, as a run does, without running it (it used to exit 0 whatever the
        # command, then to pass a transpose or bench flag it does not know the value of).
        in_out = [f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}"]
        for args, message in ((["frobnicate"], "unknown command 'frobnicate'"),
                              ([], "expected one command"),
                              (["health", "--count=5"], "--count is for bench, not health"),
                              (["--connections=0", "info"], "--connections=0: expected 1 to 64"),
                              (["transpose", f"--in={self.path('m.npy')}"],
                               "transpose needs --in and --out"),
                              (["transpose", *in_out, "--dtype=float128"],
                               "--dtype=float128 is unknown"),
                              (["transpose", *in_out, "--algorithm=fastest"],
                               "--algorithm=fastest is unknown"),
                              (["transpose", *in_out, "--out_format=csv"],
                               "--out_format=csv: expected npy or raw"),
                              (["bench", "--shape=64"], "--shape must be ROWSxCOLS"),
                              (["bench", "--shape=64xx64"], "--shape must be ROWSxCOLS"),
                              (["bench", "--count=3", "--duration=1s"],
                               "contradict each other"),
                              (["bench", "--concurrency=0"], "--concurrency")):
            result = self.cli("--only_check_args", *args, check=False)
            self.assertEqual(result.returncode, 2, f"{args}: {result.stderr}")
            self.assertIn(message, result.stderr, args)
            # As a run would say it.
            self.assertTrue(result.stderr.startswith("usage error: "), result.stderr)
            self.assertTrue(result.stderr.endswith("\n(see transpose --help)\n"), result.stderr)
        self.cli("--only_check_args", "info")
        self.cli("--only_check_args", "bench", "--shape=2x64x64", "--dtype=uint8", "--count=3")
        # Nothing is opened or written: the input need not exist yet.
        self.cli("--only_check_args", "transpose", f"--in={self.path('later.npy')}",
                 f"--out={self.path('x.npy')}", "--dtype=float64")
        self.assertFalse(os.path.exists(self.path("x.npy")))
        # Shape flags that agree with the file are fine.
        self.cli("transpose", f"--in={self.path('m.npy')}", f"--out={self.path('x.npy')}",
                 "--rows=3", "--cols=4", "--batch=1")
        result = self.cli(f"--tls_ca={self.path('m.npy')}", "health", check=False)
        self.assertEqual(result.returncode, 3)
        self.assertIn(f"--tls_ca: {self.path('m.npy')} holds no PEM certificate", result.stderr)
        result = self.cli("--token_file=" + self.path("missing"), "health", check=False)
        self.assertEqual(result.returncode, 3)
        self.assertIn("--token_file: cannot open", result.stderr)
        # A client sends one token: a server's file with two (one replacing the other) or none is
        # named, not sent as one broken header or silently dropped.
        for contents, message in (("old\nnew\n", " holds 2 tokens; a client sends one"),
                                  ("\n \n", " holds no token"),
                                  ("two words\n", " line 1 holds a character")):
            with open(self.path("tokens"), "w") as f:
                f.write(contents)
            result = self.cli("--token_file=" + self.path("tokens"), "health", check=False)
            self.assertEqual(result.returncode, 3, contents)
            self.assertIn("--token_file: " + self.path("tokens") + message, result.stderr)

    def test_a_token_over_plaintext_is_warned_about(self):
        with open(self.path("token"), "w") as f:
            f.write("secret\n")
        result = self.cli("--token_file=" + self.path("token"), "health")
        self.assertIn("plaintext", result.stderr)
        self.assertNotIn("plaintext", self.cli("health").stderr)
        # A client certificate turns TLS on (with the system's roots): no warning.
        self.make_certificate("client")
        over_tls = self.cli("--token_file=" + self.path("token"), "--deadline=2s",
                            "--tls_cert=" + self.path("client.crt"),
                            "--tls_key=" + self.path("client.key"), "health", check=False)
        self.assertNotIn("plaintext", over_tls.stderr)
        self.assertIn("UNAVAILABLE", over_tls.stderr)  # TLS against this plaintext server.
        self.assertIn("the server does not speak TLS: leave out --tls", over_tls.stderr)

    def test_a_plaintext_call_to_a_tls_server_says_to_use_tls(self):
        # gRPC says only that the socket closed (or was reset).
        self.make_certificate("server")
        server = subprocess.Popen(
            [os.path.join(ARGS.build_dir, "server", "transpose_server"), "--backend=cpu",
             "--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--log_level=error",
             f"--tls_cert={self.path('server.crt')}", f"--tls_key={self.path('server.key')}"],
            stdout=subprocess.PIPE, text=True)
        try:
            listening = server.stdout.readline()
            self.assertTrue(listening.startswith("listening on "), listening)
            target = "127.0.0.1:" + listening.strip().rsplit(":", 1)[1]
            for command, code in (("info", 1), ("health", 3)):
                result = self.cli("--deadline=5s", command, check=False, server=target)
                self.assertEqual(result.returncode, code, result.stderr)
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertRegex(lines[0], r"^error: UNAVAILABLE: .*; if the server serves TLS, "
                                 r"give --tls_ca \(its CA\) or --tls")
        finally:
            server.kill()
            server.wait(timeout=30)
            server.stdout.close()

    def make_certificate(self, name):
        """A self-signed certificate NAME.crt with its key NAME.key, in the test's folder."""
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                        "-keyout", self.path(name + ".key"), "-out", self.path(name + ".crt")],
                       check=True, capture_output=True, timeout=60)

    def test_tls_files_that_cannot_work_are_named_before_any_call(self):
        # gRPC would take them, and fail every call UNAVAILABLE as if the server were out of
        # reach (and the client would retry that).
        self.make_certificate("one")
        self.make_certificate("two")
        for flags, message in (
                ([f"--tls_cert={self.path('one.crt')}", f"--tls_key={self.path('two.key')}"],
                 f"--tls_key: {self.path('two.key')} is not the key of the certificate chain's"),
                ([f"--tls_ca={self.path('one.key')}"],
                 f"--tls_ca: {self.path('one.key')} holds no PEM certificate"),
                ([f"--tls_cert={self.path('one.key')}", f"--tls_key={self.path('one.key')}"],
                 f"--tls_cert: {self.path('one.key')} holds no PEM certificate"),
                ([f"--tls_cert={self.path('one.crt')}", f"--tls_key={self.path('one.crt')}"],
                 f"--tls_key: {self.path('one.crt')} holds no unencrypted PEM private key")):
            for command, code in (("health", 3), ("info", 1)):
                result = self.cli(*flags, command, check=False)
                self.assertEqual(result.returncode, code, f"{flags}: {result.stderr}")
                self.assertIn(message, result.stderr, flags)
                self.assertNotIn("UNAVAILABLE", result.stderr, flags)
        # The pair that matches, with its own certificate as the roots, passes the checks (and
        # then meets this plaintext server).
        result = self.cli(f"--tls_ca={self.path('one.crt')}", f"--tls_cert={self.path('one.crt')}",
                          f"--tls_key={self.path('one.key')}", "--deadline=2s", "info",
                          check=False)
        self.assertIn("UNAVAILABLE", result.stderr)
        # A pipe, which cannot be read twice, is read once.
        piped = subprocess.run([ARGS.cli, f"--server={self.target}", "--token_file=/dev/stdin",
                                "health"], input="secret\n", capture_output=True, text=True,
                               timeout=60)
        self.assertEqual(piped.returncode, 0, piped.stderr)

    def test_empty_arrays_transpose_as_numpy_does(self):
        for shape in ((0, 5), (5, 0), (0, 0), (0, 4, 5), (2, 0, 3)):
            a = np.zeros(shape, np.float32)
            np.save(self.path("e.npy"), a)
            result = self.cli("transpose", f"--in={self.path('e.npy')}",
                              f"--out={self.path('e_t.npy')}")
            self.assertIn("no call to the server", result.stderr)
            expected = np.ascontiguousarray(np.swapaxes(a, -1, -2))
            self.assertTrue(same(np.load(self.path("e_t.npy")), expected), shape)

    def test_out_dev_stdout_writes_to_stdout_as_the_shell_opened_it(self):
        a = random_array(np.int16, (33, 17), np.random.default_rng(7))
        np.save(self.path("s.npy"), a)
        with open(self.path("log"), "wb") as f:
            f.write(b"before\n")
        # `transpose ... --out /dev/stdout >> log`: appended, not the file replaced.
        with open(self.path("log"), "ab") as log:
            result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose",
                                     f"--in={self.path('s.npy')}", "--out=/dev/stdout"],
                                    stdout=log, stderr=subprocess.PIPE, timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.path("log"), "rb") as f:
            self.assertEqual(f.read(), b"before\n" + np.ascontiguousarray(a.T).tobytes())

    def test_dash_is_standard_input_and_output(self):
        a = random_array(np.uint16, (9, 70), np.random.default_rng(8))
        np.save(self.path("p.npy"), a)
        # Written either way; "--in -" as shell tools take it, with no warning from the flag
        # parser that "-" may be a flag (Abseil's "Did you really mean ...").
        for dash_flags in (["--in=-", "--out=-"], ["--in", "-", "--out", "-"]):
            with open(self.path("p.npy"), "rb") as stdin:
                result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose",
                                         *dash_flags], stdin=stdin, capture_output=True,
                                        timeout=600)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertNotIn(b"RAW:", result.stderr, dash_flags)
            self.assertIn(b"written to /dev/stdout", result.stderr, dash_flags)
            self.assertEqual(result.stdout, np.ascontiguousarray(a.T).tobytes())
        self.assertFalse(os.path.exists("-"))

    def test_out_format_overrides_the_name(self):
        a = random_array(np.float32, (6, 11), np.random.default_rng(9))
        np.save(self.path("f.npy"), a)
        expected = np.ascontiguousarray(a.T)
        with open(self.path("f.npy"), "rb") as stdin:
            result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose",
                                     "--in=-", "--out=-", "--out_format=npy"], stdin=stdin,
                                    capture_output=True, timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(same(np.load(io.BytesIO(result.stdout)), expected))
        self.cli("transpose", f"--in={self.path('f.npy')}", f"--out={self.path('g.npy')}",
                 "--out_format=raw")
        with open(self.path("g.npy"), "rb") as f:
            self.assertEqual(f.read(), expected.tobytes())
        wrong = self.cli("transpose", f"--in={self.path('f.npy')}",
                         f"--out={self.path('never.npy')}", "--out_format=csv", check=False)
        self.assertEqual(wrong.returncode, 2, wrong.stderr)
        self.assertIn("--out_format=csv: expected npy or raw", wrong.stderr)
        self.assertFalse(os.path.exists(self.path("never.npy")))

    def test_an_upper_case_npy_suffix_still_writes_npy(self):
        a = random_array(np.int32, (5, 7), np.random.default_rng(5))
        np.save(self.path("a.npy"), a)
        self.cli("transpose", f"--in={self.path('a.npy')}", f"--out={self.path('B.NPY')}")
        self.assertTrue(same(np.load(self.path("B.NPY")), np.ascontiguousarray(a.T)))

    def test_bench_refuses_a_matrix_over_the_server_limit_before_allocating_it(self):
        # 40 GB: more than this machine's memory, and over the server's limit (4 GiB at most).
        result = self.cli("bench", "--count=2", "--shape=100000x100000", check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("matrix of 40000000000 bytes exceeds the server's limit of", result.stderr)
        self.assertIn("RESOURCE_EXHAUSTED", result.stderr)

    def test_an_input_over_the_server_limit_is_refused_before_it_is_read(self):
        # Sparse raw input: 4 GiB + 2 MiB of holes, over the server's limit (4 GiB at most).
        huge = self.path("huge.bin")
        with open(huge, "wb") as f:
            f.truncate((4 << 30) + (2 << 20))
        try:
            result = self.cli("transpose", f"--in={huge}", f"--out={self.path('huge.T')}",
                              "--dtype=uint8", "--rows=65536", "--cols=65568", check=False)
        finally:
            os.unlink(huge)
        self.assertEqual(result.returncode, 1, result.stderr)
        # The CLI's own check, not the server's refusal of an upload already read.
        self.assertIn("uint8 65536x65568: matrix of 4297064448 bytes exceeds the server's limit "
                      f"of {self.matrix_limit} bytes", result.stderr)
        self.assertFalse(os.path.exists(self.path("huge.T")))

    def cli_on_endless_input(self, *args, server=None):
        """Runs the CLI on standard input from an endless pipe of zeros; a CLI that read it to its
        end would never finish (and would fill this machine's memory first)."""
        with subprocess.Popen(["cat", "/dev/zero"], stdout=subprocess.PIPE) as zeros:
            try:
                return subprocess.run([ARGS.cli, f"--server={server or self.target}",
                                       "transpose", "--in=-", *args], stdin=zeros.stdout,
                                      capture_output=True, text=True, timeout=120)
            finally:
                zeros.kill()

    def test_a_piped_input_is_checked_against_its_shape_the_server_and_memory_as_it_is_read(self):
        out = self.path("piped.T")
        # Over the server's limit (4 GiB at most), refused from the shape before the rest is read.
        result = self.cli_on_endless_input(f"--out={out}", "--dtype=uint8", "--rows=65536",
                                           "--cols=65568")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("uint8 65536x65568: matrix of 4297064448 bytes exceeds the server's limit "
                      f"of {self.matrix_limit} bytes", result.stderr)
        # The same from a .npy header.
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "|u1", "fortran_order": False, "shape": (65536, 65568)})
        with subprocess.Popen(["sh", "-c", "cat; exec cat /dev/zero"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) as zeros:
            try:
                zeros.stdin.write(header.getvalue())
                zeros.stdin.close()
                result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose",
                                         "--in=-", f"--out={out}"], stdin=zeros.stdout,
                                        capture_output=True, text=True, timeout=120)
            finally:
                zeros.kill()
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("matrix of 4297064448 bytes exceeds the server's limit", result.stderr)
        # Under the limit but longer than its shape: read one byte past the shape, no further.
        result = self.cli_on_endless_input(f"--out={out}", "--dtype=uint8", "--rows=8192",
                                           "--cols=8193")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("/dev/stdin holds more than 67117056 bytes; uint8 8192x8193 needs 67117056",
                      result.stderr)
        # More than this machine's memory (1 TiB), with no server to ask.
        result = self.cli_on_endless_input(f"--out={out}", "--dtype=uint8", "--rows=1048576",
                                           "--cols=1048576", server=refused_address(self))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"/dev/stdin holds uint8 1048576x1048576, 1099511627776 "
                                        r"bytes; with its result and the \d+ bytes a call needs "
                                        r"that is more than the")
        self.assertFalse(os.path.exists(out))

    def test_a_hung_server_holds_a_large_input_for_its_deadline_and_5_s_more_at_most(self):
        # Past 64 MiB (sparse), so that the CLI asks the server's limit before the transfer: that
        # check waits 5 s at most, not the --deadline meant for the transfer.
        big = self.path("hung.bin")
        with open(big, "wb") as f:
            f.truncate(80 << 20)
        start = time.monotonic()
        result = self.cli("transpose", f"--in={big}", f"--out={self.path('hung.T')}",
                          "--dtype=uint8", "--rows=8192", "--cols=10240", "--deadline=10s",
                          check=False, server=silent_address(self))
        elapsed = time.monotonic() - start
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("DEADLINE_EXCEEDED", result.stderr)
        self.assertGreaterEqual(elapsed, 10, result.stderr)
        self.assertLess(elapsed, 19, result.stderr)  # 20 s with the check waiting 10 s.
        self.assertFalse(os.path.exists(self.path("hung.T")))

    def transpose_under_address_space_limit(self, src, out, limit, server):
        """Runs `transpose` from `src` to `out` under ulimit -v `limit`; fails the test if it
        has not ended in 60 s."""
        return self.cli_under_address_space_limit(limit, f"--server={server}", "transpose",
                                                  f"--in={src}", f"--out={out}")

    def cli_under_address_space_limit(self, limit, *args):
        """Runs the CLI with `args` under ulimit -v `limit`; fails the test if it has not ended
        in 60 s."""
        skip_where_address_sanitized(self, ARGS.cli)
        try:
            return subprocess.run([ARGS.cli, *args], preexec_fn=address_space_limiter(limit),
                                  capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.fail(f"{' '.join(args)} under ulimit -v {limit >> 10} hung")

    def transpose_sparse_float32_under_address_space_limit(self, rows, cols, limit,
                                                            server=None):
        """Runs `transpose` on a sparse float32 rows x cols .npy file under ulimit -v `limit`,
        against `server` (by default an address that refuses connections), and returns how much
        memory the CLI said it had left, or fails the test."""
        src, out = self.path("sparse.npy"), self.path("sparse.T.npy")
        with open(src, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)})
            f.truncate(f.tell() + rows * cols * 4)
        try:
            result = self.transpose_under_address_space_limit(
                src, out, limit, server or refused_address(self))
        finally:
            os.unlink(src)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("RESOURCE_EXHAUSTED", result.stderr)
        self.assertFalse(os.path.exists(out))
        left = re.search(rf"holds float32 {rows}x{cols}, {rows * cols * 4 + 128} bytes; with its "
                         r"result and the \d+ bytes a call needs that is more than the (\d+) bytes "
                         r"of memory this process may still take", result.stderr)
        self.assertIsNotNone(left, result.stderr)
        return int(left.group(1))

    def test_an_input_over_the_memory_this_process_may_use_is_refused_before_it_is_read(self):
        # 6.4 GB, which with its result fits this machine (24 GiB) but not an address space of
        # 8 GiB (ulimit -v, as a container's memory limit would bind).
        limit = 8 << 30
        self.assertLess(
            self.transpose_sparse_float32_under_address_space_limit(40000, 40000, limit), limit)

    def test_the_memory_check_counts_the_address_space_the_process_holds(self):
        # 324 MB with its result, 648 MB, fits under 700 MiB of address space, but not with what
        # the CLI maps already (its libraries, gRPC's thread stacks) and what a call needs: the
        # check must refuse it up front rather than fail as it allocates.
        self.assertLess(
            self.transpose_sparse_float32_under_address_space_limit(9000, 9000, 700 << 20),
            2 * 9000 * 9000 * 4)

    def test_a_large_fortran_order_input_needs_only_its_own_memory(self):
        # A Fortran-order file holds its transpose already: 120 MB fits 300 MiB of address space
        # alone, and it was refused as if it needed its result and a call's 128 MiB too. No
        # server is asked (the address refuses connections).
        rows, cols = 6000, 5000
        src, out = self.path("fortran.npy"), self.path("fortran.T.npy")
        with open(src, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": True, "shape": (rows, cols)})
            data_offset = f.tell()
            f.truncate(data_offset + rows * cols * 4)
            # Element (r, c) lies at r + rows * c: a few that are not zero.
            marked = [(0, 1, 1.5), (rows - 1, 0, 2.5), (17, cols - 1, -3.0), (rows - 1, cols - 1, 4.0)]
            for r, c, value in marked:
                f.seek(data_offset + 4 * (r + rows * c))
                f.write(np.float32(value).tobytes())
        try:
            result = self.transpose_under_address_space_limit(src, out, 300 << 20,
                                                              refused_address(self))
        finally:
            os.unlink(src)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("Fortran order: the file holds the transpose already", result.stderr)
        transposed = np.load(out, mmap_mode="r")
        self.assertEqual(transposed.shape, (cols, rows))
        for r, c, value in marked:
            self.assertEqual(transposed[c, r], value)
        self.assertEqual(transposed[1, 1], 0)
        del transposed
        os.unlink(out)

    def test_under_a_tight_address_space_info_and_health_say_so_rather_than_hang(self):
        # gRPC short of a thread's stack never finished the call: both hung at 40 to 100 MiB.
        message = (r"^error: this process may take \d+ more bytes of memory .*, less than the "
                   r"\d+ bytes a call needs")
        for limit in [mb << 20 for mb in (40, 60, 80)]:
            result = self.cli_under_address_space_limit(limit, f"--server={self.target}", "info")
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertRegex(result.stderr, message)
            result = self.cli_under_address_space_limit(limit, f"--server={self.target}",
                                                        "health")
            self.assertEqual(result.returncode, 3, result.stderr)  # Unknown.
            self.assertRegex(result.stderr, message)
        result = self.cli_under_address_space_limit(300 << 20, f"--server={self.target}", "info")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("admission:", result.stdout)

    def test_a_large_input_under_a_tight_address_space_is_refused_without_connecting(self):
        # 120 MB, past the 64 MiB from which the header is checked first. Where not even a call's
        # memory is left, the CLI must not connect to ask the server's limit: at 60 MiB gRPC,
        # short of a thread, hung at exit after the refusal. The server here is a listening
        # socket, whose backlog shows any connection made.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        self.addCleanup(listener.close)
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        for limit in [mb << 20 for mb in (40, 60, 80)]:
            self.assertLess(self.transpose_sparse_float32_under_address_space_limit(
                6000, 5000, limit, address), limit)
            with self.assertRaises(BlockingIOError, msg=f"connected under {limit >> 20} MiB"):
                listener.accept()[0].close()

    def test_under_a_tight_address_space_the_cli_transposes_or_says_it_is_out_of_memory(self):
        # gRPC 1.51 hangs or crashes when it runs out of memory itself (for a thread's stack or a
        # buffer), and hangs at exit once one of its threads failed to start. Under limits from
        # far too tight to enough, every run must end with the transpose written, or at once
        # with a message: a 64 MB matrix, and a file whose header promises 64 MB it lacks.
        rng = np.random.default_rng(12)
        a = random_array(np.float32, (4000, 4000), rng)
        full, short, out = self.path("tight.npy"), self.path("tight_short.npy"), self.path("o.npy")
        np.save(full, a)
        with open(full, "rb") as f, open(short, "wb") as g:
            g.write(f.read(1000))
        written = 0
        for limit in [mb << 20 for mb in (60, 100, 150, 180, 200, 220, 250, 300, 400, 700)]:
            result = self.transpose_under_address_space_limit(short, out, limit, self.target)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn("not a usable .npy file", result.stderr)
            result = self.transpose_under_address_space_limit(full, out, limit, self.target)
            if result.returncode == 0:
                np.testing.assert_array_equal(np.load(out), a.T)
                os.unlink(out)
                written += 1
            else:
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertRegex(result.stderr, r"^error: .*memory")
                self.assertNotIn("RESOURCE_EXHAUSTED", result.stderr)
        # The largest limits leave room for the call, the smallest do not.
        self.assertGreater(written, 0)
        self.assertLess(written, 10)

    def test_under_a_tight_address_space_bench_runs_or_says_it_is_out_of_memory(self):
        # Two 100 MB buffers (the input, one result), what the calls need and what the CLI maps
        # (some 100 MB with gRPC's threads) exceed 300 MiB: refused before they are allocated,
        # without a status code that would read as the server's. Small matrices fit.
        limit = 300 << 20
        result = self.cli_under_address_space_limit(
            limit, f"--server={self.target}", "bench", "--shape=5000x5000", "--count=1")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"^error: 2 buffers of 100000000 bytes .* exceed the \d+ "
                                        r"bytes of memory this process may still take")
        # A call's memory grows by a thread stack (8 MiB here) a core past 2.
        roomy = limit + max(0, os.cpu_count() - 2) * (8 << 20)
        result = self.cli_under_address_space_limit(
            roomy, f"--server={self.target}", "bench", "--shape=64x64", "--count=3")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("3 ok, 0 errors", result.stdout)
        # Once connected, what gRPC has mapped is part of a call's memory, not more on top: counted
        # twice, this was refused up to 250 MiB with 2 cores (it runs from 190 MiB). A call's
        # memory grows with the cores, and so would these figures.
        if os.cpu_count() <= 2:
            result = self.cli_under_address_space_limit(
                220 << 20, f"--server={self.target}", "bench", "--shape=64x64", "--count=3")
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("3 ok, 0 errors", result.stdout)
        # Each worker's stack (8 MiB under ulimit -s 8192) counts: 32 of them aborted the CLI
        # with std::system_error when only the buffers did.
        result = self.cli_under_address_space_limit(
            limit, f"--server={self.target}", "bench", "--shape=64x64", "--count=50",
            "--concurrency=32")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"^error: 33 buffers of 16384 bytes .*, 32 worker threads' "
                                        r"stacks of \d+ bytes and the \d+ bytes the calls "
                                        r"need exceed the \d+ bytes")
        # Below what the calls alone need, refused before any thread starts: at 40 MiB Ctrl-C's
        # watcher could not start, and at 60 and 80 MiB gRPC hung at exit.
        for limit in [mb << 20 for mb in (40, 60, 80)]:
            result = self.cli_under_address_space_limit(
                limit, f"--server={self.target}", "bench", "--shape=64x64", "--count=3")
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertRegex(result.stderr, r"^error: 2 buffers of 16384 bytes .* and the "
                                            r"\d+ bytes the calls need exceed the \d+ bytes")

    def test_a_large_piped_input_transposes_and_a_short_one_is_named(self):
        rng = np.random.default_rng(8)
        # Past the 64 MiB the CLI reads before it checks a pipe's shape.
        a = random_array(np.uint8, (3, 4100, 5500), rng)
        src = self.path("big_pipe.npy")
        np.save(src, a)
        out = self.path("big_pipe.T.npy")
        with open(src, "rb") as stdin:
            result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose", "--in=-",
                                     f"--out={out}"], stdin=stdin, capture_output=True, text=True,
                                    timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(same(np.load(out), np.transpose(a, (0, 2, 1))))
        # The same file cut short.
        with subprocess.Popen(["head", "-c", str(os.path.getsize(src) - 1), src],
                              stdout=subprocess.PIPE) as short:
            result = subprocess.run([ARGS.cli, f"--server={self.target}", "transpose", "--in=-",
                                     f"--out={self.path('short.T.npy')}"], stdin=short.stdout,
                                    capture_output=True, text=True, timeout=600)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("/dev/stdin holds %d bytes; uint8 3x4100x5500 needs %d"
                      % (os.path.getsize(src) - 1, os.path.getsize(src)), result.stderr)
        self.assertFalse(os.path.exists(self.path("short.T.npy")))

    def test_ctrl_c_ends_a_bench_early_with_its_report(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            started = time.time()
            # Retries: at some 5600 calls a second, a server short of CPU (beside other tests)
            # once let its finished calls go late enough to refuse two as busy (256 in flight),
            # which a bench of one attempt counts as errors.
            bench = subprocess.Popen(
                [ARGS.cli, f"--server={self.target}", "bench", "--duration=300s",
                 "--concurrency=2", "--shape=64x64", "--attempts=4"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                self.assertIn("Ctrl-C stops it early", bench.stderr.readline())
                time.sleep(1)  # Requests of a millisecond or two finish meanwhile.
                bench.send_signal(sig)
                out, err = bench.communicate(timeout=60)
            finally:
                bench.kill()
                bench.wait()
            self.assertEqual(bench.returncode, 128 + sig, err + out)
            self.assertLess(time.time() - started, 60)  # Not the 300 s asked for.
            self.assertRegex(out, r": [1-9]\d* ok, 0 errors in [\d.]+ s, stopped early "
                                  r"\([0-2] cut short\)")
            self.assertIn("p99", out)

    def test_bench_says_when_no_request_succeeded(self):
        if "naive" in self.cli("info").stdout:
            self.skipTest("the server has the classic kernels (a GPU backend)")
        result = self.cli("bench", "--count=2", "--shape=8x8", "--algorithm=naive", check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("0 ok, 2 errors", result.stdout)
        # A server refusing every call is not hammered in a loop: failures in a row back off
        # (10 ms doubling to 1 s), so 2 s of them are a handful, not thousands.
        result = self.cli("bench", "--duration=2s", "--concurrency=2", "--shape=8x8",
                          "--algorithm=naive", check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        errors = int(re.search(r"0 ok, (\d+) errors", result.stdout).group(1))
        self.assertGreater(errors, 2)
        self.assertLess(errors, 40)
        self.assertIn("no request succeeded", result.stdout)
        self.assertNotIn("GB/s", result.stdout)

    def test_version(self):
        result = subprocess.run([ARGS.cli, "--version"], capture_output=True, text=True,
                                timeout=60)
        self.assertRegex(result.stdout, r"^transpose \d+\.\d+")


class ServerUnderAddressSpaceLimitTest(unittest.TestCase):
    """The server under ulimit -v (as some containers and batch systems set; a container's memory
    limit binds the same way, by killing the process): it fits its admission budget to the memory
    it may use at start-up, so that a load that memory cannot hold is refused rather than crashing
    it. Before, eight 64 MB calls at once crashed it (SIGSEGV in gRPC's allocator) under 800 to
    1200 MiB (and 600 MiB in one of two sweeps)."""

    def setUp(self):
        self.server_binary = os.path.join(ARGS.build_dir, "server", "transpose_server")
        skip_where_address_sanitized(self, self.server_binary)
        import resource
        if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
            self.skipTest("a hard ulimit -v may not leave room for the test's")
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        # What the server reserves for its threads (their stacks count whole under ulimit -v)
        # and gRPC, as it says at start under a limit that holds its defaults' worst case.
        server, line, log_path = self.start_server(64 << 30)
        server.kill()
        server.wait(timeout=60)
        with open(log_path) as f:
            log = f.read()
        reserve = re.search(r"\((\d+) of them for its threads and gRPC\)", log)
        self.assertIsNotNone(reserve, log)
        self.reserve = int(reserve.group(1))

    def start_server(self, limit, metrics_address=""):
        """Starts the server on the CPU under ulimit -v `limit`; returns it, its first line of
        output (empty if it exits first, and the test fails if neither comes within 60 s) and its
        log's path."""
        log_path = os.path.join(self.tmp.name, "server.log")
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [self.server_binary, "--backend=cpu", "--address=127.0.0.1:0",
                 f"--metrics_address={metrics_address}"], stdout=subprocess.PIPE, stderr=log,
                text=True, preexec_fn=address_space_limiter(limit))

        def stop():
            server.kill()
            server.communicate(timeout=60)
        self.addCleanup(stop)
        ready, _, _ = select.select([server.stdout], [], [], 60)
        if not ready:
            self.fail(f"the server under ulimit -v {limit >> 10} neither listened nor exited")
        return server, server.stdout.readline(), log_path

    def cli(self, target, *args):
        return subprocess.run([ARGS.cli, f"--server={target}", *args], capture_output=True,
                              text=True, timeout=300)

    def test_a_load_its_memory_cannot_hold_is_refused_not_a_crash(self):
        server, line, log_path = self.start_server(self.reserve + (500 << 20))
        with open(log_path) as f:
            log = f.read()
        self.assertTrue(line.startswith("listening on "), line + log)
        target = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        lowered = re.search(r"WARNING host memory: the limits the flags set would let this "
                            r"server hold up to \d+ bytes \(\d+ of them for its threads and gRPC\), "
                            r"more than the \d+ it may take "
                            r"\(.*\): lowered --max_inflight_bytes to (\d+)", log)
        self.assertIsNotNone(lowered, log)
        budget = int(lowered.group(1))
        self.assertGreaterEqual(budget, 16 << 20)
        self.assertLess(budget, 4 * (64 << 20))

        # Eight 64 MB calls at once, more than the budget.
        result = self.cli(target, "bench", "--concurrency=8", "--count=16",
                          "--shape=4096x4096", "--attempts=1")
        self.assertIsNone(server.poll(), result.stdout + result.stderr)
        self.assertIn("first error: RESOURCE_EXHAUSTED: ", result.stdout)
        self.assertNotIn("UNAVAILABLE", result.stdout + result.stderr)

        # A matrix over the budget is refused before it is sent; one within it is transposed.
        over = np.zeros((budget // 4096 + 1, 1024), np.float32)
        np.save(os.path.join(self.tmp.name, "over.npy"), over)
        result = self.cli(target, "transpose", f"--in={self.tmp.name}/over.npy",
                          f"--out={self.tmp.name}/over.T.npy")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"matrix of {over.nbytes} bytes exceeds the server's limit of {budget} "
                      "bytes", result.stderr)
        a = random_array(np.float32, (1000, 777), np.random.default_rng(11))
        np.save(os.path.join(self.tmp.name, "a.npy"), a)
        result = self.cli(target, "transpose", f"--in={self.tmp.name}/a.npy",
                          f"--out={self.tmp.name}/a.T.npy")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(same(np.load(os.path.join(self.tmp.name, "a.T.npy")),
                             np.ascontiguousarray(a.T)))
        self.assertIsNone(server.poll())

    def budget_under(self, limit, metrics_address):
        """The admission budget the server fits to ulimit -v `limit`, from its start-up warning."""
        server, line, log_path = self.start_server(limit, metrics_address)
        with open(log_path) as f:
            log = f.read()
        self.assertTrue(line.startswith("listening on "), line + log)
        server.kill()
        server.wait(timeout=60)
        lowered = re.search(r"lowered --max_inflight_bytes to (\d+)", log)
        self.assertIsNotNone(lowered, log)
        return int(lowered.group(1))

    def test_metrics_cost_the_budget_only_what_their_threads_map(self):
        """/metrics' 64 threads take the stacks CivetWeb gives them (Debian's build: 100 KiB, 6.4
        MiB in all), not the 8 MiB of a default thread each, which the server once counted: 512
        MiB of the limit, 82 MiB of the budget under this one."""
        limit = self.reserve + (1500 << 20)
        without = self.budget_under(limit, "")
        with_metrics = self.budget_under(limit, "127.0.0.1:0")
        self.assertLessEqual(with_metrics, without + (2 << 20))  # Two start-ups' mappings vary.
        self.assertGreater(with_metrics, without - (16 << 20),
                           f"/metrics took {(without - with_metrics) >> 20} MiB of the budget")

    def test_memory_that_cannot_hold_a_budget_is_refused_at_start(self):
        server, line, log_path = self.start_server(self.reserve + (60 << 20))
        self.assertEqual(line, "")
        self.assertEqual(server.wait(timeout=60), 1)
        with open(log_path) as f:
            log = f.read()
        self.assertRegex(log, r"ERROR host memory: the \d+ bytes of memory this server may still "
                              r"take cannot hold even 1048576 bytes of matrices")
        self.assertIn("give it more memory", log)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--build_dir", default="build")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
