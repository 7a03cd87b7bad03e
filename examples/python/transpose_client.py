#!/usr/bin/env python3
"""A Python client of the transpose service: a NumPy array in, its transpose out.

    python3 transpose_client.py --server=localhost:50051 in.npy out.npy

or, from Python (with this directory on sys.path):

    import transpose_client
    with transpose_client.Client("localhost:50051") as client:
        result = client.transpose(array)  # result.array == array.T (each matrix of a 3-D batch)
        print(result.stats.backend, result.stats.bandwidth_bytes_per_second)

It follows the README's advice for clients in other languages: the matrix goes up in 1 MiB
stream chunks (what every server takes), the result is read up to the message that carries the
stats before the stream is half-closed (a connection the server closes as the call ends, at its
age or in a drain, could otherwise be reset under the unread result), and what a later try may
get through is sent again with backoff: busy (RESOURCE_EXHAUSTED with grpc-retry-pushback-ms),
a transport quota's reset, UNAVAILABLE, a CANCELLED the client did not cause.

Needs Debian's python3-grpcio, python3-protobuf and python3-numpy. The gRPC stubs are generated
from proto/transpose/v1/transpose.proto at first use (protoc with Debian's grpc_python_plugin, from
protobuf-compiler-grpc, or grpcio-tools where pip installed it) into a cache folder under
$XDG_CACHE_HOME (~/.cache) that only this user can change; to ship them instead, run once

    protoc -I proto --python_out=OUT --grpc_out=OUT \\
        --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin proto/transpose/v1/transpose.proto

and put OUT on sys.path.
"""
import argparse
import atexit
import errno
import fcntl
import hashlib
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, NamedTuple, Optional

import google.protobuf
import grpc
import numpy as np

_PROTO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")


def _load_stubs():
    try:
        from transpose.v1 import transpose_pb2, transpose_pb2_grpc
        return transpose_pb2, transpose_pb2_grpc
    except ImportError:
        pass
    folder = _stub_folder()
    sys.path.insert(0, folder)
    try:
        from transpose.v1 import transpose_pb2, transpose_pb2_grpc
    except ImportError as error:
        raise ImportError(f"the gRPC stubs in {folder} do not import ({error}); remove that "
                          "folder to have them generated again") from error
    return transpose_pb2, transpose_pb2_grpc


def _stub_folder():
    """A folder with the stubs of this version of the API for this grpcio and protobuf: cached
    under $XDG_CACHE_HOME (~/.cache), or made for this process alone where that folder or what
    it holds could be changed by another user (it goes first on sys.path: they could run code in
    this process)."""
    proto = os.path.join("transpose", "v1", "transpose.proto")
    with open(os.path.join(_PROTO_ROOT, proto), "rb") as f:
        key = hashlib.sha256(f.read())
    key.update(f"grpcio {grpc.__version__} protobuf {google.protobuf.__version__}".encode())
    root = os.path.join(os.environ.get("XDG_CACHE_HOME")
                        or os.path.join(os.path.expanduser("~"), ".cache"), "transpose-stubs")
    try:
        os.makedirs(root, 0o700, exist_ok=True)
        root = os.path.realpath(root)
        cache = os.path.join(root, key.hexdigest()[:16])
        if _this_users_alone(root, ancestors=True):
            # Made once: a new folder is filled, then renamed into place, so that processes
            # starting together never see half of one.
            if not os.path.lexists(cache):
                _generate_stubs(proto, cache)
            if _this_users_alone(cache) and all(
                    _this_users_alone(os.path.join(folder, name))
                    for folder, folders, files in os.walk(cache) for name in folders + files):
                return cache
    except OSError:
        pass
    warnings.warn(f"{root} is not this user's alone: the gRPC stubs are generated for this "
                  "process only")
    private = tempfile.mkdtemp(prefix="transpose_stubs_")
    atexit.register(shutil.rmtree, private, True)
    _generate_stubs(proto, os.path.join(private, "stubs"))
    return os.path.join(private, "stubs")


