#!/usr/bin/env python3
"""The Python example client (examples/python/transpose_client.py) against the real server:
results equal NumPy's for every dtype NumPy has and for batches, odd layouts and multi-chunk
transfers both ways; a busy server's refusal is sent again, a final one is not; tokens; its CLI.

Usage: python_client_test.py --repo REPO --server PATH_TO_transpose_server
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc
import numpy as np

ARGS = None
transpose_client = None  # Imported in main, once the repository's path is known.


def start_server(*flags, metrics=False):
    """The server on a free loopback port, and its address (and its metrics URL)."""
    server = subprocess.Popen(
        [ARGS.server, "--backend=cpu", "--address=127.0.0.1:0",
         "--metrics_address=" + ("127.0.0.1:0" if metrics else ""), "--log_level=error", *flags],
        stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    if not line.startswith("listening on "):
        server.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    target = "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
    if not metrics:
        return server, target
    line = server.stdout.readline()
    return server, target, "http://" + line.strip().rsplit(" ", 1)[1] + "/metrics"


def metric(url, sample):
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def await_metric(url, sample, at_least, timeout=30):
    deadline = time.time() + timeout
    while metric(url, sample) < at_least:
        if time.time() > deadline:
            raise AssertionError(f"{sample} stayed under {at_least}")
        time.sleep(0.01)


def stop_server(server):
    server.kill()
    server.wait(timeout=30)
    server.stdout.close()


def random_array(dtype, shape, rng):
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def expected(array):
    return np.ascontiguousarray(np.swapaxes(array, -1, -2))


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Small response chunks, so that a few MiB come back in many messages.
        cls.server, cls.target = start_server("--response_chunk_bytes=65536")
        cls.client = transpose_client.Client(cls.target)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        stop_server(cls.server)

    def assertSameBytes(self, actual, wanted):
        self.assertEqual(actual.shape, wanted.shape)
        self.assertEqual(actual.dtype, wanted.dtype)
        # Bytewise: random float bits hold NaNs, which compare unequal as floats.
        self.assertEqual(actual.tobytes(), wanted.tobytes())

    def cli(self, *arguments, server=None, **options):
        """The example's command line, against this suite's server unless `server`."""
        return subprocess.run(
            [sys.executable, ARGS.client, f"--server={server or self.target}", *arguments],
            capture_output=True, text=True, timeout=120, **options)

    def cli_transposes_a_file_of(self, array, tmp):
        """The command line's run from a.npy holding `array` to b.npy in `tmp`, checked."""
        source, target = os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy")
        np.save(source, array)
        run = self.cli(source, target)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertSameBytes(np.load(target), expected(array))
        return run

    def test_every_dtype_and_shape(self):
        rng = np.random.default_rng(7)
        for dtype in transpose_client.DATA_TYPES:
            for shape in ((1, 1), (1, 7), (7, 1), (31, 33), (3, 65, 129)):
                with self.subTest(dtype=str(dtype), shape=shape):
                    array = random_array(dtype, shape, rng)
                    result = self.client.transpose(array)
                    self.assertSameBytes(result.array, expected(array))
                    self.assertEqual(result.stats.backend, "cpu")
                    self.assertEqual(result.attempts, 1)

    def test_bfloat16_goes_as_two_byte_void_as_in_the_cpp_clis_npy_files(self):
        array = random_array(np.dtype("V2"), (3, 40, 27), np.random.default_rng(8))
        result = self.client.transpose(array)
        self.assertSameBytes(result.array, expected(array))
        # Structured 2-byte types are not bfloat16.
        with self.assertRaises(ValueError):
            self.client.transpose(np.zeros((2, 2), [("a", "u1"), ("b", "u1")]))
        with tempfile.TemporaryDirectory() as tmp:
            self.cli_transposes_a_file_of(array, tmp)

    def test_a_matrix_of_many_chunks_each_way_reports_its_progress(self):
        array = random_array(np.float64, (1000, 700), np.random.default_rng(1))  # 5.3 MiB.
        progress = []
        result = self.client.transpose(array, on_progress=lambda *p: progress.append(p))
        self.assertSameBytes(result.array, expected(array))
        total = array.nbytes
        self.assertEqual(progress[-1], (total, total, total, 1))
        sent = [p[0] for p in progress]
        received = [p[1] for p in progress]
        self.assertEqual(sent, sorted(sent))
        self.assertEqual(received, sorted(received))
        # 1 MiB up, 64 KiB back: six reports of the upload, 86 of the result.
        self.assertEqual(len(set(sent)), 6)
        self.assertEqual(len(set(received) - {0}), -(-total // 65536))
        self.assertGreater(result.stats.kernel_seconds, 0)

    def test_views_and_big_endian_arrays_are_sent_as_their_values(self):
        rng = np.random.default_rng(3)
        base = rng.standard_normal((64, 90)).astype(np.float32)
        for array in (base[::2, 1::3], base.T, base.astype(">f4"), base[:, :, None][:, :, 0]):
            with self.subTest(shape=array.shape, dtype=str(array.dtype)):
                result = self.client.transpose(array)
                np.testing.assert_array_equal(result.array, np.ascontiguousarray(array.T))

    def test_arrays_the_api_cannot_carry_are_refused_before_sending(self):
        for array in (np.zeros(5, np.float32), np.zeros((2, 2, 2, 2), np.float32),
                      np.zeros((0, 4), np.float32), np.zeros((2, 0, 2), np.int8),
                      np.zeros((2, 2), np.bool_), np.zeros((2, 2), object)):
            with self.subTest(shape=array.shape, dtype=str(array.dtype)):
                with self.assertRaises(ValueError):
                    self.client.transpose(array)

    def test_a_busy_server_is_asked_again_and_a_final_refusal_is_not(self):
        server, target, metrics = start_server("--max_inflight_requests=1",
                                               "--max_matrix_bytes=1048576", metrics=True)
        try:
            channel = grpc.insecure_channel(target)
            stub = transpose_client.pb_grpc.TransposeServiceStub(channel)
            release = threading.Event()

            def header_only():
                yield transpose_client.pb.TransposeRequest(
                    dtype=transpose_client.pb.DATA_TYPE_FLOAT32,
                    shape=transpose_client.pb.MatrixShape(rows=8, cols=8))
                release.wait()

            # An upload that holds the server's one request slot until released, once the
            # client's first attempt has been refused.
            held = stub.TransposeStream(header_only(), timeout=60)
            await_metric(metrics, "transpose_admitted_requests", 1)
            array = np.arange(12, dtype=np.int32).reshape(3, 4)
            refusals = ('transpose_requests_total{code="RESOURCE_EXHAUSTED",'
                        'method="TransposeStream"}')

            def release_once_refused():
                try:
                    await_metric(metrics, refusals, 1)
                finally:
                    release.set()

            with transpose_client.Client(target) as client:
                threading.Thread(target=release_once_refused).start()
                result = client.transpose(array)
                self.assertGreaterEqual(result.attempts, 2)
                np.testing.assert_array_equal(result.array, array.T)
                # Over --max_matrix_bytes: final, one attempt.
                with self.assertRaises(transpose_client.TransposeError) as refused:
                    client.transpose(np.zeros((1024, 512), np.float32))
                self.assertEqual(refused.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertFalse(refused.exception.retryable)
                self.assertEqual(refused.exception.attempts, 1)
                self.assertIn("[request ", refused.exception.message)
        finally:
            release.set()
            held.cancel()
            channel.close()
            stop_server(server)

    def test_a_call_reset_by_the_transport_quota_is_sent_again(self):
        # The client's upload pauses after its first chunk while a 256 MiB message on another
        # connection uses up the server's 64 MiB transport quota; gRPC's reclaimer resets the
        # client's stream first (its connection's stream came first) and then the hog's.
        server, target = start_server("--max_message_bytes=1048576", "--max_inflight_bytes=33554432",
                                      "--max_transport_bytes=67108864")
        try:
            hog_done = threading.Event()
            attempts = []

            def pause_first_attempt(sent, received, total, attempt):
                attempts.append(attempt)
                if attempt == 1 and len(attempts) == 1:
                    threading.Thread(target=hog, daemon=True).start()
                    hog_done.wait(60)

            def hog():
                try:
                    with grpc.insecure_channel(
                            target, [("grpc.max_send_message_length", -1)]) as channel:
                        stub = transpose_client.pb_grpc.TransposeServiceStub(channel)
                        request = transpose_client.pb.TransposeRequest(
                            dtype=transpose_client.pb.DATA_TYPE_UINT8,
                            shape=transpose_client.pb.MatrixShape(rows=16384, cols=16384),
                            data=bytes(256 << 20))
                        try:
                            stub.Transpose(request, timeout=60)
                        except grpc.RpcError as error:
                            self.hog_error = error
                finally:
                    hog_done.set()

            self.hog_error = None
            array = random_array(np.float32, (2048, 1024), np.random.default_rng(9))  # 8 MiB.
            with transpose_client.Client(target) as client:
                result = client.transpose(array, on_progress=pause_first_attempt)
            self.assertIsNotNone(self.hog_error)
            self.assertEqual(self.hog_error.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("RST_STREAM with error code 11", self.hog_error.details())
            self.assertEqual(result.attempts, 2)
            self.assertSameBytes(result.array, expected(array))
        finally:
            stop_server(server)

    def test_an_exception_from_the_progress_callback_ends_the_call(self):
        class Stop(Exception):
            pass

        def stop(sent, received, total, attempt):
            if (sent if stage == "upload" else received) > 0:
                raise Stop()

        array = np.ones((1024, 600), np.float32)  # 2.3 MiB: three chunks up.
        for stage in ("upload", "result"):
            with self.subTest(stage=stage):
                with self.assertRaises(Stop):
                    self.client.transpose(array, on_progress=stop)
        # The client goes on.
        np.testing.assert_array_equal(self.client.transpose(array).array, array.T)

    def test_tokens(self):
        with tempfile.TemporaryDirectory() as tmp:
            tokens = os.path.join(tmp, "tokens")
            with open(tokens, "w") as f:
                f.write("python-client-token\n")
            server, target = start_server(f"--auth_token_file={tokens}")
            try:
                array = np.eye(3, 5, dtype=np.float32)
                with transpose_client.Client(target, token="python-client-token") as client:
                    np.testing.assert_array_equal(client.transpose(array).array, array.T)
                with transpose_client.Client(target, token="wrong") as client:
                    with self.assertRaises(transpose_client.TransposeError) as refused:
                        client.transpose(array)
                    self.assertEqual(refused.exception.code, grpc.StatusCode.UNAUTHENTICATED)
                    self.assertFalse(refused.exception.retryable)
            finally:
                stop_server(server)

    def test_calls_spread_over_every_address_of_the_target(self):
        servers = [start_server(metrics=True) for _ in range(3)]
        served = lambda: [
            metric(url, 'transpose_requests_total{code="OK",method="TransposeStream"}')
            for _, _, url in servers]
        try:
            target = "ipv4:" + ",".join(address for _, address, _ in servers)
            array = np.arange(16 * 24, dtype=np.float32).reshape(16, 24)
            with transpose_client.Client(target) as client:
                # round_robin takes the connections that are up; the first calls may come
                # before all three are.
                for _ in range(200):
                    np.testing.assert_array_equal(client.transpose(array).array, array.T)
                    if min(served()) > 0:
                        break
                before = served()
                self.assertGreater(min(before), 0, before)
                for _ in range(30):
                    np.testing.assert_array_equal(client.transpose(array).array, array.T)
            after = served()
            self.assertEqual(sum(after) - sum(before), 30)
            for earlier, later in zip(before, after):
                self.assertGreaterEqual(later - earlier, 8, (before, after))
        finally:
            for server, _, _ in servers:
                stop_server(server)

    def test_stubs_are_cached_only_where_no_other_user_could_change_them(self):
        def import_client(cache_home):
            """The client imported in a new process with this cache folder: what it said, and
            its stubs' folder."""
            run = subprocess.run(
                [sys.executable, "-c",
                 "import transpose_client as t; print(t.pb.ServerInfo.DESCRIPTOR.full_name); "
                 "print(t.pb.__file__)"],
                env=dict(os.environ, PYTHONPATH=os.path.dirname(ARGS.client),
                         XDG_CACHE_HOME=cache_home),
                capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr)
            name, stubs = run.stdout.split()
            self.assertEqual(name, "transpose.v1.ServerInfo")
            return run.stderr, os.path.dirname(os.path.dirname(os.path.dirname(stubs)))

        with tempfile.TemporaryDirectory() as tmp:
            # Cached, and found there again.
            warned, cache = import_client(os.path.join(tmp, "own"))
            self.assertEqual(warned, "")
            self.assertEqual(os.path.dirname(cache), os.path.join(tmp, "own", "transpose-stubs"))
            self.assertEqual(import_client(os.path.join(tmp, "own")), ("", cache))
            key = os.path.basename(cache)

            # What another user could leave where the stubs would be cached: modules with the
            # stubs' names, in a cache folder anyone may write to, or in a key folder anyone may
            # write to, or behind a link to a folder of theirs.
            marker = os.path.join(tmp, "ran")

            def plant(folder):
                modules = os.path.join(folder, "transpose", "v1")
                os.makedirs(modules)
                for module in ("__init__.py", "transpose_pb2.py", "transpose_pb2_grpc.py"):
                    with open(os.path.join(modules, module), "w") as f:
                        f.write(f"open({marker!r}, 'w').close()\n")
                open(os.path.join(folder, "transpose", "__init__.py"), "w").close()

            shared = os.path.join(tmp, "shared", "transpose-stubs")
            os.makedirs(shared)
            os.chmod(shared, 0o777)
            plant(os.path.join(shared, key))
            open_key = os.path.join(tmp, "open-key", "transpose-stubs", key)
            plant(open_key)
            os.chmod(open_key, 0o777)
            linked = os.path.join(tmp, "linked", "transpose-stubs")
            os.makedirs(linked, 0o700)
            plant(os.path.join(tmp, "theirs"))
            os.symlink(os.path.join(tmp, "theirs"), os.path.join(linked, key))
            for home in ("shared", "open-key", "linked"):
                with self.subTest(home=home):
                    warned, stubs = import_client(os.path.join(tmp, home))
                    self.assertIn("is not this user's alone", warned)
                    self.assertFalse(stubs.startswith(tmp), stubs)
                    self.assertFalse(os.path.exists(marker))
                    self.assertFalse(os.path.exists(stubs), "the private stubs outlived it")

    def test_the_command_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            array = random_array(np.complex64, (2, 30, 17), np.random.default_rng(5))
            run = self.cli_transposes_a_file_of(array, tmp)
            self.assertIn("(2, 30, 17)", run.stdout)
            # A server out of reach: an error line and exit 1, after its attempts.
            refused = socket.socket()  # Bound and never listening: connections are refused.
            refused.bind(("127.0.0.1", 0))
            self.addCleanup(refused.close)
            run = self.cli("--attempts=2", os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy"),
                           server="127.0.0.1:%d" % refused.getsockname()[1])
            self.assertEqual(run.returncode, 1)
            self.assertIn("error: UNAVAILABLE", run.stderr)

    def test_the_command_line_writes_the_path_it_is_given_or_reports_what_stops_it(self):
        cli = self.cli
        with tempfile.TemporaryDirectory() as tmp:
            array = random_array(np.int16, (7, 9), np.random.default_rng(6))
            source = os.path.join(tmp, "a.npy")
            np.save(source, array)
            # Exactly the path given (NumPy's save would add ".npy"), and nothing beside it.
            target = os.path.join(tmp, "result")
            run = cli(source, target)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertSameBytes(np.load(target), expected(array))
            self.assertEqual(sorted(os.listdir(tmp)), ["a.npy", "result"])

            def refused(run, *words):
                self.assertEqual(run.returncode, 1, run.stdout)
                self.assertTrue(run.stderr.startswith("error: "), run.stderr)
                self.assertNotIn("Traceback", run.stderr)
                for word in words:
                    self.assertIn(word, run.stderr)

            np.save(os.path.join(tmp, "vector.npy"), np.arange(5))
            refused(cli(os.path.join(tmp, "vector.npy"), target), "shape (5,)")
            # Not .npy files: an .npz archive (np.load would give an NpzFile), raw bytes, and an
            # object array (np.load blames pickling), each named.
            with open(os.path.join(tmp, "archive.npy"), "wb") as f:
                np.savez(f, x=array)
            refused(cli(os.path.join(tmp, "archive.npy"), target), "archive.npy: not a .npy file")
            with open(os.path.join(tmp, "raw.npy"), "wb") as f:
                f.write(array.tobytes())
            refused(cli(os.path.join(tmp, "raw.npy"), target), "raw.npy: not a .npy file")
            np.save(os.path.join(tmp, "objects.npy"), np.array([[1, "a"]], dtype=object))
            refused(cli(os.path.join(tmp, "objects.npy"), target), "objects.npy: ")
            for name in ("archive.npy", "raw.npy", "objects.npy"):
                os.unlink(os.path.join(tmp, name))
            refused(cli(os.path.join(tmp, "missing.npy"), target), "missing.npy")
            refused(cli(source, os.path.join(tmp, "no", "such", "folder")),
                    "its folder does not exist")
            # A server's token file during a rotation lists two: which one to send is not for
            # the client to guess, and neither may reach a log.
            tokens = os.path.join(tmp, "tokens")
            with open(tokens, "w") as f:
                f.write("first-secret-token\n\n  second-secret-token \n")
            run = cli(f"--token_file={tokens}", source, target)
            refused(run, "holds 2 tokens; a client sends one")
            self.assertNotIn("secret", run.stderr)
            with open(tokens, "w") as f:
                f.write("a secret\n")
            run = cli(f"--token_file={tokens}", source, target)
            refused(run, "line 1 holds a character that is not visible ASCII")
            self.assertNotIn("secret", run.stderr)
            # Read as the server and the C++ CLI read it: lines end at "\n" alone, and a control
            # character is not whitespace.
            for contents in ("tok\x1f\n", "first-secret\rsecond-secret\n"):
                with open(tokens, "w", newline="") as f:
                    f.write(contents)
                run = cli(f"--token_file={tokens}", source, target)
                refused(run, "line 1 holds a character that is not visible ASCII")
                self.assertNotIn("secret", run.stderr)
            # A folder is refused before the call, not after it.
            refused(cli(source, tmp), "a directory, not a file")
            # The failed runs left the earlier result whole.
            self.assertSameBytes(np.load(target), expected(array))
            self.assertEqual(sorted(os.listdir(tmp)),
                             ["a.npy", "result", "tokens", "vector.npy"])

            # A link stays a link, and what it points to gets the result; a file keeps its
            # mode, and a new one gets the umask's.
            os.chmod(target, 0o600)
            os.symlink(target, os.path.join(tmp, "link"))
            other = random_array(np.int16, (4, 3), np.random.default_rng(7))
            np.save(source, other)
            run = cli(source, os.path.join(tmp, "link"))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertTrue(os.path.islink(os.path.join(tmp, "link")))
            self.assertSameBytes(np.load(target), expected(other))
            self.assertEqual(os.stat(target).st_mode & 0o777, 0o600)
            fresh = os.path.join(tmp, "fresh")
            run = cli(source, fresh, preexec_fn=lambda: os.umask(0o027))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(os.stat(fresh).st_mode & 0o777, 0o640)
            self.assertEqual(sorted(os.listdir(tmp)),
                             ["a.npy", "fresh", "link", "result", "tokens", "vector.npy"])
            # The longest names a file can have (255 bytes, also of two-byte characters after an
            # odd byte): written, nothing left beside them.
            for name in ("n" * 255, "a" + "\u00e9" * 127):
                longest = os.path.join(tmp, name)
                for _ in range(2):
                    run = cli(source, longest)
                    self.assertEqual(run.returncode, 0, run.stderr)
                self.assertSameBytes(np.load(longest), expected(other))
                self.assertEqual(len(os.listdir(tmp)), 7)
                os.unlink(longest)


def main():
    global ARGS, transpose_client
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--server", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.client = os.path.join(ARGS.repo, "examples", "python", "transpose_client.py")
    sys.path.insert(0, os.path.dirname(ARGS.client))
    import transpose_client as module
    transpose_client = module
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
