#!/usr/bin/env python3
"""Every query of the Grafana dashboard returns series from a real Prometheus scraping a live
Sluice under traffic.

Starts a redis-server, two `sluice serve` on it (the example rules on the Redis store, and a
token bucket on the hybrid store, so that the Redis and the hybrid series exist), and
Prometheus (Debian's `prometheus`) scraping both every second with the alert rules of
deploy/prometheus/ loaded; sends traffic that admits, refuses and shadow-refuses; then asks Prometheus each panel's query, with Grafana's variables
put in as a dashboard showing everything would, until every query returns at least one series.
Also checks that every `sluice_*` metric the dashboard and the alert rules name is one that
Sluice serves, that the alert rules evaluate without errors on live data, and that a refused
rule reload fires SluiceRuleReloadFailed.

Bounded: each wait has a deadline, and every process started here is ended by its PID.

    python3 scripts/dashboard_queries.py --sluice target/debug/sluice
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the dashboard's variables become: every job, instance and domain ("All", whose value
# the dashboard sets to .*), and Grafana's rate interval at a 1 s scrape.
VARIABLES = {
    "$__rate_interval": "10s",
    "$job": ".*",
    "$instance": ".*",
    "$domain": ".*",
}
# How long Prometheus may take to hold series for every query once traffic flows.
SERIES_DEADLINE = 60


def free_port():
    """A port free on 127.0.0.1 below the kernel's range for outgoing connections, so that no
    client's connection takes it between this check and the server's bind."""
    for _ in range(200):
        port = 20000 + int.from_bytes(os.urandom(2), "big") % 12000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def wait_for(what, deadline, attempt):
    """Calls `attempt` until it returns something true, for at most `deadline` seconds."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        try:
            result = attempt()
            if result:
                return result
            last = result
        except (OSError, http.client.HTTPException, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within {deadline} s (last: {last!r})")


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def query(prometheus, expr):
    """The result of an instant query, or raises with Prometheus's error."""
    url = f"http://{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        raise ValueError(f"{expr}: {e.read().decode()}") from None
    if body["status"] != "success":
        raise ValueError(f"{expr}: {body}")
    return body["data"]["result"]


def panel_queries(dashboard):
    """(panel title, query) for every target of every panel, rows' panels included, and
    (annotation name, query) for every annotation that queries Prometheus."""
    def walk(panels):
        for p in panels:
            yield from walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield p["title"], t["expr"]
    annotations = [(a["name"], a["expr"]) for a in dashboard.get("annotations", {}).get("list", [])
                   if a.get("expr")]
    return list(walk(dashboard["panels"])) + annotations


def substitute(expr):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    left = re.findall(r"\$\w+", expr)
    if left:
        raise ValueError(f"unknown dashboard variables {left} in {expr}")
    return expr


class Processes:
    """Processes started here, ended by PID (SIGTERM, then SIGKILL) when the check ends."""

    def __init__(self, logs):
        self.logs = logs
        self.started = []

    def start(self, name, args):
        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.started.append((name, p))
        return p

    def log(self, name):
        with open(os.path.join(self.logs, f"{name}.log")) as f:
            return f.read()

    def stop(self):
        for _, p in reversed(self.started):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for _, p in reversed(self.started):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


# The rules of the hybrid instance: the example's rules include a sliding log, which the hybrid
# store cannot hold.
HYBRID_RULES = """domain: hybrid
descriptors:
  - key: user
    limits:
      - name: per-user
        algorithm: token_bucket
        requests_per_unit: 5
        unit: second
        burst: 10
"""


def traffic(targets, stop):
    """Requests to each instance in turn until `stop` is set. `targets` holds, per instance,
    its HTTP address, domain and entries; each entry is asked in turn. Past the first 5000, a
    steady trickle keeps every rate above zero."""
    conns = []
    for addr, domain, entries in targets:
        host, port = addr.split(":")
        conns.append((http.client.HTTPConnection(host, int(port), timeout=5), domain, entries))
    sent = 0
    while not stop.is_set():
        for conn, domain, entries in conns:
            key, value = entries[sent % len(entries)]
            body = {"domain": domain,
                    "descriptors": [{"entries": [{"key": key, "value": value}]}]}
            conn.request("POST", "/json", json.dumps(body), {"content-type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            if answer.status not in (200, 429):
                raise RuntimeError(f"/json answered {answer.status}")
        sent += 1
        if sent > 5000:
            time.sleep(0.01)


def started(processes, name, process, url):
    """Waits until `url` answers 200, or exits with the process's output if it ends first."""
    def ready():
        if process.poll() is not None:
            sys.exit(f"dashboard_queries: {name} exited:\n{processes.log(name)}")
        return get(url)[0] == 200
    wait_for(f"{name} is ready", 60, ready)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sluice", default=os.path.join(ROOT, "target/debug/sluice"))
    parser.add_argument("--rules", default=os.path.join(ROOT, "examples/rules.yaml"))
    parser.add_argument("--dashboard", default=os.path.join(ROOT, "deploy/grafana/sluice.json"))
    parser.add_argument("--alerts", default=os.path.join(ROOT, "deploy/prometheus/alerts.yaml"))
    args = parser.parse_args()
    for tool in ("redis-server", "prometheus"):
        if not shutil.which(tool):
            sys.exit(f"dashboard_queries: {tool} is not installed")
    with open(args.dashboard) as f:
        dashboard = json.load(f)
    queries = [(title, substitute(expr)) for title, expr in panel_queries(dashboard)]

    work = tempfile.mkdtemp(prefix="sluice-dashboard-")
    processes = Processes(work)
    stop = threading.Event()
    sender = None
    try:
        redis_port, prom_port = free_port(), free_port()
        processes.start("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", work])
        hybrid_rules = os.path.join(work, "hybrid.yaml")
        with open(hybrid_rules, "w") as f:
            f.write(HYBRID_RULES)
        # Two instances on the one Redis: the example rules on the Redis store, and rules the
        # hybrid store holds on it, so that the Redis and the hybrid series both exist.
        instances = {}
        for name, rules, store in [
            ("sluice-redis", args.rules, f"redis://127.0.0.1:{redis_port}"),
            ("sluice-hybrid", hybrid_rules, f"hybrid+redis://127.0.0.1:{redis_port}"),
        ]:
            addr = f"127.0.0.1:{free_port()}"
            process = processes.start(name, [
                args.sluice, "serve", "--config", rules, "--store", store,
                "--http-addr", addr, "--grpc-addr", f"127.0.0.1:{free_port()}"])
            started(processes, name, process, f"http://{addr}/readyz")
            instances[name] = addr

        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [os.path.abspath(args.alerts)],
                "scrape_configs": [{"job_name": "sluice",
                                    "static_configs": [{"targets": list(instances.values())}]}],
            }, f)
        prometheus_addr = f"127.0.0.1:{prom_port}"
        prometheus = processes.start("prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
            f"--web.listen-address={prometheus_addr}", "--log.level=warn"])
        started(processes, "prometheus", prometheus, f"http://{prometheus_addr}/-/ready")

        # On the example rules: admitted ones, refusals (one client address over its 60 a
        # minute, the blocked user agent), and for one tenant more than its shadow rule's 1000
        # an hour. On the hybrid instance: one user over its 5 a second.
        targets = [
            (instances["sluice-redis"], "example",
             [("remote_address", "10.0.0.1"), ("user_agent", "BadBot"), ("tenant", "acme"),
              ("user", "alice")]),
            (instances["sluice-hybrid"], "hybrid", [("user", "bob")]),
        ]
        sender = threading.Thread(target=traffic, args=(targets, stop), daemon=True)
        sender.start()

        # A rule change the hybrid instance reloads, then an invalid file it refuses: the
        # reload panels and annotation have something to show, and SluiceRuleReloadFailed
        # something to fire on.
        hybrid_metrics = f"http://{instances['sluice-hybrid']}/metrics"
        wait_for("Prometheus scrapes the rules before the change", 30, lambda: query(
            prometheus_addr,
            f'sluice_rule_reloads_total{{instance="{instances["sluice-hybrid"]}"}} == 0'))
        with open(hybrid_rules, "w") as f:
            f.write(HYBRID_RULES.replace("requests_per_unit: 5", "requests_per_unit: 6"))
        wait_for("the changed rules are reloaded", 30,
                 lambda: "sluice_rule_reloads_total 1" in get(hybrid_metrics)[1])
        with open(hybrid_rules, "w") as f:
            f.write(HYBRID_RULES.replace("unit: second", "unit: fortnight"))
        wait_for("the invalid rules are refused", 30,
                 lambda: "sluice_rule_reload_failures_total 1" in get(hybrid_metrics)[1])

        empty = {}

        def every_query_has_series():
            empty.clear()
            for title, expr in queries:
                if not query(prometheus_addr, expr):
                    empty[title] = expr
            return not empty

        try:
            wait_for("every panel's query returns series", SERIES_DEADLINE, every_query_has_series)
        except RuntimeError:
            for title, expr in empty.items():
                print(f"dashboard_queries: no series for panel '{title}': {expr}", file=sys.stderr)
            raise

        # Every sluice_* metric the dashboard and the alerts name is one Sluice serves.
        with open(args.alerts) as f:
            alerts = f.read()
        named = set(re.findall(r"\bsluice_[a-z_]+", json.dumps(dashboard) + alerts))
        served = {m for m in named if query(prometheus_addr, f'count({{__name__="{m}"}})')}
        unknown = sorted(named - served)
        if unknown:
            sys.exit(f"dashboard_queries: named but not served by Sluice: {unknown}")

        # The alert rules evaluate on the live series without errors, and the refusals'
        # recording rule holds the example's refusing rules.
        def rules_evaluated():
            with urllib.request.urlopen(f"http://{prometheus_addr}/api/v1/rules", timeout=5) as r:
                groups = json.load(r)["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            broken = [(r["name"], r.get("lastError")) for r in rules if r.get("health") == "err"]
            if broken:
                sys.exit(f"dashboard_queries: alert rules fail on live data: {broken}")
            return all(r.get("health") == "ok" for r in rules)
        wait_for("the alert rules are evaluated", 30, rules_evaluated)
        # Evaluated is not filled: the rule's rate needs two scrapes of a refusal counter, and a
        # group evaluated once may have run before the second.
        try:
            wait_for("sluice:refusals:rate5m holds the refusing rules", 30,
                     lambda: query(prometheus_addr, "sluice:refusals:rate5m"))
        except RuntimeError:
            sys.exit("dashboard_queries: sluice:refusals:rate5m holds no rule")
        # The refused reload fires its alert on the live series.
        wait_for("SluiceRuleReloadFailed fires", 30, lambda: query(
            prometheus_addr, 'ALERTS{alertname="SluiceRuleReloadFailed", alertstate="firing"}'))

        print(f"dashboard_queries: all {len(queries)} queries of the panels and annotations "
              "return series; "
              f"{len(named)} metric names served; alert rules healthy on live data, "
              "SluiceRuleReloadFailed fired on a refused reload")
    finally:
        stop.set()
        if sender:
            sender.join(timeout=10)
        processes.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
