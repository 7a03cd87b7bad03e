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
        if self.server is not None:
            if self.server.poll() is None:
                self.server.send_signal(signal.SIGKILL)
                self.server.wait(timeout=30)
            self.server.stdout.close()
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
        library_user = [c for c in commands if c["file"].endswith("package_demo.cc")]
        self.assertEqual(len(library_user), 1, commands)
        self.assertIn(self.prefix, library_user[0]["command"])

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

        # Found with another protobuf series (a header that says 3.22), the package refuses at
        # configure time, saying why, instead of an #error in the first file using the API.
        fake = os.path.join(self.tmp.name, "protobuf-3.22", "google", "protobuf", "stubs")
        os.makedirs(fake)
        with open(os.path.join(fake, "common.h"), "w") as f:
            f.write("#define GOOGLE_PROTOBUF_VERSION 3022000\n")
        other = subprocess.run(
            ["cmake", "-S", source, "-B", os.path.join(self.tmp.name, "build-3.22"), "-G", "Ninja",
             f"-DCMAKE_PREFIX_PATH={self.prefix}",
             f"-DProtobuf_INCLUDE_DIR={os.path.join(self.tmp.name, 'protobuf-3.22')}"],
            capture_output=True, text=True, timeout=300)
        self.assertNotEqual(other.returncode, 0, other.stdout)
        # CMake wraps the message: compare it word by word.
        self.assertRegex(" ".join((other.stdout + other.stderr).split()),
                         r"generated API headers need protobuf 3\.21\.x \(the package was "
                         r"built with 3\.21\.\d+\); found protobuf 3\.22\.0")

    def test_a_client_only_subdirectory_needs_none_of_the_servers_dependencies(self):
        # A project that adds the checkout with TRANSPOSE_CLIENT_ONLY, on a machine where
        # prometheus-cpp, curl and CUDA are not to be found (OpenSSL comes with gRPC): it
        # configures, builds the demo, and the demo reaches a server.
        source = os.path.join(self.tmp.name, "subdirectory")
        os.makedirs(source)
        for name in ["package_demo.cc", "package_demo.h", "main.cc"]:
            shutil.copy(os.path.join(ARGS.repo, "tests", "client_package", name), source)
        with open(os.path.join(source, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.25)\n"
                    "project(client_only_demo LANGUAGES CXX)\n"
                    "set(TRANSPOSE_CLIENT_ONLY ON)\n"
                    f"add_subdirectory({os.path.realpath(ARGS.repo)} transpose "
                    "EXCLUDE_FROM_ALL)\n"
                    "add_library(package_demo_shared SHARED package_demo.cc)\n"
                    "target_link_libraries(package_demo_shared PRIVATE transpose::client)\n"
                    "add_executable(package_demo main.cc)\n"
                    "target_link_libraries(package_demo package_demo_shared)\n")
        build = os.path.join(self.tmp.name, "build-subdirectory")
        configured = self.run_ok(
            "cmake", "-S", source, "-B", build, "-G", "Ninja",
            "-DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON",
            "-DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON",
            "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON", "-DCMAKE_CUDA_COMPILER=/nonexistent")
        self.assertIn("transpose: the client library only", configured.stdout)
        self.run_ok("cmake", "--build", build, "--target", "package_demo")
        self.run_ok("cmake", "--install", ARGS.build_dir, "--prefix", self.prefix)
        target = self.start_installed_server()
        result = self.run_ok(os.path.join(build, "package_demo"), target)
        self.assertRegex(result.stdout, r"^ok: backend cpu, [1-9]\d* progress calls")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--build_dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