def _this_users_alone(path, ancestors=False):
    """Whether only this user (and root) can change `path`, not a symbolic link; with
    `ancestors`, nor rename it away: each folder above is root's or this user's, and others
    cannot write to it or it is sticky (as /tmp)."""
    info = os.lstat(path)
    if (stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return False
    while ancestors and path != os.path.dirname(path):
        path = os.path.dirname(path)
        info = os.stat(path)
        if (info.st_uid not in (0, os.getuid()) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                and not info.st_mode & stat.S_ISVTX):
            return False
    return True


def _generate_stubs(proto, cache):
    out = tempfile.mkdtemp(prefix=os.path.basename(cache) + ".", dir=os.path.dirname(cache))
    plugin = shutil.which("grpc_python_plugin")
    if plugin is not None and shutil.which("protoc") is not None:
        command = ["protoc", f"--plugin=protoc-gen-grpc={plugin}", "--grpc_out", out]
    else:
        command = [sys.executable, "-m", "grpc_tools.protoc", "--grpc_python_out", out]
    made = subprocess.run(command + ["-I", _PROTO_ROOT, "--python_out", out, proto],
                          capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise ImportError("could not generate the gRPC stubs (install protobuf-compiler-grpc, "
                          f"or pip's grpcio-tools): {made.stderr.strip()}")
    for folder, folders, files in os.walk(out):  # Whatever the umask: this user's alone.
        for name in folders + files:
            path = os.path.join(folder, name)
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~0o022)
    try:
        os.rename(out, cache)
    except OSError:  # Another process got there first.
        shutil.rmtree(out, ignore_errors=True)


pb, pb_grpc = _load_stubs()

# The API's data types by NumPy's (and bfloat16, which has no NumPy type of its own, as 2-byte
# void: see _wire_type).
DATA_TYPES = {
    np.dtype(np.float32): pb.DATA_TYPE_FLOAT32, np.dtype(np.float64): pb.DATA_TYPE_FLOAT64,
    np.dtype(np.float16): pb.DATA_TYPE_FLOAT16, np.dtype(np.int8): pb.DATA_TYPE_INT8,
    np.dtype(np.uint8): pb.DATA_TYPE_UINT8, np.dtype(np.int16): pb.DATA_TYPE_INT16,
    np.dtype(np.uint16): pb.DATA_TYPE_UINT16, np.dtype(np.int32): pb.DATA_TYPE_INT32,
    np.dtype(np.uint32): pb.DATA_TYPE_UINT32, np.dtype(np.int64): pb.DATA_TYPE_INT64,
    np.dtype(np.uint64): pb.DATA_TYPE_UINT64, np.dtype(np.complex64): pb.DATA_TYPE_COMPLEX64,
    np.dtype(np.complex128): pb.DATA_TYPE_COMPLEX128,
}

# Data per request message: every server takes 1 MiB (its --max_message_bytes is at least that),
# so a transport quota's reset of such a call was another call's doing.
CHUNK_BYTES = 1 << 20
# gRPC's report of the server's transport quota resetting the stream (grpc-go words it
# "... error code: ENHANCE_YOUR_CALM").
_QUOTA_RESET = "Received RST_STREAM with error code 11"


class TransposeError(Exception):
    """A failed call: its gRPC status code, the server's message, and whether a later try may
    get through (busy, out of reach) rather than being refused for good."""

    def __init__(self, code: grpc.StatusCode, message: str, retryable: bool, attempts: int):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.attempts = attempts


class Result(NamedTuple):
    array: np.ndarray  # (cols, rows), or (batch, cols, rows) for a 3-D input.
    stats: "pb.TransposeStats"
    attempts: int


class Client:
    """One channel to `target` (any gRPC target: host:port, dns:///name:port, ...). Thread-safe;
    close() it, or use it as a context manager."""

    def __init__(self, target: str, token: Optional[str] = None,
                 root_certificates: Optional[bytes] = None, max_attempts: int = 4,
                 timeout: float = 600.0):
        if token and not _sendable_token(token):
            raise ValueError("the token holds a character that is not visible ASCII (a space, a "
                             "line break, a control character or a non-ASCII byte)")
        options = [
            # Responses come in chunks of the server's response_chunk_bytes (1 MiB by default);
            # gRPC's default limit of 4 MiB would refuse a larger server setting.
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # The server takes a client ping at most every 5 s. Pings go on while a call waits
            # for its result with no data flowing (gRPC's default stops after two).
            ("grpc.keepalive_time_ms", 30000),
            ("grpc.http2.max_pings_without_data", 0),
            # Calls spread over every address the target resolves to (the pods of a headless
            # Service, say), as the C++ client's do; gRPC's default sends them all to one.
            ("grpc.lb_policy_name", "round_robin"),
            # gRPC's reconnection backoff grows to 2 minutes while a server is down; servers
            # restart in seconds.
            ("grpc.max_reconnect_backoff_ms", 5000),
        ]
        if root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, credentials, options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        self._stub = pb_grpc.TransposeServiceStub(self._channel)
        # grpcio's token credentials refuse an insecure channel: plain metadata works on both.
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._max_attempts = max(1, max_attempts)
        self._timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def server_info(self, timeout: float = 5.0) -> "pb.ServerInfo":
        return self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout,
                                        metadata=self._metadata)

    def transpose(self, array: np.ndarray, algorithm: int = pb.ALGORITHM_AUTO,
                  on_progress: Optional[Callable[[int, int, int, int], None]] = None) -> Result:
        """`array` (2-D, or 3-D for a batch) transposed on the server: each matrix's rows and
        columns swapped. on_progress(sent, received, total, attempt) follows the transfer, from
        this thread or grpcio's (never two at once, never after the call returns); an attempt
        sent again starts from zero, and an exception it raises ends the call. Raises
        TransposeError, or ValueError for an array the API cannot carry."""
        if array.ndim not in (2, 3) or array.size == 0:
            raise ValueError("expected a 2-D matrix or a 3-D batch with no side of length 0, "
                             f"got shape {array.shape}")
        wire, data_type = _wire_type(array.dtype)
        data = np.ascontiguousarray(array, dtype=wire)
        batch, rows, cols = (1,) * (3 - data.ndim) + data.shape
        out_shape = data.shape[:-2] + (cols, rows)
        header = pb.TransposeRequest(
            dtype=data_type, algorithm=algorithm,
            shape=pb.MatrixShape(batch=batch, rows=rows, cols=cols))
        # The same id for every attempt, so that the server's log lines of a failure name it.
        request_id = "%016x" % random.getrandbits(64)
        metadata = self._metadata + [("x-request-id", request_id)]
        deadline = time.monotonic() + self._timeout
        backoff = 0.1
        for attempt in range(1, self._max_attempts + 1):
            output = np.empty(out_shape, wire)
            try:
                stats = _Attempt(self._stub, header, data, output, attempt, on_progress).run(
                    metadata, deadline)
                return Result(output, stats, attempt)
            except _AttemptFailed as failed:
                code, details = failed.code, failed.details
                wait = None if failed.error is None else _retry_wait(failed.error,
                                                                     failed.result_arrived)
                message = f"{details} [request {request_id}]"
                final = wait is None or attempt == self._max_attempts
                if not final:
                    wait = max(wait, backoff * random.uniform(0.5, 1.0))
                    final = time.monotonic() + wait >= deadline
                if final:
                    raise TransposeError(code, message, wait is not None, attempt) from None
                time.sleep(wait)
                backoff = min(2 * backoff, 2.0)
        raise AssertionError("unreachable")


