#!/usr/bin/env python3
"""The client library as a downstream project uses it: `cmake --install` of this
build into a fresh prefix, then a program outside the repository
(tests/client_package) built with find_package(transpose) against that prefix
only, run against the installed server."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None


class ClientPackageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.prefix = os.path.join(self.tmp.name, "prefix")
        self.server = None

    def tearDown(self):
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait(timeout=30)
        self.tmp.cleanup()

    def run_ok(self, *command, **kwargs):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900,
                                **kwargs)
        self.assertEqual(result.returncode, 0,
                         f"{' '.join(command)}\n{result.stdout}\n{result.stderr}")
        return result

    def start_installed_server(self):
        self.server = subprocess.Popen(
            [os.path.join(self.prefix, "bin", "transpose_server"),
             "--address=127.0.0.1:0", "--metrics_address=", "--backend=cpu"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.server.stdout.readline()
            if not line:
                break
            if line.startswith("listening on "):
                return "127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        self.fail("the installed server did not start")

    def test_a_program_builds_against_the_installed_package_and_transposes(self):
        self.run_ok("cmake", "--install", ARGS.build_dir, "--prefix", self.prefix)
        for installed in ["bin/transpose_server", "bin/transpose", "include/transpose/client/client.h",
                          "include/transpose/transpose/v1/transpose.grpc.pb.h",
                          "lib/cmake/transpose/transposeConfig.cmake",
                          "share/transpose/proto/transpose/v1/transpose.proto"]:
            self.assertTrue(os.path.exists(os.path.join(self.prefix, installed)), installed)

        # A copy outside the repository, so nothing can reach its sources.
        source = os.path.join(self.tmp.name, "demo")
        shutil.copytree(os.path.join(ARGS.repo, "tests", "client_package"), source)
        build = os.path.join(self.tmp.name, "build")
        self.run_ok("cmake", "-S", source, "-B", build, "-G", "Ninja",
                    f"-DCMAKE_PREFIX_PATH={self.prefix}")
        self.run_ok("cmake", "--build", build)
        with open(os.path.join(build, "compile_commands.json")) as f:
            commands = json.load(f)
        self.assertTrue(commands)
        for command in commands:
            self.assertNotIn(os.path.realpath(ARGS.repo), command["command"])
            self.assertNotIn(os.path.realpath(ARGS.build_dir), command["command"])
            self.assertIn(self.prefix, command["command"])

        target = self.start_installed_server()
        result = self.run_ok(os.path.join(build, "package_demo"), target)
        self.assertRegex(result.stdout, r"^ok: backend cpu, [1-9]\d* progress calls")

        # A failed call reaches the program as a status, not a crash.
        self.server.send_signal(signal.SIGKILL)
        self.server.wait(timeout=30)
        down = subprocess.run([os.path.join(build, "package_demo"), target],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(down.returncode, 1, down.stderr)
        self.assertIn("unary: UNAVAILABLE", down.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--build_dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
