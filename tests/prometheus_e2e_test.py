#!/usr/bin/env python3
"""Observability end to end: the real transpose_server (CPU backend), Debian's real Prometheus
with the repository's scrape config and rules, and the repository's Grafana dashboard.

- /metrics passes `promtool check metrics` and carries every metric of the contract;
- Prometheus scrapes it, and after load finds a non-zero rate(transpose_kernel_bytes_total) and a
  finite p99 of transpose_kernel_duration_seconds;
- every PromQL expression of the dashboard and of the alert and recording rules evaluates without
  error, the dashboard's core panels return data, and its per-device panels keep pods apart;
- each failed request leaves one log line with its code and reason;
- `transpose bench --metrics_url` prints the server's metrics delta for its run.

Usage: prometheus_e2e_test.py --repo REPO --server PATH --cli PATH
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

ARGS = None

CONTRACT = {
    "transpose_requests_total": "counter",
    "transpose_request_duration_seconds": "histogram",
    "transpose_kernel_duration_seconds": "histogram",
    "transpose_kernel_bandwidth_bytes_per_second": "histogram",
    "transpose_kernel_peak_fraction": "histogram",
    "transpose_kernel_bytes_total": "counter",
    "transpose_device_peak_bandwidth_bytes_per_second": "gauge",
    "transpose_inflight_requests": "gauge",
    "transpose_stream_pool_busy_streams": "gauge",
    "transpose_device_memory_used_bytes": "gauge",
    "transpose_host_memory_used_bytes": "gauge",
    "transpose_build_info": "gauge",
    "transpose_backend_healthy": "gauge",
}


def listening_address(log_path):
    """Where Prometheus, started on port 0, listens, from its log's "Listening on" line."""
    with open(log_path) as f:
        match = re.search(r'msg="Listening on" address=(127\.0\.0\.1:[1-9][0-9]*)', f.read())
    return match.group(1) if match else None


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except Exception:  # Not up yet.
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class ObservabilityTest(unittest.TestCase):
    PODS = ("pod-a", "pod-b")
    # Small enough that what the server may hold at worst under them (about 9 GiB on the CPU, with
    # the default pool and gRPC's room) fits the machine, where the server would lower the budget.
    LIMIT_BYTES = 1 << 30
    LIMIT_REQUESTS = 100
    # Each client host's share (the tests here stay far below it).
    LIMIT_BYTES_PER_PEER = 768 << 20
    LIMIT_REQUESTS_PER_PEER = 90

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.server_log = open(os.path.join(cls.tmp.name, "server.log"), "w+")
        cls.server = subprocess.Popen(
            [ARGS.server, "--backend=cpu", "--address=127.0.0.1:0",
             "--metrics_address=127.0.0.1:0", "--log_level=warning",
             f"--max_inflight_bytes={cls.LIMIT_BYTES}",
             f"--max_inflight_requests={cls.LIMIT_REQUESTS}",
             f"--max_inflight_bytes_per_peer={cls.LIMIT_BYTES_PER_PEER}",
             f"--max_inflight_requests_per_peer={cls.LIMIT_REQUESTS_PER_PEER}",
             "--stream_idle_seconds=75"],
            stdout=subprocess.PIPE, stderr=cls.server_log, text=True)
        # Runs even when setUpClass fails below, where tearDownClass does not.
        cls.addClassCleanup(cls.server.kill)
        ports = {}
        while len(ports) < 2:
            line = cls.server.stdout.readline()
            if not line:
                raise RuntimeError("transpose_server exited before reporting its ports")
            for key in ("listening on ", "metrics on "):
                if line.startswith(key):
                    ports[key] = line.strip().rsplit(":", 1)[1]
        cls.target = "127.0.0.1:" + ports["listening on "]
        cls.metrics = "127.0.0.1:" + ports["metrics on "]

        # The repository's scrape config, pointed at this server and scraping every second.
        with open(os.path.join(ARGS.repo, "deploy/prometheus/prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [os.path.join(ARGS.repo, "deploy/prometheus", r)
                                for r in config["rule_files"]]
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "transpose")
        # The one server twice, as two pods whose devices have the same names.
        job["static_configs"] = [{"targets": [cls.metrics], "labels": {"instance": pod}}
                                 for pod in cls.PODS]
        config_path = os.path.join(cls.tmp.name, "prometheus.yml")
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        # On port 0, so that no other process can take its port between a choice and its start.
        prometheus_log = os.path.join(cls.tmp.name, "prometheus.log")
        with open(prometheus_log, "w") as log:
            cls.prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={config_path}",
                 f"--storage.tsdb.path={os.path.join(cls.tmp.name, 'tsdb')}",
                 "--web.listen-address=127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=log)
        cls.addClassCleanup(cls.prometheus.kill)
        wait_for(lambda: listening_address(prometheus_log), 60, "Prometheus to listen")
        cls.prometheus_url = "http://" + listening_address(prometheus_log)
        wait_for(lambda: "Ready" in get(cls.prometheus_url + "/-/ready"), 60, "Prometheus ready")
        # Prometheus applies new targets a few seconds after start; load before its first
        # scrape would show as no change at all.
        up = cls.prometheus_url + "/api/v1/query?query=up%7Bjob%3D%22transpose%22%7D"
        wait_for(lambda: json.loads(get(up))["data"]["result"][0]["value"][1] == "1", 60,
                 "the first scrape of the server")

        # Load: successful transposes of several sizes, and requests the CPU backend refuses.
        cls.load_start = time.time()
        cls.cli("bench", "--duration=4s", "--concurrency=4", "--shape=256x256", "--dtype=float32")
        cls.cli("bench", "--count=20", "--shape=2x300x500", "--dtype=uint8", "--stream")
        cls.refused = 3
        for _ in range(cls.refused):
            cls.cli("bench", "--count=1", "--shape=8x8", "--algorithm=naive", check=False)
        # Let Prometheus scrape the final counts a few times.
        time.sleep(4)

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.terminate()
        cls.server.terminate()
        cls.prometheus.wait(timeout=30)
        cls.server.wait(timeout=60)
        cls.server_log.close()
        cls.tmp.cleanup()

    @classmethod
    def cli(cls, *args, check=True):
        result = subprocess.run([ARGS.cli, f"--server={cls.target}", *args],
                                capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(result.stderr + result.stdout)
        return result

    def query(self, expr):
        url = self.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(get(url))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read().decode())
        self.assertEqual(body.get("status"), "success", f"{expr}: {body.get('error')}")
        return body["data"]["result"]

    def test_promtool_check_metrics_passes_and_contract_is_complete(self):
        text = get(f"http://{self.metrics}/metrics")
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                               text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        for name, kind in CONTRACT.items():
            self.assertIn(f"# TYPE {name} {kind}\n", text)
        # The CPU backend takes jobs; a faulted GPU's 0 is checked on the GPU machine
        # (reliability_test, AStickyGpuFaultTakesTheDeviceOutOfService).
        self.assertIn('\ntranspose_backend_healthy{backend="cpu"} 1\n', text)
        version = subprocess.run([ARGS.server, "--version"], capture_output=True, text=True,
                                 check=True).stdout.split()[-1]
        self.assertIn(f'\ntranspose_build_info{{version="{version}"}} 1\n', text)
        # Beside the admission gauges, the limits they count against: the server's flags.
        self.assertIn(f"\ntranspose_admission_limit_bytes {self.LIMIT_BYTES}\n", text)
        self.assertIn(f"\ntranspose_admission_limit_requests {self.LIMIT_REQUESTS}\n", text)
        # No request-derived values in labels: every label value comes from a small fixed set.
        for line in text.splitlines():
            if line.startswith("transpose_") and "{" in line:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1]))
                self.assertLessEqual(set(labels), {"method", "code", "backend", "algorithm", "le",
                                                   "version"}, line)

    def test_metrics_are_served_at_metrics_only(self):
        # A scrape config with a typo must fail loudly, not scrape a page that merely starts
        # with /metrics.
        self.assertIn("# TYPE transpose_requests_total counter",
                      get(f"http://{self.metrics}/metrics?name[]=x"))
        for path in ("/metricsx", "/metrics/", "/metrics/x", "/metrics.txt", "/", "/health"):
            with self.assertRaises(urllib.error.HTTPError, msg=path) as caught:
                get(f"http://{self.metrics}{path}")
            self.assertEqual(caught.exception.code, 404, path)

    def test_prometheus_sees_kernel_bytes_and_a_finite_p99(self):
        rate = self.query("sum(rate(transpose_kernel_bytes_total[10m]))")
        self.assertTrue(rate and float(rate[0]["value"][1]) > 0,
                        (rate, self.query("transpose_kernel_bytes_total[60s]")))
        p99 = self.query("histogram_quantile(0.99, sum by (le) "
                         "(rate(transpose_kernel_duration_seconds_bucket[10m])))")
        self.assertTrue(p99, p99)
        value = float(p99[0]["value"][1])
        self.assertTrue(math.isfinite(value) and value > 0, value)
        codes = {r["metric"]["code"] for r in self.query("transpose_requests_total > 0")}
        self.assertIn("OK", codes)
        self.assertIn("UNIMPLEMENTED", codes)

    def dashboard_exprs(self):
        with open(os.path.join(ARGS.repo, "deploy/grafana/dashboards/transpose.json")) as f:
            dashboard = json.load(f)
        exprs = []
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                exprs.append((panel["title"], target["expr"]))
        for variable in dashboard["templating"]["list"]:
            # label_values(SELECTOR, label) is Grafana's; its selector is PromQL.
            match = re.match(r"label_values\((.*), \w+\)$", variable["query"])
            exprs.append((variable["name"], match.group(1)))
        return [(title, expr.replace("$__rate_interval", "30s").replace("$job", ".*")
                 .replace("$instance", ".*")) for title, expr in exprs]

    def test_every_dashboard_query_evaluates_and_core_panels_have_data(self):
        exprs = self.dashboard_exprs()
        self.assertGreaterEqual(len(exprs), 10)
        empty = []
        for title, expr in exprs:
            with self.subTest(panel=title):
                if not self.query(expr):
                    empty.append(title)
        # With the CPU backend under load, everything but the (idle now) gauges has data.
        for title in ("Requests per second by code", "Request latency p50 / p99",
                      "Kernel time p50 / p99 per device", "Achieved kernel bandwidth per device",
                      "Kernels, % of the device's copy bandwidth",
                      "Bytes moved by kernels per second", "Scrape targets up",
                      "Server-side error ratio", "Devices in service"):
            self.assertNotIn(title, empty)

    def test_per_device_panels_keep_pods_apart(self):
        # Every pod has a "cuda:0" (here "cpu"): summed by backend alone, one line would mix them.
        checked = 0
        for title, expr in self.dashboard_exprs():
            # NVML's gauges exist only with GPUs; the test above evaluates their queries.
            if "backend" not in expr or "transpose_gpu_" in expr:
                continue
            with self.subTest(panel=title, expr=expr):
                result = self.query(expr)
                self.assertTrue(result)
                self.assertEqual({r["metric"].get("instance") for r in result}, set(self.PODS))
                checked += 1
        self.assertGreaterEqual(checked, 8)

    def test_every_rule_expression_evaluates(self):
        with open(os.path.join(ARGS.repo, "deploy/prometheus/rules/transpose.rules.yml")) as f:
            rules = yaml.safe_load(f)
        count = 0
        for group in rules["groups"]:
            for rule in group["rules"]:
                with self.subTest(rule=rule.get("alert") or rule.get("record")):
                    result = self.query(rule["expr"])
                    count += 1
                    # Under load every pod's CPU backend has moved bytes in kernel time.
                    if rule.get("record") == "transpose:kernel_peak_fraction:time_weighted15m":
                        self.assertEqual({r["metric"]["instance"] for r in result},
                                         set(self.PODS), result)
                        for r in result:
                            self.assertGreater(float(r["value"][1]), 0, r)
        self.assertGreaterEqual(count, 8)
        # Prometheus loaded the same rules and evaluates them.
        loaded = json.loads(get(self.prometheus_url + "/api/v1/rules"))["data"]["groups"]
        self.assertEqual(sum(len(g["rules"]) for g in loaded), count)
        for group in loaded:
            for rule in group["rules"]:
                self.assertEqual(rule.get("health"), "ok", rule)

    def test_one_log_line_per_failed_request(self):
        self.server_log.flush()
        with open(self.server_log.name) as f:
            failures = [l for l in f if " failed " in l]
        self.assertEqual(len(failures), self.refused, failures)
        for line in failures:
            self.assertIn("WARNING", line)
            self.assertIn("UNIMPLEMENTED", line)
            self.assertIn("naive", line)

    def test_info_shows_the_limits(self):
        info = self.cli("info").stdout
        self.assertIn(f"admission: {self.LIMIT_BYTES / 2**30:.1f} GiB of matrices and "
                      f"{self.LIMIT_REQUESTS} requests at once; each client host: "
                      f"{self.LIMIT_BYTES_PER_PEER / 2**20:.1f} MiB of matrices and "
                      f"{self.LIMIT_REQUESTS_PER_PEER} requests\n", info)
        self.assertRegex(info, r"\nlimits: .*, stream idle timeout 75 s\n")

    def test_grpc_log_lines_come_in_the_servers_format(self):
        # A second server on this one's port: gRPC logs why it cannot bind, then the server
        # says so itself; every stderr line is one of the server's.
        second = subprocess.run([ARGS.server, "--backend=cpu", f"--address={self.target}",
                                 "--metrics_address="], capture_output=True, text=True,
                                timeout=120)
        self.assertNotEqual(second.returncode, 0)
        lines = second.stderr.splitlines()
        for line in lines:
            self.assertRegex(line, r"^\d{4}-\d\d-\d\dT[\d:.]+Z (DEBUG|INFO|WARNING|ERROR) ")
        self.assertTrue(any(" WARNING grpc chttp2_server.cc:" in l for l in lines), lines)
        self.assertTrue(any(" ERROR " in l and "cannot listen on" in l for l in lines), lines)
        # The CLI leaves gRPC's lines out (its own error line says what failed), and shows
        # them with gRPC's GRPC_VERBOSITY: TLS against this plaintext server makes gRPC log the
        # failed handshake.
        env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
        for verbosity in (None, "error"):
            run_env = dict(env, GRPC_VERBOSITY=verbosity) if verbosity else env
            result = subprocess.run([ARGS.cli, f"--server={self.target}", "--tls", "info"],
                                    capture_output=True, text=True, timeout=120, env=run_env)
            self.assertEqual(result.returncode, 1, result.stderr)
            lines = result.stderr.splitlines()
            self.assertTrue(lines[-1].startswith("error: UNAVAILABLE: "), result.stderr)
            grpc_lines = [l for l in lines if " grpc " in l]
            if verbosity:
                self.assertTrue(grpc_lines, result.stderr)
            else:
                self.assertEqual(lines, lines[-1:], result.stderr)

    def test_bench_prints_the_servers_metrics_delta(self):
        result = self.cli("bench", "--count=7", "--shape=64x64", "--dtype=int16",
                          f"--metrics_url=http://{self.metrics}/metrics")
        out = result.stdout
        self.assertIn("server metrics delta", out)
        self.assertRegex(out, r'transpose_requests_total\{code="OK",method="Transpose"\} \+7\b')
        # 7 int16 64x64 matrices: 7 * 64 * 64 * 2 bytes, read and written.
        self.assertRegex(out, r'transpose_kernel_bytes_total\{backend="cpu"\} \+114688\b')
        # A wrong path: the HTTP status says what is wrong.
        wrong = self.cli("bench", "--count=1", "--shape=8x8",
                         f"--metrics_url=http://{self.metrics}/nope", check=False)
        self.assertEqual(wrong.returncode, 1, wrong.stderr)
        self.assertIn(f"fetching http://{self.metrics}/nope: The requested URL returned error: "
                      "404", wrong.stderr)
        # Without a status code, which would read as the transpose server's answer.
        self.assertTrue(wrong.stderr.startswith("error: fetching "), wrong.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