def _wire_type(dtype: np.dtype):
    """The dtype an array of `dtype` goes over the wire as, and the API's data type for it."""
    # bfloat16, which NumPy lacks: ml_dtypes' type, or 2-byte void as .npy files hold it (the C++
    # CLI reads and writes those so). Its bytes go as they are.
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None:
        return dtype, pb.DATA_TYPE_BFLOAT16
    # The wire is little-endian, whatever this host is.
    wire = dtype.newbyteorder("<")
    if wire.newbyteorder("=") not in DATA_TYPES:
        raise ValueError(f"dtype {dtype} is not one the service takes")
    return wire, DATA_TYPES[wire.newbyteorder("=")]


class _AttemptFailed(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, error: Optional[grpc.RpcError] = None,
                 result_arrived: bool = False):
        super().__init__(details)
        self.code = code
        self.details = details
        self.error = error  # None for a failure this side found (a final one).
        self.result_arrived = result_arrived


class _Attempt:
    """One TransposeStream call: grpcio's thread sends the chunks from requests(), this one reads
    the result into `output`."""

    def __init__(self, stub, header, data, output, attempt, on_progress):
        self._stub = stub
        self._header = header
        self._source = memoryview(data.reshape(-1)).cast("B")
        self._sink = output.reshape(-1).view(np.uint8)
        self._total = len(self._source)
        self._attempt = attempt
        self._on_progress = on_progress
        self._result_in = threading.Event()
        self._lock = threading.Lock()  # Orders the reports and guards what they read.
        self._sent = 0
        self._received = 0
        self._ended = False  # No reports once the call is over.
        self._callback_error = None

    def _report(self, sent=None, received=None):
        with self._lock:
            if sent is not None:
                self._sent = sent
            if received is not None:
                self._received = received
            if self._on_progress is None or self._ended or self._callback_error is not None:
                return
            try:
                self._on_progress(self._sent, self._received, self._total, self._attempt)
            except BaseException as error:  # Raised again on the caller's thread.
                self._callback_error = error

    def _requests(self):
        for offset in range(0, self._total, CHUNK_BYTES):
            request = pb.TransposeRequest(data=bytes(self._source[offset:offset + CHUNK_BYTES]))
            if offset == 0:
                request.MergeFrom(self._header)
            yield request
            self._report(sent=min(offset + CHUNK_BYTES, self._total))
            if self._callback_error is not None:
                self._result_in.set()
                return
        # Half-close once the result is in, not after the upload (see the module's doc).
        self._result_in.wait()

    def run(self, metadata, deadline):
        call = self._stub.TransposeStream(self._requests(),
                                          timeout=max(0.0, deadline - time.monotonic()),
                                          metadata=metadata)
        stats = None
        received = 0
        try:
            for response in call:
                shape = self._header.shape
                if received == 0 and (response.dtype != self._header.dtype
                                      or response.shape.batch != shape.batch
                                      or response.shape.rows != shape.cols
                                      or response.shape.cols != shape.rows):
                    raise _AttemptFailed(grpc.StatusCode.DATA_LOSS,
                                         "the server's result is not this matrix's transpose")
                piece = np.frombuffer(response.data, np.uint8)
                if received + len(piece) > self._total:
                    raise _AttemptFailed(grpc.StatusCode.DATA_LOSS,
                                         "the server sent more bytes than the result holds")
                self._sink[received:received + len(piece)] = piece
                received += len(piece)
                if len(piece):
                    self._report(received=received)
                if self._callback_error is not None:
                    raise self._callback_error
                if response.HasField("stats"):
                    stats = response.stats
                    self._result_in.set()
        except grpc.RpcError as error:
            if self._callback_error is not None:
                raise self._callback_error from None
            # The stats come with the last chunk once the server's job succeeded: with them and
            # every byte here, the call is done, whatever ended the stream after that.
            if stats is not None and received == self._total:
                return stats
            raise _AttemptFailed(error.code(), error.details() or "", error,
                                 received > 0) from None
        finally:
            with self._lock:
                self._ended = True
            self._result_in.set()  # Lets the request thread end.
            call.cancel()  # Frees the server's side now if this side gave up; else a no-op.
        if stats is None or received != self._total:
            raise _AttemptFailed(
                grpc.StatusCode.DATA_LOSS,
                f"the server ended the stream after {received} of {self._total} bytes"
                + ("" if stats is not None else " without stats"))
        return stats


