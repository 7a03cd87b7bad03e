#!/usr/bin/env python3
"""The deploy files: every kustomize overlay renders and lints; the PrometheusRule carries exactly
the repository's alert rules, which promtool accepts; and the compose file, the Dockerfile and the
manifests use only flags, ports and names that the server and CLI really have (checked against
their --help).

Usage: deploy_test.py --repo REPO --server PATH --cli PATH
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import yaml

ARGS = None


def kustomize_problem():
    """Why `kubectl kustomize` cannot render the overlays here, or None. Debian 12 has no kubectl
    recent enough (kubernetes-client 1.20's kustomize predates the Components the overlays use):
    the tests that render them are skipped, saying so, where the machine has none."""
    if shutil.which("kubectl") is None:
        return ("kubectl is not installed (1.22 or later renders the overlays: kustomize "
                "Components, and the labels field of kustomize 4.1)")
    run = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True,
                         text=True)
    try:
        version = json.loads(run.stdout)["clientVersion"]
        minor = int(re.match(r"\d+", version["minor"]).group(0))
    except (ValueError, KeyError, AttributeError):
        return None  # Let the renders say what is wrong with it.
    # 1.21 has Components, but its kustomize 4.0.5 lacks the labels field (4.1).
    if (int(version["major"]), minor) < (1, 22):
        return (f"kubectl {version['gitVersion']} predates the labels field of kustomize 4.1 "
                "(1.22 or later renders the overlays)")
    return None


KUSTOMIZE_PROBLEM = kustomize_problem()
needs_kustomize = unittest.skipIf(KUSTOMIZE_PROBLEM is not None, KUSTOMIZE_PROBLEM or "")


def flags_of(binary):
    """Flag names that `binary --help` lists."""
    run = subprocess.run([binary, "--help"], capture_output=True, text=True)
    assert run.returncode == 0, binary + ": " + run.stderr
    return set(re.findall(r"^\s+--(\w+) \(", run.stdout, re.M))


def flag_uses(args):
    """{flag: value} of '--flag=value' arguments."""
    uses = {}
    for arg in args:
        m = re.match(r"--(\w+)(?:=(.*))?$", arg)
        if m:
            uses[m.group(1)] = m.group(2)
    return uses


class DeployTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server_flags = flags_of(ARGS.server)
        cls.cli_flags = flags_of(ARGS.cli)
        assert {"address", "metrics_address", "backend", "drain_seconds"} <= cls.server_flags
        cls.overlays = sorted(glob.glob(os.path.join(ARGS.repo, "deploy/k8s/overlays/*")))
        cls.rendered = {}
        if KUSTOMIZE_PROBLEM is not None:
            print(f"deploy_test: skipping the rendered manifests' checks: {KUSTOMIZE_PROBLEM}",
                  file=sys.stderr)
            return
        for overlay in cls.overlays:
            out = subprocess.run(["kubectl", "kustomize", overlay], capture_output=True, text=True)
            assert out.returncode == 0, overlay + ": " + out.stderr
            cls.rendered[os.path.basename(overlay)] = (out.stdout,
                                                       list(yaml.safe_load_all(out.stdout)))

    def test_help_and_version_end_with_exit_code_0(self):
        """Scripts and package checks call --help and --version: both print to stdout and
        succeed (Abseil 20220623's own parser exits 1 after --help); an unknown flag still
        fails."""
        for binary, name in ((ARGS.server, "transpose_server"), (ARGS.cli, "transpose")):
            for flag in ("--help", "--helpfull", "--help=drain", "--version"):
                run = subprocess.run([binary, flag], capture_output=True, text=True, timeout=60)
                self.assertEqual(run.returncode, 0, f"{name} {flag}: {run.stderr}")
                self.assertEqual(run.stderr, "", f"{name} {flag}")
                if flag == "--version":
                    self.assertRegex(run.stdout, r"^%s \d+\.\d+\.\d+\n$" % name)
                else:
                    self.assertTrue(run.stdout.startswith(name + ": "), run.stdout[:200])
                    # Flags are listed by their source file as the repository names it, not
                    # by where the build machine kept it.
                    for repo in {ARGS.repo, os.path.realpath(ARGS.repo)}:
                        self.assertNotIn(os.path.abspath(repo).lstrip("/"), run.stdout)
                    if flag == "--helpfull":
                        self.assertRegex(run.stdout, r"\n  Flags from (server/main|client/"
                                         r"cli_main)\.cc:\n")
            unknown = subprocess.run([binary, "--no_such_flag"], capture_output=True, text=True,
                                     timeout=60)
            self.assertEqual(unknown.returncode, 1, name)
            self.assertIn("no_such_flag", unknown.stderr)
            self.assertEqual(unknown.stdout, "")
        self.assertIn("--drain_seconds (", subprocess.run(
            [ARGS.server, "--help=drain"], capture_output=True, text=True).stdout)

    def server_default(self, flag):
        out = subprocess.run([ARGS.server, "--help"], capture_output=True, text=True).stdout
        return re.search(r"--%s \(.*?\);\s+default: ([^;]+);" % flag, out, re.S).group(1)

    def check_memory_budget(self, name, container, uses):
        """The server's worst case under its flags (deploy/README.md: admitted matrices, a
        quarter more for pinned buffers rounded up to their size class, pooled buffers per GPU,
        gRPC's buffers) fits the memory limit, which is also the request (pinned memory cannot be
        reclaimed)."""
        def flag(f):
            return int(uses.get(f, self.server_default(f)))
        resources = container["resources"]
        limit = resources["limits"]["memory"]
        self.assertEqual(resources["requests"]["memory"], limit, name)
        self.assertTrue(limit.endswith("Gi"), limit)
        gib = 1 << 30
        inflight = flag("max_inflight_bytes")
        transport = flag("max_transport_bytes") or inflight + max(
            gib, 4 * flag("max_message_bytes"))
        gpus = int(resources["limits"]["nvidia.com/gpu"])
        worst = inflight * 5 // 4 + gpus * flag("buffer_pool_bytes") + transport
        self.assertLessEqual(worst, int(limit[:-2]) * gib,
                             f"{name}: {worst / gib:.0f} GiB at worst, limit {limit}")
        # The pool keeps a buffer for the largest matrix the limits admit: the server, started
        # with the overlay's limits, does not warn that it cannot.
        limits = [f"--{f}={uses[f]}" for f in ("max_matrix_bytes", "max_inflight_bytes",
                                               "max_inflight_bytes_per_peer",
                                               "buffer_pool_bytes") if f in uses]
        server = subprocess.Popen(
            [ARGS.server, "--backend=cpu", "--address=127.0.0.1:0", "--metrics_address=",
             "--log_level=warning"] + limits,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            self.assertTrue(line.startswith("listening on "), f"{name}: {line}")
        finally:
            server.kill()
            _, log = server.communicate(timeout=30)
        self.assertNotIn("cannot keep a buffer", log, name)

    def check_probe(self, name, container, probe, grpc_port, tls):
        """A probe asks the server's health: natively, over plaintext gRPC, or, on a TLS port
        (which refuses plaintext), with the image's CLI over TLS. Readiness asks for the API's
        service, which turns NOT_SERVING when the server drains. On a TLS port, start-up asks
        only that the port answers, and liveness fails on an answer of NOT_SERVING (the CLI's
        exit 1) and on none in time (exit 4), not on a failure to connect (exit 3): a
        certificate that cannot be used must not restart every pod at once."""
        spec = container[probe]
        where = f"{name} {probe}"
        readiness = probe == "readinessProbe"
        if "tcpSocket" in spec:
            self.assertFalse(readiness, where + ": readiness must ask the server's health")
            self.assertEqual(spec["tcpSocket"]["port"], grpc_port, where)
            return
        if "grpc" in spec:
            self.assertFalse(tls, where + ": a plaintext gRPC probe on a TLS port")
            self.assertEqual(spec["grpc"]["port"], grpc_port, where)
            if readiness:
                self.assertEqual(spec["grpc"]["service"], "transpose.v1.TransposeService")
            return
        command = spec["exec"]["command"]
        if tls and not readiness:
            self.assertEqual(probe, "livenessProbe", where + ": start-up must not need the "
                             "certificate")
            command, _ = self.liveness_cli(command, where)
        self.assertEqual(command[0], "transpose", where)
        self.assertIn("health", command, where)
        uses = flag_uses(command[1:])
        self.assertLessEqual(set(uses), self.cli_flags, where)
        self.assertEqual(uses["server"].rsplit(":", 1)[1], str(grpc_port), where)
        if readiness:
            self.assertEqual(uses.get("service"), "transpose.v1.TransposeService", where)
        # The CLI gives up before the kubelet does, so a slow answer ends as the CLI says (a
        # failure; for a TLS liveness, exit 4, which fails, not the kubelet's own timeout).
        self.assertRegex(uses["deadline"], r"^\d+s$", where)
        self.assertLess(int(uses["deadline"][:-1]), spec["timeoutSeconds"], where)
        if tls:
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            self.assertTrue(any(uses["tls_ca"].startswith(m + "/") for m in mounts), where)

    def liveness_cli(self, command, where):
        """The CLI command of a TLS liveness probe, `sh -c 'CLI; case $? in 0|3) ;; *) exit 1;
        esac'`, and the shell's part after it: it passes only when the CLI exits 0 (SERVING) or 3
        (no connection: TLS that does not work), and fails on 1 (NOT_SERVING), 4 (no answer in
        time: a server that hangs) and a CLI that cannot run."""
        self.assertEqual(command[:2], ["sh", "-c"], where)
        self.assertEqual(len(command), 3, where)
        cli, _, rest = command[2].partition(";")
        self.assertEqual(rest.strip(), "case $? in 0|3) ;; *) exit 1; esac", where)
        return shlex.split(cli), rest

    def check_runbooks_look_at_the_server(self, port, secrets, tls_secret, tls):
        """The runbook's commands for a look at the server itself, run as written (kubectl's
        port-forward aside, and each Secret's data taken from the file named by its key in the
        Secret's folder, `secrets` {name: folder}) against a server on `port` with the
        deployment's token file, and with TLS from the Secret `tls_secret` where `tls`."""
        with open(os.path.join(ARGS.repo, "deploy/RUNBOOK.md")) as f:
            bullet = re.search(r"^- \*\*The server itself\*\*.*?(?=\n\S|\Z)", f.read(),
                               re.M | re.S).group(0)
        commands = re.findall(r"`([^`]+)`", bullet)
        fetches = [c for c in commands if "kubectl " in c and " get secret " in c]
        clis = [shlex.split(c) for c in commands if c.startswith("transpose ")]
        tls_flags = re.findall(r"add `(--tls\w*=\S+)`", bullet)
        self.assertEqual(len(fetches), 2, bullet)
        self.assertEqual(len(clis), 2, bullet)
        self.assertTrue(tls_flags, bullet)
        with tempfile.TemporaryDirectory() as here:
            for fetch in fetches:
                secret = re.search(r" get secret (\S+)", fetch).group(1)
                key = re.search(r"\{\.data\.(.+?)\}", fetch).group(1).replace("\\.", ".")
                self.assertIn(secret, secrets, fetch)
                if secret == tls_secret and not tls:
                    continue
                data = subprocess.run(["base64", "-w0", os.path.join(secrets[secret], key)],
                                      capture_output=True, check=True).stdout
                # kubectl prints a Secret's field as base64, with no line break.
                command = re.sub(r"kubectl [^|]*? (?=\| )", "cat ", fetch)
                made = subprocess.run(["sh", "-c", command], input=data, cwd=here,
                                      capture_output=True)
                self.assertEqual(made.returncode, 0, f"{fetch}: {made.stderr}")
            # The token is not left for others to read.
            token = os.path.join(here, "token")
            self.assertEqual(os.stat(token).st_mode & 0o077, 0, bullet)
            for cli in clis:
                argv = [os.path.abspath(ARGS.cli)] + [
                    re.sub(r"^--server=(.*):50051$", r"--server=\1:" + port, a) for a in cli[1:]]
                if tls:
                    argv[1:1] = tls_flags
                run = subprocess.run(argv, cwd=here, capture_output=True, text=True, timeout=30)
                self.assertEqual(run.returncode, 0, f"{shlex.join(cli)}: {run.stderr}")
                self.assertTrue(run.stdout, shlex.join(cli))

    @needs_kustomize
    def test_a_tls_overlay_serves_its_certificate_to_its_probes(self):
        """Where an overlay serves TLS: the certificate and key come from a mounted Secret that a
        cert-manager Certificate of the overlay fills, for names that include the address the
        probes ask; and the probes' own commands, run against the real server with such files:
        readiness passes, and fails against a plaintext server; liveness passes against both,
        and both fail while the server hangs and once it answers NOT_SERVING. The runbook's look
        at the server itself works on both, with TLS as it says."""
        overlays = [n for n, d in self.objects("Deployment")
                    if "tls_cert" in flag_uses(d["spec"]["template"]["spec"]["containers"][0]["args"])]
        self.assertTrue(overlays, "no overlay serves TLS")
        for name in overlays:
            docs = self.rendered[name][1]
            deployment = next(d for d in docs if d and d["kind"] == "Deployment")
            pod = deployment["spec"]["template"]["spec"]
            container = pod["containers"][0]
            uses = flag_uses(container["args"])
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            certificates = {c["spec"]["secretName"]: c for c in docs
                            if c and c["kind"] == "Certificate"}
            for flag in ("tls_cert", "tls_key"):
                directory, _ = os.path.split(uses[flag])
                secret = mounts[directory]["secret"]["secretName"]
                self.assertIn(secret, certificates, f"{name}: --{flag}")
            certificate = certificates[secret]["spec"]
            probe = container["readinessProbe"]["exec"]["command"]
            host = flag_uses(probe)["server"].rsplit(":", 1)[0]
            self.assertIn(host, certificate.get("ipAddresses", []) + certificate["dnsNames"])

            with tempfile.TemporaryDirectory() as tmp:
                # The Secret's files, as cert-manager's CA issuer writes them for this
                # Certificate (an EC key in SEC1 form); in expired/, the same with a certificate
                # past its end; in other/, those of another CA.
                issue = lambda days: (
                    "openssl req -new -key tls.key -out tls.csr "
                    f"-subj /CN={certificate['commonName']}; "
                    "openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
                    f"-days {days} -extfile san -out tls.crt")
                new_ca = ("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                          "-keyout ca.key -out ca.crt -days 1 -subj /CN=ca")
                script = (
                    f"set -e; {new_ca}; "
                    "openssl ecparam -name prime256v1 -genkey -noout -out tls.key; "
                    f"printf 'subjectAltName=IP:{host}\\n' > san; {issue(1)}; "
                    "mkdir expired other; cp ca.crt ca.key tls.key san expired; "
                    f"(cd expired && {issue(-1)}); (cd other && {new_ca})")
                made = subprocess.run(["bash", "-c", script], cwd=tmp, capture_output=True,
                                      text=True)
                self.assertEqual(made.returncode, 0, made.stderr)
                # The token file too, mid-rotation (and with a blank first line, which the
                # server ignores): the probes meet the server's access checks, as in the pod.
                with open(os.path.join(tmp, "tokens"), "w") as f:
                    f.write("\nprobe-test-token\nnext-probe-test-token\n")
                local = lambda arg, files=tmp: re.sub(
                    r"/etc/transpose/(tls|auth)/(\w+)",
                    lambda m: os.path.join(files if m.group(1) == "tls" else tmp, m.group(2)),
                    arg)
                liveness, liveness_shell = self.liveness_cli(
                    container["livenessProbe"]["exec"]["command"], name)

                def run_probe(command, port, shell=False, files=tmp):
                    argv = [ARGS.cli] + [
                        local(re.sub(r"^--server=(.*):\d+$", r"--server=\1:" + port, arg), files)
                        for arg in command[1:]]
                    if shell:
                        argv = ["sh", "-c", shlex.join(argv) + ";" + liveness_shell]
                    return subprocess.run(argv, capture_output=True, text=True, timeout=30)

                def probes_give(port, health_exit, alive_exit, ready, files=tmp):
                    """The liveness CLI's own exit code, the liveness probe's, and whether
                    readiness passes."""
                    health = run_probe(liveness, port, files=files)
                    self.assertEqual(health.returncode, health_exit, f"{name}: {health.stderr}")
                    alive = run_probe(liveness, port, shell=True, files=files)
                    self.assertEqual(alive.returncode, alive_exit, f"{name}: {alive.stderr}")
                    readiness = run_probe(probe, port, files=files)
                    self.assertEqual(readiness.returncode == 0, ready,
                                     f"{name}: {readiness.stdout}{readiness.stderr}")

                def no_answer(port, files=tmp):
                    """No answer (the CLI's exit 3): not ready, but alive, so a certificate
                    that cannot be used restarts nothing."""
                    probes_give(port, 3, 0, ready=False, files=files)

                # The server with the Secret's files, without TLS, and with an expired
                # certificate.
                for served in ("tls", "plaintext", "expired"):
                    files = os.path.join(tmp, "expired") if served == "expired" else tmp
                    args = [ARGS.server, "--backend=cpu", "--address=127.0.0.1:0",
                            "--metrics_address=", "--unready_seconds=60",
                            local(f"--auth_token_file={uses['auth_token_file']}")]
                    if served != "plaintext":
                        args += [local(f"--{f}={uses[f]}", files) for f in ("tls_cert", "tls_key")]
                    server = subprocess.Popen(args, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, text=True)
                    try:
                        line = server.stdout.readline()
                        self.assertTrue(line.startswith("listening on "), line)
                        port = line.strip().rsplit(":", 1)[1]
                        # The Secrets the pod mounts, as their files.
                        secrets = {
                            mounts[os.path.dirname(uses["auth_token_file"])]["secret"][
                                "secretName"]: tmp,
                            secret: tmp}
                        if served == "plaintext":
                            self.check_runbooks_look_at_the_server(port, secrets, secret,
                                                                   tls=False)
                        if served != "tls":
                            no_answer(port, files)
                            continue
                        self.check_runbooks_look_at_the_server(port, secrets, secret, tls=True)
                        probes_give(port, 0, 0, ready=True)
                        # Another CA's roots: no answer either.
                        no_answer(port, os.path.join(tmp, "other"))
                        # A probe that cannot run (no CLI in the image) fails, rather than
                        # passing for ever.
                        broken = subprocess.run(
                            ["sh", "-c", "/nonexistent/transpose health;" + liveness_shell],
                            capture_output=True, text=True, timeout=30)
                        self.assertEqual(broken.returncode, 1, f"{name}: {broken.stderr}")
                        # A server that hangs (here: stopped) takes connections but answers
                        # none: the CLI's exit 4, which fails both.
                        server.send_signal(signal.SIGSTOP)
                        try:
                            probes_give(port, 4, 1, ready=False)
                        finally:
                            server.send_signal(signal.SIGCONT)
                        # An answer of NOT_SERVING (here: draining, held there by
                        # --unready_seconds) fails both.
                        server.send_signal(signal.SIGTERM)
                        for _ in range(50):
                            ready = run_probe(probe, port)
                            if ready.returncode != 0:
                                break
                        self.assertEqual(ready.returncode, 1, f"{name}: {ready.stdout}")
                        alive = run_probe(liveness, port, shell=True)
                        self.assertEqual(alive.returncode, 1, f"{name}: {alive.stdout}")
                    finally:
                        server.kill()
                        server.wait(timeout=30)
                        server.stdout.close()

    def objects(self, kind):
        for name, (_, docs) in self.rendered.items():
            for doc in docs:
                if doc and doc["kind"] == kind:
                    yield name, doc

    @needs_kustomize
    def test_every_overlay_renders_and_lints(self):
        self.assertGreaterEqual(len(self.overlays), 2)
        for name, (text, docs) in self.rendered.items():
            kinds = {d["kind"] for d in docs}
            self.assertLessEqual({"Deployment", "Service", "ServiceMonitor", "PrometheusRule",
                                  "HorizontalPodAutoscaler", "ConfigMap", "PodDisruptionBudget",
                                  "NetworkPolicy"},
                                 kinds, name)
            lint = subprocess.run(["yamllint", "-d", "{extends: relaxed, rules: {line-length: disable}}",
                                   "-"], input=text, capture_output=True, text=True)
            self.assertEqual(lint.returncode, 0, name + ": " + lint.stdout)

    @needs_kustomize
    def test_disruption_budget_guards_exactly_the_servers_pods(self):
        for name, (_, docs) in self.rendered.items():
            budgets = [d for d in docs if d and d["kind"] == "PodDisruptionBudget"]
            self.assertEqual(len(budgets), 1, name)
            deployment = next(d for d in docs if d and d["kind"] == "Deployment")
            self.assertEqual(budgets[0]["spec"]["selector"], deployment["spec"]["selector"], name)
            # One pod at a time, and never a budget that forbids draining a lone pod.
            self.assertEqual(budgets[0]["spec"].get("maxUnavailable"), 1, name)
            self.assertNotIn("minAvailable", budgets[0]["spec"], name)

    @needs_kustomize
    def test_callers_need_a_token_and_only_the_namespace_and_monitoring_get_in(self):
        for name, (_, docs) in self.rendered.items():
            deployment = next(d for d in docs if d and d["kind"] == "Deployment")
            pod = deployment["spec"]["template"]["spec"]
            container = pod["containers"][0]
            # The token file is on a read-only Secret volume the server's group may read.
            token_file = flag_uses(container["args"])["auth_token_file"]
            mount = next(m for m in container["volumeMounts"]
                         if token_file.startswith(m["mountPath"] + "/"))
            self.assertIs(mount["readOnly"], True, name)
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            self.assertEqual(volume["secret"]["secretName"], "transpose-auth", name)
            self.assertEqual(volume["secret"]["defaultMode"], 0o440, name)
            self.assertEqual(pod["securityContext"]["fsGroup"],
                             pod["securityContext"]["runAsGroup"], name)
            # gRPC from this namespace, metrics from the monitoring one, by the label that only
            # Kubernetes sets; nothing else.
            policies = [d for d in docs if d and d["kind"] == "NetworkPolicy"]
            self.assertEqual(len(policies), 1, name)
            spec = policies[0]["spec"]
            self.assertEqual(spec["podSelector"], deployment["spec"]["selector"], name)
            self.assertEqual(spec["policyTypes"], ["Ingress"])
            ports = {p["name"] for p in container["ports"]}
            rules = {rule["ports"][0]["port"]: rule["from"] for rule in spec["ingress"]}
            self.assertEqual(set(rules), ports, name)
            self.assertEqual(rules["grpc"], [{"podSelector": {}}], name)
            self.assertEqual(rules["metrics"], [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}], name)

    def test_prometheusrule_is_the_repository_rules_and_promtool_accepts_it(self):
        with open(os.path.join(ARGS.repo, "deploy/prometheus/rules/transpose.rules.yml")) as f:
            rules = yaml.safe_load(f)
        # The file itself, with or without kubectl; then each overlay's rendering of it.
        with open(os.path.join(ARGS.repo, "deploy/k8s/base/prometheusrule.yaml")) as f:
            base = yaml.safe_load(f)
        objects = [("base", base)]
        if KUSTOMIZE_PROBLEM is None:
            objects += self.objects("PrometheusRule")
        for name, rule in objects:
            self.assertEqual(rule["spec"], rules, name)
            with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
                yaml.safe_dump(rule["spec"], f)
                f.flush()
                check = subprocess.run(["promtool", "check", "rules", f.name],
                                       capture_output=True, text=True)
                self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_every_alert_links_its_runbook_section(self):
        with open(os.path.join(ARGS.repo, "deploy/prometheus/rules/transpose.rules.yml")) as f:
            rules = yaml.safe_load(f)
        with open(os.path.join(ARGS.repo, "deploy/RUNBOOK.md")) as f:
            # GitHub's anchors: a heading's text, lower case.
            anchors = {m.lower() for m in re.findall(r"^## (\w+)$", f.read(), re.M)}
        alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
        self.assertGreaterEqual(len(alerts), 6)
        for alert in alerts:
            url = alert["annotations"]["runbook_url"]
            self.assertEqual(url, "deploy/RUNBOOK.md#" + alert["alert"].lower(), alert["alert"])
            self.assertIn(alert["alert"].lower(), anchors, alert["alert"])

    @needs_kustomize
    def test_dashboard_configmap_is_the_repository_dashboard(self):
        """Kubernetes gets the dashboard Compose provisions, labelled for Grafana's sidecar."""
        out = subprocess.run(["kubectl", "kustomize", os.path.join(ARGS.repo, "deploy/grafana")],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        self.assertEqual([d["kind"] for d in docs], ["ConfigMap"])
        config_map = docs[0]
        self.assertEqual(config_map["metadata"]["labels"], {"grafana_dashboard": "1"})
        with open(os.path.join(ARGS.repo, "deploy/grafana/dashboards/transpose.json")) as f:
            self.assertEqual(config_map["data"], {"transpose.json": f.read()})
        dashboard = json.loads(config_map["data"]["transpose.json"])
        self.assertEqual(dashboard["uid"], "transpose-service")
        # kube-prometheus-stack's Prometheus data source and Compose's both have this uid.
        with open(os.path.join(ARGS.repo,
                               "deploy/grafana/provisioning/datasources/prometheus.yml")) as f:
            self.assertEqual(yaml.safe_load(f)["datasources"][0]["uid"], "prometheus")
        uids = set(re.findall(r'"datasource":\s*\{[^}]*"uid":\s*"([^"]+)"',
                              config_map["data"]["transpose.json"]))
        self.assertEqual(uids, {"prometheus"})

    def test_the_base_deployment_uses_real_flags_ports_and_probes(self):
        """The Deployment as deploy/k8s/base holds it, read without kustomize (so it is checked
        where no kubectl renders the overlays): what each overlay's rendered one is checked for."""
        with open(os.path.join(ARGS.repo, "deploy/k8s/base/deployment.yaml")) as f:
            self.check_deployment("base", yaml.safe_load(f))

    def check_deployment(self, name, deployment):
        """Its server's flags are real, its ports and probes match them, the drain fits the grace
        period, the memory limit fits the flags, and each client pod gets a share."""
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        uses = flag_uses(container["args"])
        self.assertLessEqual(set(uses), self.server_flags, name)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.assertEqual(uses["address"].rsplit(":", 1)[1], str(ports["grpc"]), name)
        self.assertEqual(uses["metrics_address"].rsplit(":", 1)[1], str(ports["metrics"]), name)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            self.check_probe(name, container, probe, ports["grpc"], "tls_cert" in uses)
        self.assertIn("nvidia.com/gpu", container["resources"]["limits"])
        # The log's room (the root filesystem is read-only): an overlay that replaced the whole
        # resources block used to drop it.
        for kind in ("requests", "limits"):
            self.assertIn("ephemeral-storage", container["resources"][kind], name)
        # The preStop pause, the unready phase and the drain fit in the grace period.
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(command[0], "sleep", name)
        pause = float(command[1])
        unready = float(uses.get("unready_seconds", self.server_default("unready_seconds")))
        self.assertGreater(pod["terminationGracePeriodSeconds"],
                           float(uses["drain_seconds"]) + pause + unready)
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertIs(pod["automountServiceAccountToken"], False)
        spread = pod["topologySpreadConstraints"][0]
        self.assertEqual(spread["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(spread["labelSelector"]["matchLabels"],
                         {k: v for k, v in deployment["spec"]["selector"]["matchLabels"].items()
                          if k in spread["labelSelector"]["matchLabels"]})
        # The HPA owns the replica count: an apply must not reset it.
        self.assertNotIn("replicas", deployment["spec"], name)
        self.check_memory_budget(name, container, uses)
        # Each flag once: the server would take the last silently, and a reader the first.
        names = [re.match(r"--(\w+)", arg).group(1) for arg in container["args"]]
        self.assertEqual(len(names), len(set(names)), f"{name}: {names}")
        # One client pod gets a share of the budget, not all of it.
        for limit in ("max_inflight_bytes", "max_inflight_requests"):
            total = int(uses.get(limit, self.server_default(limit)))
            per_peer = int(uses[limit + "_per_peer"])
            self.assertTrue(0 < per_peer < total, f"{name}: {limit}_per_peer={per_peer}")
        # A client pod's share takes the largest matrix the pod takes.
        self.assertGreaterEqual(int(uses["max_inflight_bytes_per_peer"]),
                                int(uses.get("max_matrix_bytes",
                                             self.server_default("max_matrix_bytes"))))

    @needs_kustomize
    def test_manifests_use_real_flags_ports_and_names(self):
        for name, deployment in self.objects("Deployment"):
            self.check_deployment(name, deployment)
        services = {s["metadata"]["name"]: s for _, s in self.objects("Service")}
        self.assertEqual(services["transpose-headless"]["spec"]["clusterIP"], "None")
        for _, monitor in self.objects("ServiceMonitor"):
            port_names = {p["name"] for p in services["transpose"]["spec"]["ports"]}
            self.assertIn(monitor["spec"]["endpoints"][0]["port"], port_names)
            # The job the alerts select comes from a label, not from the Service's name.
            job_label = monitor["spec"]["jobLabel"]
            self.assertEqual(services["transpose"]["metadata"]["labels"][job_label], "transpose")
        with open(os.path.join(ARGS.repo, "deploy/prometheus/rules/transpose.rules.yml")) as f:
            self.assertIn('up{job="transpose"}', f.read())

    def test_compose_and_dockerfile_use_real_flags_and_ports(self):
        with open(os.path.join(ARGS.repo, "docker/compose.yaml")) as f:
            compose = yaml.safe_load(f)
        servers = [s for n, s in compose["services"].items() if n.startswith("transpose")]
        self.assertEqual(len(servers), 2)
        for service in servers:
            uses = flag_uses(service["command"])
            self.assertLessEqual(set(uses), self.server_flags)
            published = {p.split(":")[-2] for p in compose["x-server"]["ports"]}
            self.assertIn(uses["address"].rsplit(":", 1)[1], published)
            self.assertIn(uses["metrics_address"].rsplit(":", 1)[1], published)
        # Published on the host's loopback address only: nothing here asks callers for a token.
        for name, service in list(compose["services"].items()) + [("x-server", compose["x-server"])]:
            for port in service.get("ports", []):
                self.assertTrue(port.startswith("127.0.0.1:"), f"{name}: {port}")
        with open(os.path.join(ARGS.repo, "docker/Dockerfile")) as f:
            dockerfile = f.read()
        cmd = re.search(r'^CMD \[(.*)\]$', dockerfile, re.M).group(1)
        self.assertLessEqual(set(flag_uses(re.findall(r'"([^"]*)"', cmd))), self.server_flags)
        # The health check is the staged script (tests/docker_build_test.sh runs it), whose
        # default address is the one the image's server listens on.
        self.assertRegex(dockerfile, r'HEALTHCHECK [^\n]*\\\n\s*CMD \["transpose_healthcheck"\]')
        with open(os.path.join(ARGS.repo, "scripts/healthcheck.sh")) as f:
            script = f.read()
        self.assertLessEqual(set(flag_uses(re.findall(r"(--\w+)=", script))), self.cli_flags)
        # Docker takes exit codes other than 0 and 1 as reserved: the script maps them to 1.
        self.assertRegex(script, r" health \|\| exit 1\n")
        default = re.search(r"TRANSPOSE_HEALTH_SERVER:-([\d.]+:\d+)", script).group(1)
        self.assertEqual(default.rsplit(":", 1)[1],
                         flag_uses(re.findall(r'"([^"]*)"', cmd))["address"].rsplit(":", 1)[1])
        exposed = set(re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split())
        self.assertEqual(exposed, {"50051", "9464"})
        # The image builds through the shared scripts, which tests/docker_build_test.sh runs.
        self.assertIn("scripts/install_deps.sh --build-only", dockerfile)
        self.assertIn("scripts/docker_build.sh", dockerfile)
        # Prometheus scrapes the port the server serves metrics on.
        with open(os.path.join(ARGS.repo, "deploy/prometheus/prometheus.yml")) as f:
            prometheus = yaml.safe_load(f)
        target = prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0]
        self.assertEqual(target, "transpose:9464")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