def _retry_wait(error: grpc.RpcError, result_arrived: bool) -> Optional[float]:
    """Seconds to wait at least before sending the call again, or None when it is final (as the
    C++ client decides)."""
    code = error.code()
    trailers = dict(error.trailing_metadata() or ())
    pushback = None
    if "grpc-retry-pushback-ms" in trailers:  # The service's word: so long, or never.
        try:
            pushback = int(trailers["grpc-retry-pushback-ms"])
        except ValueError:
            return None
        if pushback < 0:
            return None
    if code == grpc.StatusCode.UNAVAILABLE:
        return 0.0
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if pushback is not None:
            return pushback / 1000
        # Our chunks are within every server's limit, so the quota's reset was another call's
        # doing.
        return 0.0 if _QUOTA_RESET in (error.details() or "") else None
    if code == grpc.StatusCode.CANCELLED and not result_arrived:
        return 0.0  # A server shutting down cancels the calls that arrive as it closes.
    return None


def _sendable_token(token: str) -> bool:
    return token != "" and all("!" <= c <= "~" for c in token)


def read_token_file(path: str) -> str:
    """The one token of a token file (as the C++ CLI's --token_file reads it: one per line, blank
    lines and the whitespace around each ignored). ValueError, quoting no token, for a file with
    none, with several (a server's --auth_token_file may list two while one replaces the other;
    a client sends one), or with one that cannot be sent."""
    with open(path, "rb") as f:
        # Lines end at "\n" alone, and lose ASCII whitespace only, as ParseTokenFile's do.
        lines = [(number, line.strip(b" \t\n\v\f\r"))
                 for number, line in enumerate(f.read().split(b"\n"), 1)]
    for number, token in lines:
        if token and not _sendable_token(token.decode("latin-1")):  # A character per byte.
            raise ValueError(f"{path} line {number} holds a character that is not visible ASCII "
                             "(a space, a control character or a non-ASCII byte): a token is one "
                             "word per line")
    tokens = [token.decode("ascii") for _, token in lines if token]
    if not tokens:
        raise ValueError(f"{path} holds no token")
    if len(tokens) > 1:
        raise ValueError(f"{path} holds {len(tokens)} tokens; a client sends one (a server's "
                         "--auth_token_file may list several)")
    return tokens[0]


class OutputFile:
    """Where a result goes, by the C++ CLI's rules (server/core/files.h, FileWriter), checked
    before the call: a regular file (new, replacing one, or what a symbolic link points to) is
    written beside itself, flushed and renamed over, with the old file's mode (a new one gets the
    umask's), so that it holds either the whole result or what it held before; anything else (a
    pipe, a device) is written in place, as is a file whose folder cannot be written;
    /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N go through that descriptor. OSError
    for a folder, a file that cannot be written, and a descriptor open for reading only."""

    def __init__(self, path: str):
        self.path = path
        self._descriptor = None
        self._in_place = False
        self._target = path
        named = re.fullmatch(r"/dev/(stdout|stderr)|/(?:dev|proc/self)/fd/(\d+)", path)
        if named:
            self._descriptor = ({"stdout": 1, "stderr": 2}[named.group(1)] if named.group(1)
                                else int(named.group(2)))
            if fcntl.fcntl(self._descriptor, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                raise PermissionError(errno.EBADF, "it is open for reading only", path)
            return
        if os.path.islink(path):
            if not os.path.exists(path):  # A dangling link: opening it creates its target.
                self._in_place = True
                return
            self._target = os.path.realpath(path)
        try:
            info = os.stat(self._target)
        except FileNotFoundError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", path)
        if info is not None and not stat.S_ISREG(info.st_mode):
            self._in_place = True
        elif info is not None and not os.access(self._target, os.W_OK):
            raise PermissionError(errno.EACCES, "cannot write", path)
        elif not os.access(os.path.dirname(os.path.abspath(self._target)), os.W_OK | os.X_OK):
            if info is None:
                folder = os.path.dirname(os.path.abspath(self._target))
                if not os.path.isdir(folder):
                    raise FileNotFoundError(errno.ENOENT, "its folder does not exist", path)
                raise PermissionError(errno.EACCES, "cannot create a file in its folder", path)
            self._in_place = True

    def write_npy(self, array: np.ndarray):
        if self._descriptor is not None:
            with os.fdopen(self._descriptor, "wb", closefd=False) as f:
                np.save(f, array)
            return
        if self._in_place:
            with open(self._target, "wb") as f:
                np.save(f, array)
            return
        # A name no other writer has (O_EXCL, never through a link), cut short (in bytes, not
        # inside a UTF-8 character) where a long name and the suffix would pass NAME_MAX; the
        # kernel applies the umask to a new file's 0666.
        folder, name = os.path.split(os.fsencode(self._target))
        while True:
            suffix = b".partial-%08x" % random.getrandbits(32)
            keep = min(len(name), 255 - len(suffix))
            while 0 < keep < len(name) and name[keep] & 0xC0 == 0x80:  # Not inside a character.
                keep -= 1
            temporary = os.path.join(folder, name[:keep] + suffix)
            try:
                descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                     | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(descriptor, "wb") as f:
                np.save(f, array)
                f.flush()
                try:
                    os.fchmod(f.fileno(), stat.S_IMODE(os.stat(self._target).st_mode))
                except FileNotFoundError:
                    pass
                os.fsync(f.fileno())  # On disk before the rename.
            os.rename(temporary, os.fsencode(self._target))
        except BaseException:
            os.unlink(temporary)
            raise


def load_npy(path: str) -> np.ndarray:
    """The array a .npy file holds; ValueError naming the file for anything else (np.load would
    give an .npz archive, or blame pickling for a raw file)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file (it does not start with \\x93NUMPY)")
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="a .npy file holding a 2-D matrix or a 3-D batch")
    parser.add_argument("output", help="the .npy file to write the transpose to")
    parser.add_argument("--server", default="localhost:50051")
    parser.add_argument("--token_file", help="a file holding the bearer token (one line)")
    parser.add_argument("--tls_ca", help="PEM roots: use TLS and trust these")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for the call")
    parser.add_argument("--attempts", type=int, default=4)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (OSError, ValueError) as error:  # Bad files, arrays the API cannot carry.
        print(f"error: {error}", file=sys.stderr)
        return 1


def _run(args) -> int:
    token = read_token_file(args.token_file) if args.token_file else None
    output = OutputFile(args.output)  # Refused now, not after the transfer.
    roots = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            roots = f.read()
    array = load_npy(args.input)
    with Client(args.server, token=token, root_certificates=roots, max_attempts=args.attempts,
                timeout=args.deadline) as client:
        try:
            result = client.transpose(array)
        except TransposeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    output.write_npy(result.array)
    stats = result.stats
    print(f"{args.input} {array.shape} -> {args.output} {result.array.shape}: "
          f"{stats.backend} {stats.algorithm}, kernel {stats.kernel_seconds * 1e3:.3f} ms, "
          f"{stats.bandwidth_bytes_per_second / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
