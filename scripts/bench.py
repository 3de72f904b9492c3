#!/usr/bin/env python3
"""Benchmarks of the built binaries with `sluice bench`, each against a baseline in the same run.

    python3 scripts/bench.py [service|redis|gateway|ab|hybrid|peers|usage|cluster|overrides ...] [--runs 3] [--secs 5] [--pin]

- peers: every target of issues #15, #27 and #29 against its peer, in one run, ending in the
  one table of docs/BENCHMARKS.md: each row's figure, its target, its ratio and whether it was
  met or missed. Servers on CPU 0 (taskset), the generator on CPU 1, CPU per answer from
  /proc/PID/stat (utime + stime over the run, divided by the answers), interleaved rounds (the
  order rotated each round), medians of per-round ratios, the load average and the other
  processes' CPU recorded with every run. Every peer is configured with the same limit,
  1,000,000 per second per key, over the same 10,000 keys, so every check admits and writes.
  - memory store, HTTP `/json`: against nginx answering a constant (Debian's nginx, its config
    written to the temporary directory, on a free loopback port, one process), Limitador's
    `POST /check_and_report` and throttlecrab-server's `POST /throttle`;
  - memory store, gRPC `ShouldRateLimit`: against Limitador at 32×1, 128×1, 512×1 and 32×16
    (connections × streams per connection);
  - Redis store: Sluice's CPU per decision against redis-server's in the same run (Redis on
    CPU 1), on HTTP `/json`, HTTP `/v1/check` and gRPC, and the `redis-benchmark -P 16`
    ceiling for the same EVALSHA;
  - hybrid store on cold keys: `hybrid+redis://` against the memory store, both on CPU 0,
    Redis and the generator on CPU 1, HTTP `/json` over 10,000 keys in interleaved rounds:
    CPU per answer against the memory store's, and Redis commands per decision (`INFO
    commandstats` before and after each run);
  - usage (issue #29): a `/v1/reserve` plus a `/v1/settle` against one `/v1/check`, server CPU
    per call on the memory store, in interleaved rounds;
  - gateway: `sluice proxy` and nginx `limit_req` + `proxy_pass` in front of the same upstream,
    closed loop against the upstream direct, then all three at half of Sluice's maximum;
  - in process: criterion's `decisions` bench, token bucket and GCRA against governor keyed on
    one hot key, 100k and 1M keys (once per round; --core-saved reads the last run's), and the
    `key_memory` example's bytes per key at 1M keys.
  throttlecrab-server is installed with `cargo install --root PEERS_DIR/throttlecrab` when
  missing; limitador-server is not on crates.io, so it is built by hand and given with
  --limitador-bin (see docs/BENCHMARKS.md). --skip memory|redis|hybrid|usage|gateway|core
  leaves a part out. A part that measures elsewhere may add its own rows: `print_peers` prints
  every `(path, measured, target, ratio, verdict)` tuple in `res["rows"]` after its own, and
  every text in `res["details"]` after its figures.

- service: `sluice serve` on the memory store, HTTP `/json` and gRPC, against the trivial
  upstream (`sluice bench upstream`) answering the same POST.
- redis: `sluice serve --store redis://` against `redis-benchmark -P 16` running the same
  EVALSHA (the ceiling of one Redis core with this script), then p50/p99 at half load.
- gateway: `sluice proxy` in front of the trivial upstream against the upstream direct, at
  maximum and at a fixed rate of half the proxied maximum. With --pin the gateway has a CPU of
  its own and everything else shares the rest.
- ab: this build against another build of sluice (`--baseline-bin PATH`), on HTTP `/json`,
  gRPC and the gateway: the server under test alone on CPU 0, the generator (always this
  build's) and the upstream on the others. Reports throughput and the server's CPU time per
  answer (utime + stime from /proc/PID/stat over the run, divided by the answers), as medians
  of per-round ratios. CPU per answer does not depend on how the cores are shared.
- hybrid: `sluice serve --store 'hybrid+redis://'` (default 20 ms sync) against the same service
  on the memory store, both alive at once on CPU 0, the generator and redis-server on CPU 1,
  interleaved rounds (memory first, then hybrid first): HTTP `/json` and gRPC on 10,000 keys,
  and HTTP `/json` on --few-keys keys (20), where every key sees many requests per sync
  interval (the table prints how many); then HTTP `/json` on 10,000 keys with both stores at
  one fixed rate, half the hybrid's closed-loop median, where CPU per answer and p99 compare at
  the same work per second. Reports throughput, the server's CPU per answer and
  p99 as medians of per-round ratios; and per decision, from `INFO commandstats` before and
  after each hybrid run: the script calls the store sent (evalsha …), every command Redis ran
  (those inside the scripts included, INFO aside), and redis-server's CPU time, all divided by
  the run's answers (warm-up included on both sides).

- usage: issue #29's budget. A fixed_window budget of 100,000 tokens an hour; 1,000 concurrent
  callers (`sluice bench usage`, 1,000 workers on one thread), each call using 50 to 500
  tokens (uniform, seeded; 500 declared), 10,000 calls in all, more than the budget holds, on a
  fresh descriptor per run. Check-then-report (Envoy's flow on `/json`: `hits_addend` 0, then
  the amount used) against reserve-then-settle (`/v1/reserve` 500, `/v1/settle` the amount
  used), on the memory store, on Redis (one instance), on 3 instances sharing one Redis and on
  3 instances of the hybrid store over one Redis (workers round robin over them): tokens admitted beyond the budget (used by admitted calls
  minus 100,000) and, for reservations, refunds answered against refunds expected, as medians
  of --runs runs. Runs never cross an hour's boundary (the script waits). Then the CPU of a
  reserve plus a settle against one `/v1/check`, on the memory store, the server on CPU 0 and
  the generator on CPU 1, 64 workers over 10,000 keys, the server's utime + stime per call from
  /proc/PID/stat, medians of per-round ratios.

- cluster: issue #27's last row. `sluice serve` on a real 3-master Redis Cluster, HTTP `/json`
  requests of 5 descriptors (each its own counter and slot) against requests of 1, at two fixed
  rates (a tenth and a half of the 5-descriptor closed-loop throughput): p99, p50 and CPU per
  answer of the service (and of the masters), medians of per-round ratios 5 / 1, against the
  target p99 ≤ 1.3×. With --cluster-rtt MS each master is reached through `sluice bench relay`,
  which holds every byte half of MS each way, in whole milliseconds (and up to one more, the
  timer's tick):
  masters on hosts of their own, where on loopback the three share one core and their rounds
  run one after another however they are sent. With
  --baseline-bin, another build measured the same way in the same rounds.

- overrides: issue #26's cost of a runtime override. `sluice serve` on the memory store, pinned
  on CPU 0 (the generator on CPU 1), HTTP `/json` on 1,000 keys of a GCRA rule: a decision on a
  rule on a server with no overrides, one on a rule of a domain that has 1,000 overrides (on
  other descriptors), and one on an overridden descriptor (the 1,000, each set through
  `PUT /v1/overrides/bench`). Reports the server's CPU per answer (utime + stime from
  /proc/PID/stat), as medians of per-round ratios; the target is an overridden decision within
  5% of a rule's.

Every server runs in its own process on loopback; the generator is one more, on one thread.
Runs are interleaved (one of each, then again) and the medians printed as Markdown tables.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "sluice")
KEYS = 10_000

RULES = """
domain: bench
descriptors:
  # Every request is admitted and writes: GCRA with a burst it never reaches.
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000000}
routes:
  - path: /api/*
    descriptors: [[{key: client_ip, from: client_ip}]]
"""

BODY = '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u{n}"}]}]}'

children = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} never listened on {port}")


def pinned(args, cpus):
    """`args` run on `cpus` only (a `taskset` list such as "0" or "1-3"), or anywhere if None."""
    return ["taskset", "-c", cpus, *args] if cpus else args


def start(args, log, cpus=None):
    p = subprocess.Popen(pinned(args, cpus), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    children.append(p)
    return p


def stop_all():
    for p in children:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in children:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def bench(kind, target, *extra, secs, rate=None, concurrency=64, cpus=None, keys=KEYS):
    args = [BIN, "bench", kind, target, "--json", "--duration", f"{secs}s", "--warmup", "1s",
            "--keys", str(keys), "-c", str(concurrency), *extra]
    if rate:
        args += ["--rate", str(rate)]
    out = subprocess.run(pinned(args, cpus), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    report = json.loads(out.stdout)
    if report["errors"]:
        sys.exit(f"{' '.join(args)} had errors: {report['errors']}")
    return report


def http_post(url, secs, **kw):
    return bench("http", url, "-X", "POST", "-d", BODY, secs=secs, **kw)


def grpc(addr, secs, **kw):
    return bench("grpc", addr, "--domain", "bench", "--descriptor", "user=u{n}", secs=secs, **kw)


def redis_benchmark(port, sha, requests=200_000, cpus=None):
    args = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(requests),
            "-c", "50", "-P", "16", "-r", str(KEYS), "--csv",
            # The service's GCRA check: one key, offset 0, commit, algorithm 2, cost 1,
            # burst 1,000,000, interval 1,000 ns, then the unused parameters and token.
            "EVALSHA", sha, "1", "bench:{rb:__rand_int__}", "0", "1", "2", "1", "1000000", "1000",
            "", "", "", ""]
    out = subprocess.run(pinned(args, cpus), capture_output=True, text=True, check=True).stdout
    last = [line for line in out.splitlines() if line.startswith('"EVALSHA')][-1]
    return float(last.split('","')[1])


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(proc, run):
    """`run()`'s report, with the CPU time `proc` spent per answer during it, in µs."""
    before = cpu_seconds(proc.pid)
    report = run()
    report["cpu_us"] = (cpu_seconds(proc.pid) - before) * 1e6 / max(report["requests"], 1)
    return report


def med(values):
    return statistics.median(values)


def row(name, runs, base=None):
    rate = med([r["throughput"] for r in runs])
    p50 = med([r["latency"]["p50_us"] for r in runs])
    p99 = med([r["latency"]["p99_us"] for r in runs])
    ratio = f"{rate / base:.2f}" if base else "1.00"
    return f"| {name} | {rate:,.0f} | {ratio} | {p50:,.0f} | {p99:,.0f} |"


def header(title):
    print(f"\n### {title}\n")
    print("| | answers/s (median) | × baseline | p50 µs | p99 µs |")
    print("|---|---:|---:|---:|---:|")


def start_serve(tmp, log, *extra, rules="rules.yaml", cpus=None):
    """`sluice serve` on the bench rules; returns its HTTP and gRPC ports once it listens."""
    http_port, grpc_port = free_port(), free_port()
    start([BIN, "serve", "--config", os.path.join(tmp, rules),
           "--http-addr", f"127.0.0.1:{http_port}", "--grpc-addr", f"127.0.0.1:{grpc_port}",
           *extra], log, cpus=cpus)
    wait_port(http_port, "the service")
    return http_port, grpc_port


def service(tmp, runs, secs):
    up_port = free_port()
    log = open(os.path.join(tmp, "service.log"), "w")
    start([BIN, "bench", "upstream", "--listen", f"127.0.0.1:{up_port}"], log)
    wait_port(up_port, "the upstream")
    http_port, grpc_port = start_serve(tmp, log)
    base, js, gr = [], [], []
    for _ in range(runs):
        base.append(http_post(f"http://127.0.0.1:{up_port}/json", secs))
        js.append(http_post(f"http://127.0.0.1:{http_port}/json", secs))
        gr.append(grpc(f"127.0.0.1:{grpc_port}", secs))
    b = med([r["throughput"] for r in base])
    header(f"Service on the memory store, closed loop, 64 workers, {runs} × {secs} s")
    print(row("trivial upstream, same POST (**baseline**)", base))
    print(row("`sluice serve` HTTP `/json`", js, b))
    print(row("`sluice serve` gRPC `ShouldRateLimit`", gr, b))


def redis(tmp, runs, secs):
    redis_port = free_port()
    log_path = os.path.join(tmp, "redis-service.log")
    log = open(log_path, "w")
    start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no"], log)
    wait_port(redis_port, "redis-server")
    http_port, grpc_port = start_serve(
        tmp, log, "--store", f"redis://127.0.0.1:{redis_port}", "--store-prefix", "bench")
    sha = re.search(r"check_script=\"?([0-9a-f]{40})", open(log_path).read()).group(1)
    # The script is loaded on the service's first check; redis-benchmark needs it there.
    http_post(f"http://127.0.0.1:{http_port}/json", 1)
    ceiling, js, gr = [], [], []
    for _ in range(runs):
        ceiling.append(redis_benchmark(redis_port, sha))
        js.append(http_post(f"http://127.0.0.1:{http_port}/json", secs))
        gr.append(grpc(f"127.0.0.1:{grpc_port}", secs))
    c = med(ceiling)
    half = max(med([r["throughput"] for r in js]), med([r["throughput"] for r in gr])) / 2
    js_half = [http_post(f"http://127.0.0.1:{http_port}/json", secs, rate=round(half))
               for _ in range(runs)]
    gr_half = [grpc(f"127.0.0.1:{grpc_port}", secs, rate=round(half)) for _ in range(runs)]
    header(f"Service on the Redis store, 64 workers, {runs} × {secs} s")
    print(f"| `redis-benchmark -P 16 -c 50` same EVALSHA (**ceiling**) | {c:,.0f} | 1.00 | | |")
    print(row("`sluice serve` HTTP `/json`, closed loop", js, c))
    print(row("`sluice serve` gRPC, closed loop", gr, c))
    print(row(f"HTTP `/json` at {half:,.0f}/s (half load)", js_half, c))
    print(row(f"gRPC at {half:,.0f}/s (half load)", gr_half, c))


def gateway(tmp, runs, secs, pin=False):
    rules = os.path.join(tmp, "rules.yaml")
    up_port, proxy_port = free_port(), free_port()
    log = open(os.path.join(tmp, "gateway.log"), "w")
    # With --pin, the gateway has the last CPU to itself; the generator and the upstream share
    # the others, in both the direct and the proxied runs.
    last = (os.cpu_count() or 1) - 1
    rest = (f"0-{last - 1}" if last > 1 else "0") if pin and last > 0 else None
    own = str(last) if rest else None
    start([BIN, "bench", "upstream", "--listen", f"127.0.0.1:{up_port}"], log, cpus=rest)
    start([BIN, "proxy", "--config", rules, "--listen", f"127.0.0.1:{proxy_port}",
           "--upstream", f"http://127.0.0.1:{up_port}"], log, cpus=own)
    wait_port(up_port, "the upstream")
    wait_port(proxy_port, "the gateway")
    direct_url = f"http://127.0.0.1:{up_port}/api/items/{{n}}"
    proxy_url = f"http://127.0.0.1:{proxy_port}/api/items/{{n}}"
    direct, proxied = [], []
    for _ in range(runs):
        direct.append(bench("http", direct_url, secs=secs, cpus=rest))
        proxied.append(bench("http", proxy_url, secs=secs, cpus=rest))
    half = med([r["throughput"] for r in proxied]) / 2
    direct_half, proxied_half = [], []
    for _ in range(runs):
        direct_half.append(bench("http", direct_url, secs=secs, rate=round(half), cpus=rest))
        proxied_half.append(bench("http", proxy_url, secs=secs, rate=round(half), cpus=rest))
    d = med([r["throughput"] for r in direct])
    placement = f", gateway alone on CPU {own}" if own else ""
    header(f"Gateway, GET /api/items/{{n}}, 64 workers, {runs} × {secs} s{placement}")
    print(row("trivial upstream direct (**baseline**), closed loop", direct))
    print(row("through `sluice proxy`, closed loop", proxied, d))
    print(row(f"direct at {half:,.0f}/s (half the proxied maximum)", direct_half, d))
    print(row(f"through `sluice proxy` at {half:,.0f}/s", proxied_half, d))
    for q in ["p50_us", "p99_us"]:
        added = med([p["latency"][q] for p in proxied_half]) - med([x["latency"][q] for x in direct_half])
        print(f"\nAdded {q[:-3]} at half load: {added:,.0f} µs", end="")
    print()


def ab(tmp, runs, secs, baseline_bin):
    last = (os.cpu_count() or 1) - 1
    own, rest = ("0", f"1-{last}" if last > 1 else "1") if last > 0 else (None, None)
    up_port = free_port()
    log = open(os.path.join(tmp, "ab.log"), "w")
    start([BIN, "bench", "upstream", "--listen", f"127.0.0.1:{up_port}"], log, cpus=rest)
    wait_port(up_port, "the upstream")
    rules = os.path.join(tmp, "rules.yaml")
    servers = {}
    for name, binary in [("baseline", baseline_bin), ("this", BIN)]:
        http_port, grpc_port, proxy_port = free_port(), free_port(), free_port()
        serve = start([binary, "serve", "--config", rules, "--http-addr", f"127.0.0.1:{http_port}",
                       "--grpc-addr", f"127.0.0.1:{grpc_port}"], log, cpus=own)
        proxy = start([binary, "proxy", "--config", rules, "--listen", f"127.0.0.1:{proxy_port}",
                       "--upstream", f"http://127.0.0.1:{up_port}"], log, cpus=own)
        wait_port(http_port, f"{name} serve")
        wait_port(proxy_port, f"{name} proxy")
        servers[name] = {
            "HTTP `/json`": lambda p=serve, port=http_port: with_cpu(p, lambda: http_post(
                f"http://127.0.0.1:{port}/json", secs, cpus=rest)),
            "gRPC `ShouldRateLimit`": lambda p=serve, port=grpc_port: with_cpu(p, lambda: grpc(
                f"127.0.0.1:{port}", secs, cpus=rest)),
            "gateway GET": lambda p=proxy, port=proxy_port: with_cpu(p, lambda: bench(
                "http", f"http://127.0.0.1:{port}/api/items/{{n}}", secs=secs, cpus=rest)),
        }
    results = {path: {"baseline": [], "this": []} for path in servers["this"]}
    for round_ in range(runs):
        order = ["baseline", "this"] if round_ % 2 == 0 else ["this", "baseline"]
        for path in results:
            for name in order:
                results[path][name].append(servers[name][path]())
    print(f"\n### This build against `{baseline_bin}`, {runs} interleaved rounds × {secs} s\n")
    print("| path | baseline answers/s | this answers/s | × baseline | baseline CPU µs/answer "
          "| this CPU µs/answer | × baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, by in results.items():
        old, new = by["baseline"], by["this"]
        rate_ratio = med([n["throughput"] / o["throughput"] for o, n in zip(old, new)])
        cpu_ratio = med([n["cpu_us"] / o["cpu_us"] for o, n in zip(old, new)])
        print(f"| {path} | {med([r['throughput'] for r in old]):,.0f} "
              f"| {med([r['throughput'] for r in new]):,.0f} | {rate_ratio:.2f} "
              f"| {med([r['cpu_us'] for r in old]):.1f} | {med([r['cpu_us'] for r in new]):.1f} "
              f"| {cpu_ratio:.2f} |")


SYNC_INTERVAL = 0.020  # the hybrid store's default sync_interval, in seconds


# What a client sends to run a script; every other command in `INFO commandstats` here is run by
# the scripts themselves (Redis counts those too), or is a connection's set-up.
SCRIPT_CALLS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "script"}


def redis_calls(port):
    """Calls of every command Redis has run, from `INFO commandstats`, INFO itself left out."""
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "INFO", "commandstats"],
                         capture_output=True, text=True, check=True).stdout
    calls = {}
    for m in re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", out, re.M):
        if m.group(1) != "info":
            calls[m.group(1)] = int(m.group(2))
    return calls


def decision_buckets(port):
    """The server's `decision_latency_seconds` histogram: cumulative counts by upper bound."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {float(m.group(1)): int(m.group(2)) for m in re.finditer(
        r'^sluice_decision_latency_seconds_bucket\{le="([^"]+)"\} (\d+)$', text, re.M)}


def bucket_quantile(before, after, q):
    """Quantile `q`, in µs, of the decisions counted between two `decision_buckets` readings,
    interpolated linearly inside its bucket (the buckets double, 1 µs to 0.5 s)."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0)
    lower, below = 0.0, 0
    for bound in bounds:
        count = after[bound] - before.get(bound, 0)
        if count >= q * total:
            if bound == float("inf"):
                return lower * 1e6
            return (lower + (bound - lower) * (q * total - below) / max(count - below, 1)) * 1e6
        lower, below = bound, count
    return lower * 1e6


def hybrid(tmp, runs, secs, few_keys):
    last = (os.cpu_count() or 1) - 1
    own, rest = ("0", f"1-{last}" if last > 1 else "1") if last > 0 else (None, None)
    rules = os.path.join(tmp, "rules.yaml")
    log = open(os.path.join(tmp, "hybrid.log"), "w")
    redis_port = free_port()
    redis_proc = start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no"], log, cpus=rest)
    wait_port(redis_port, "redis-server")
    stores = {"memory": ["--store", "memory"],
              "hybrid": ["--store", f"hybrid+redis://127.0.0.1:{redis_port}", "--store-prefix", "bench"]}
    servers, procs = {}, {}
    for name, store in stores.items():
        http_port, grpc_port = free_port(), free_port()
        serve = start([BIN, "serve", "--config", rules, "--http-addr", f"127.0.0.1:{http_port}",
                       "--grpc-addr", f"127.0.0.1:{grpc_port}", *store], log, cpus=own)
        wait_port(http_port, f"{name} serve")
        procs[name] = (serve, http_port)
        servers[name] = {
            f"HTTP `/json`, {KEYS:,} keys": lambda p=serve, port=http_port: with_cpu(p, lambda: http_post(
                f"http://127.0.0.1:{port}/json", secs, cpus=rest)),
            f"gRPC `ShouldRateLimit`, {KEYS:,} keys": lambda p=serve, port=grpc_port: with_cpu(p, lambda: grpc(
                f"127.0.0.1:{port}", secs, cpus=rest)),
            f"HTTP `/json`, {few_keys:,} keys": lambda p=serve, port=http_port: with_cpu(p, lambda: http_post(
                f"http://127.0.0.1:{port}/json", secs, cpus=rest, keys=few_keys)),
        }
    keys_of = dict(zip(servers["memory"], [KEYS, KEYS, few_keys]))
    # Every path once on each store before measuring: connections, allocator, the script loaded.
    for by in servers.values():
        for run in by.values():
            run()
    results = {path: {"memory": [], "hybrid": []} for path in servers["memory"]}
    loads = [os.getloadavg()[0]]

    def measure(paths):
        for round_ in range(runs):
            order = ["memory", "hybrid"] if round_ % 2 == 0 else ["hybrid", "memory"]
            for path in paths:
                for name in order:
                    before, redis_cpu = redis_calls(redis_port), cpu_seconds(redis_proc.pid)
                    decided = decision_buckets(procs[name][1])
                    report = servers[name][path]()
                    after = redis_calls(redis_port)
                    now = decision_buckets(procs[name][1])
                    report["decision_us"] = {q: bucket_quantile(decided, now, q) for q in (0.5, 0.99, 0.999)}
                    report["redis_cpu_us"] = (cpu_seconds(redis_proc.pid) - redis_cpu) * 1e6 / max(report["requests"], 1)
                    report["script_calls"] = sum(n - before.get(c, 0) for c, n in after.items() if c in SCRIPT_CALLS)
                    report["redis_calls"] = sum(after.values()) - sum(before.values())
                    report["redis_by_cmd"] = {c: n - before.get(c, 0) for c, n in after.items()
                                              if n != before.get(c, 0)}
                    results[path][name].append(report)
                    loads.append(os.getloadavg()[0])

    measure(list(results))
    # Closed loop, Redis's CPU on the generator's core lowers the hybrid's throughput, and a
    # server that is not saturated pays more per answer (fewer answers per wake-up). At one fixed
    # rate, half the hybrid's closed-loop median, both stores do the same work per second: CPU
    # per answer and p99 compare like for like.
    cold = f"HTTP `/json`, {KEYS:,} keys"
    rate = round(med([r["throughput"] for r in results[cold]["hybrid"]]) / 2)
    paced = f"{cold}, at {rate:,}/s"
    for name, by in servers.items():
        proc, port = procs[name]
        by[paced] = lambda p=proc, port=port: with_cpu(p, lambda: http_post(
            f"http://127.0.0.1:{port}/json", secs, cpus=rest, rate=rate))
    keys_of[paced] = KEYS
    results[paced] = {"memory": [], "hybrid": []}
    measure([paced])
    print(f"\n### Hybrid store against the memory store, {runs} interleaved rounds × {secs} s, "
          f"server on CPU {own}, generator and Redis on CPU {rest}\n")
    print(f"Load average (1 min) over the run: median {med(loads):.1f}, {min(loads):.1f} to {max(loads):.1f}\n")
    print("| path | memory answers/s | hybrid answers/s | × memory | memory CPU µs/answer "
          "| hybrid CPU µs/answer | × memory | memory p99 µs | hybrid p99 µs | × memory |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratio = lambda old, new, f: med([f(n) / f(o) for o, n in zip(old, new)])
    for path, by in results.items():
        mem, hyb = by["memory"], by["hybrid"]
        tp, cpu, p99 = (lambda r: r["throughput"]), (lambda r: r["cpu_us"]), (lambda r: r["latency"]["p99_us"])
        print(f"| {path} | {med([tp(r) for r in mem]):,.0f} | {med([tp(r) for r in hyb]):,.0f} "
              f"| {ratio(mem, hyb, tp):.2f} | {med([cpu(r) for r in mem]):.1f} "
              f"| {med([cpu(r) for r in hyb]):.1f} | {ratio(mem, hyb, cpu):.2f} "
              f"| {med([p99(r) for r in mem]):,.0f} | {med([p99(r) for r in hyb]):,.0f} "
              f"| {ratio(mem, hyb, p99):.2f} |")
    print("\nA decision's latency in the server (its `decision_latency_seconds` histogram, from the "
          "limiter's start to its verdict, the store's mutex included; warm-up included; "
          "interpolated inside doubling buckets), medians of the runs:\n")
    print("| path | memory p50 µs | hybrid p50 µs | memory p99 µs | hybrid p99 µs | × memory "
          "| memory p99.9 µs | hybrid p99.9 µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path, by in results.items():
        mem, hyb = by["memory"], by["hybrid"]
        d = lambda q: (lambda r: r["decision_us"][q])
        print(f"| {path} | {med([d(0.5)(r) for r in mem]):.1f} | {med([d(0.5)(r) for r in hyb]):.1f} "
              f"| {med([d(0.99)(r) for r in mem]):.1f} | {med([d(0.99)(r) for r in hyb]):.1f} "
              f"| {ratio(mem, hyb, d(0.99)):.2f} "
              f"| {med([d(0.999)(r) for r in mem]):.1f} | {med([d(0.999)(r) for r in hyb]):.1f} |")
    print("\nRedis on the hybrid store, per run over the run's answers (warm-up included), medians; "
          "script calls are what the store sends, commands every command Redis ran, those the "
          "scripts run included:\n")
    print("| path | requests per key per sync interval | script calls per decision | range "
          "| commands per decision | Redis CPU µs/answer | calls by command (median run) |")
    print("|---|---:|---:|---|---:|---:|---|")
    for path, by in results.items():
        hyb = by["hybrid"]
        per = [r["script_calls"] / max(r["requests"], 1) for r in hyb]
        mid = sorted(hyb, key=lambda r: r["script_calls"] / max(r["requests"], 1))[len(hyb) // 2]
        per_key = med([r["throughput"] for r in hyb]) * SYNC_INTERVAL / keys_of[path]
        cmds = ", ".join(f"{c} {n:,}" for c, n in sorted(mid["redis_by_cmd"].items()))
        print(f"| {path} | {per_key:,.2f} | {med(per):.4f} | {min(per):.4f} to {max(per):.4f} "
              f"| {med([r['redis_calls'] / max(r['requests'], 1) for r in hyb]):.3f} "
              f"| {med([r['redis_cpu_us'] for r in hyb]):.2f} "
              f"| {cmds} over {mid['requests']:,} answers |")
    print(f"\nRedis CPU µs/answer during the memory runs (idle Redis, heartbeat only): "
          f"{med([r['redis_cpu_us'] for by in results.values() for r in by['memory']]):.2f}")
    for path, by in results.items():
        for name, reps in by.items():
            bad = sum(r["limited"] + sum(r["errors"].values()) for r in reps)
            if bad:
                print(f"\nWarning: {name} {path}: {bad} answers limited or failed")
    print("\nPer-round throughput (memory / hybrid):")
    for path, by in results.items():
        print(f"- {path}: " + ", ".join(f"{m['throughput']:,.0f} / {h['throughput']:,.0f}"
                                        for m, h in zip(by["memory"], by["hybrid"])))


# ---------------------------------------------------------------------------------------------
# peers: every target of issue #15 against its peer, in one run.

SERVER_CPU, GEN_CPU = "0", "1"
PEERS_DIR = os.environ.get("SLUICE_PEERS_DIR", "/tmp/sluice-peers")
THROTTLECRAB_VERSION = "0.4.40"

# The same limit everywhere: 1,000,000 per second on each key, which no key comes near (each of
# the 10,000 sees a few requests a second), so every answer is an admission that writes.
PEER_RULES = """
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: gcra}
routes:
  - path: /api/*
    descriptors: [[{key: client_ip, from: client_ip}]]
"""

# Limitador counts fixed windows: 1,000,000 per 1 s window, one counter per value of `user`.
LIMITADOR_LIMITS = """
- namespace: bench
  max_value: 1000000
  seconds: 1
  conditions: []
  variables:
    - "descriptors[0]['user']"
"""
LIMITADOR_BODY = '{"namespace":"bench","values":{"user":"u{n}"},"delta":1}'
# throttlecrab's GCRA: a burst of 1,000,000 and 1,000,000 per 1 s period, per key.
THROTTLECRAB_BODY = '{"key":"u{n}","max_burst":1000000,"count_per_period":1000000,"period":1,"quantity":1}'

NGINX_COMMON = """
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx-{name}.pid;
error_log {tmp}/nginx-{name}.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/nginx-{name}-body;
  proxy_temp_path {tmp}/nginx-{name}-proxy;
  fastcgi_temp_path {tmp}/nginx-{name}-fastcgi;
  uwsgi_temp_path {tmp}/nginx-{name}-uwsgi;
  scgi_temp_path {tmp}/nginx-{name}-scgi;
  keepalive_requests 1000000000;
  keepalive_timeout 600s;
{http}
}}
"""

NGINX_CONSTANT = """
  server {{
    listen 127.0.0.1:{port};
    location / {{
      default_type application/json;
      return 200 '{body}';
    }}
  }}
"""

# nginx `limit_req` on the client address at the same 1,000,000 per second (and as large a
# burst), in front of the same upstream through a keep-alive pool.
NGINX_GATEWAY = """
  limit_req_zone $binary_remote_addr zone=perip:10m rate=1000000r/s;
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location /api/ {{
      limit_req zone=perip burst=1000000 nodelay;
      limit_req_status 429;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
"""

GRPC_SHAPES = [(32, 1), (128, 1), (512, 1), (32, 16)]  # connections × streams per connection
CORE_FILTER = r"^(token_bucket|gcra|governor)/(hot|100k|1M)/1t$"
CORE_ALGORITHMS = ["token_bucket", "gcra"]
CORE_KEYS = ["hot", "100k", "1M"]


def need(path, what, how):
    if not path or not os.access(path, os.X_OK):
        sys.exit(f"{what} is missing ({path or 'not on PATH'}): {how}")
    return path


def nginx_bin():
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    return need(path, "nginx", "install Debian's package: apt-get update && apt-get install -y nginx "
                "(the script writes its own config, and starts and stops nginx itself)")


def throttlecrab_bin(peers_dir):
    """throttlecrab-server, installed from crates.io into `peers_dir` if it is not there yet."""
    root = os.path.join(peers_dir, "throttlecrab")
    path = os.path.join(root, "bin", "throttlecrab-server")
    if not os.path.exists(path):
        print(f"installing throttlecrab-server {THROTTLECRAB_VERSION} from crates.io into {root} "
              "(a few minutes)", file=sys.stderr, flush=True)
        done = subprocess.run(["cargo", "install", "--locked", "--root", root,
                               "--version", THROTTLECRAB_VERSION, "throttlecrab-server"])
        if done.returncode != 0:
            sys.exit(f"cargo install throttlecrab-server failed (above); install it with "
                     f"`cargo install --root {root} throttlecrab-server` and run again")
    return need(path, "throttlecrab-server", f"cargo install --root {root} throttlecrab-server")


def limitador_bin(given, peers_dir):
    path = given or os.path.join(peers_dir, "limitador", "limitador-server")
    return need(path, "limitador-server",
                "it is not on crates.io. Build it from its repository (github.com/Kuadrant/limitador: "
                "`cargo build --release -p limitador-server`, which needs protoc and libclang) in a "
                "directory of your own, outside this one, and pass the binary with "
                f"--limitador-bin PATH, or put it at {path}")


def busy_seconds():
    """CPU time the whole machine has spent so far (user, nice, system, irq, softirq and steal
    from the first line of /proc/stat; not idle or iowait), in seconds."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[i] for i in (0, 1, 2, 5, 6, 7) if i < len(v)) / os.sysconf("SC_CLK_TCK")


def ours_seconds():
    """CPU time of the servers this script runs and of the children it has waited for (the
    generators, redis-benchmark, cargo), in seconds."""
    own = 0.0
    for p in children:
        try:
            own += cpu_seconds(p.pid)
        except OSError:
            pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + ru.ru_utime + ru.ru_stime


def sample(run, procs, requests=None):
    """`run()`'s report, with the CPU time of each of `procs` ({name: Popen}) per answer in µs
    (`cpu_us` is the first's), the 1-minute load average after it, `generator`: the share of a
    core the generator used, and `others`: how many cores the rest of the machine (not this
    script's processes) kept busy during the run."""
    before = {n: cpu_seconds(p.pid) for n, p in procs.items()}
    busy, ours, t = busy_seconds(), ours_seconds(), time.monotonic()
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = run()
    wall = time.monotonic() - t
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The generator's share of its CPU: near 1, it and not the server set the pace.
    report["generator"] = ((done.ru_utime + done.ru_stime) - (waited.ru_utime + waited.ru_stime)) / wall
    answers = max(report["requests"], 1)
    report["cpu"] = {n: (cpu_seconds(p.pid) - before[n]) * 1e6 / answers for n, p in procs.items()}
    report["cpu_us"] = next(iter(report["cpu"].values()))
    report["others"] = max(0.0, (busy_seconds() - busy) - (ours_seconds() - ours)) / wall
    report["load"] = os.getloadavg()[0]
    return report


def rounds(runs, runners, label):
    """Every runner once per round, the order rotated each round: {name: [report per round]}."""
    out = {name: [] for name in runners}
    names = list(runners)
    for r in range(runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            print(f"  {label}, round {r + 1}/{runs}: {name}", file=sys.stderr, end="", flush=True)
            report = runners[name]()
            # Each run's figures in the log, so that a median can be told from its spread.
            print(f": {report['throughput']:,.0f}/s, {report.get('cpu_us', 0):.2f} µs",
                  file=sys.stderr, flush=True)
            out[name].append(report)
    return out


def tp(r):
    return r["throughput"]


def p99(r):
    return r["latency"]["p99_us"]


def cpu(r):
    return r["cpu_us"]


def per_round(a, b, f):
    """The median over rounds of f(a's report) / f(b's report), both from the same round."""
    return med([f(x) / f(y) for x, y in zip(a, b)])


def conditions(reports):
    """The load average and the other processes' cores over `reports`, and whether that was a
    busy machine: the neighbours kept more than a quarter of a core busy (median over runs)."""
    loads = [r["load"] for r in reports]
    others = med([r["others"] for r in reports])
    return {"loads": (min(loads), med(loads), max(loads)), "others": others, "busy": others > 0.25}


def conditions_text(c):
    lo, mid, hi = c["loads"]
    text = (f"load average {mid:.1f} ({lo:.1f}–{hi:.1f}), other processes {c['others']:.2f} "
            f"cores")
    return text + ", **busy**" if c["busy"] else text


def http_runner(url, body, secs, *extra):
    return lambda s=secs: bench("http", url, "-X", "POST", "-d", body, *extra, secs=s, cpus=GEN_CPU)


def peer_memory(tmp, log, runs, secs, bins):
    """HTTP `/json` against nginx's constant answer, Limitador's `/check_and_report` and
    throttlecrab's `/throttle`; gRPC against Limitador at every shape of GRPC_SHAPES. Every
    server is alive throughout, on CPU 0; the generator runs on CPU 1."""
    http_port, grpc_port = start_serve(tmp, log, rules="peers.yaml", cpus=SERVER_CPU)
    serve = children[-1]
    url = f"http://127.0.0.1:{http_port}/json"
    # nginx returns, as its constant, the very body Sluice answered the first request with.
    body = urllib.request.urlopen(urllib.request.Request(
        url, data=BODY.replace("{n}", "0").encode(),
        headers={"content-type": "application/json"})).read().decode()
    nginx_port = free_port()
    conf = os.path.join(tmp, "nginx-constant.conf")
    with open(conf, "w") as f:
        f.write(NGINX_COMMON.format(tmp=tmp, name="constant", http=NGINX_CONSTANT.format(
            port=nginx_port, body=body.replace("\\", "\\\\").replace("'", "\\'"))))
    nginx = start([bins["nginx"], "-p", tmp, "-c", conf, "-e", os.path.join(tmp, "nginx-constant.log")],
                  log, cpus=SERVER_CPU)
    lim_http, lim_grpc = free_port(), free_port()
    limits = os.path.join(tmp, "limitador.yaml")
    with open(limits, "w") as f:
        f.write(LIMITADOR_LIMITS)
    # A cache of 100,000 counters, so that none of the 10,000 is evicted.
    limitador = start([bins["limitador"], "--http-ip", "127.0.0.1", "--http-port", str(lim_http),
                       "--rls-ip", "127.0.0.1", "--rls-port", str(lim_grpc), limits,
                       "memory", "--cache", "100000"], log, cpus=SERVER_CPU)
    crab_port = free_port()
    crab = start([bins["throttlecrab"], "--http", "--http-host", "127.0.0.1", "--http-port",
                  str(crab_port), "--log-level", "warn"], log, cpus=SERVER_CPU)
    for port, what in [(nginx_port, "nginx"), (lim_http, "limitador-server"), (lim_grpc, "limitador-server gRPC"),
                       (crab_port, "throttlecrab-server")]:
        wait_port(port, what)

    http = {
        "sluice": (serve, http_runner(url, BODY, secs)),
        "nginx": (nginx, http_runner(f"http://127.0.0.1:{nginx_port}/json", BODY, secs)),
        "limitador": (limitador, http_runner(f"http://127.0.0.1:{lim_http}/check_and_report",
                                             LIMITADOR_BODY, secs)),
        "throttlecrab": (crab, http_runner(f"http://127.0.0.1:{crab_port}/throttle", THROTTLECRAB_BODY,
                                           secs, "--limited-body", '"allowed":false')),
    }
    for _, run in http.values():  # untimed: connections, allocators, the 10,000 keys
        run(1)
    out = {"http": rounds(runs, {n: (lambda p=p, run=run: sample(run, {"server": p}))
                                 for n, (p, run) in http.items()}, "HTTP /json")}

    def grpc_runner(proc, port, conns, streams):
        return lambda: sample(lambda: bench(
            "grpc", f"127.0.0.1:{port}", "--domain", "bench", "--descriptor", "user=u{n}",
            "--connections", str(conns), secs=secs, concurrency=conns * streams, cpus=GEN_CPU),
            {"server": proc})

    out["grpc"] = {}
    for conns, streams in GRPC_SHAPES:
        out["grpc"][(conns, streams)] = rounds(runs, {
            "sluice": grpc_runner(serve, grpc_port, conns, streams),
            "limitador": grpc_runner(limitador, lim_grpc, conns, streams),
        }, f"gRPC {conns}×{streams}")
    return out


def peer_redis(tmp, log, runs, secs):
    """The Redis store: Sluice's CPU per decision against redis-server's during the same run,
    and the `redis-benchmark -P 16` ceiling for the same EVALSHA. redis-server has CPU 1 (with
    the generator); Sluice, or redis-benchmark for the ceiling, CPU 0."""
    redis_port = free_port()
    redis = start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"], log, cpus=GEN_CPU)
    wait_port(redis_port, "redis-server")
    log_path = log.name
    http_port, grpc_port = start_serve(tmp, log, "--store", f"redis://127.0.0.1:{redis_port}",
                                       "--store-prefix", "bench", rules="peers.yaml", cpus=SERVER_CPU)
    serve = children[-1]
    url = f"http://127.0.0.1:{http_port}/json"
    http_runner(url, BODY, secs)(1)  # loads the script; redis-benchmark needs it there
    log.flush()
    found = re.findall(r"check_script=\"?([0-9a-f]{40})", open(log_path).read())
    if not found:
        sys.exit(f"the service did not log its check script's SHA (check_script=…) in {log_path}")
    sha = found[-1]
    requests = 200_000

    def ceiling():
        report = {"requests": requests}
        report["throughput"] = redis_benchmark(redis_port, sha, requests=requests, cpus=SERVER_CPU)
        return report

    grpc = lambda: bench("grpc", f"127.0.0.1:{grpc_port}", "--domain", "bench", "--descriptor",
                         "user=u{n}", secs=secs, cpus=GEN_CPU)
    grpc()
    check = f"http://127.0.0.1:{http_port}/v1/check"
    http_runner(check, BODY, secs)(1)
    return rounds(runs, {
        "ceiling": lambda: sample(ceiling, {"redis": redis}),
        "http": lambda: sample(http_runner(url, BODY, secs), {"server": serve, "redis": redis}),
        "http_check": lambda: sample(http_runner(check, BODY, secs), {"server": serve, "redis": redis}),
        "grpc": lambda: sample(grpc, {"server": serve, "redis": redis}),
    }, "Redis store")


def peer_hybrid(tmp, log, runs, secs):
    """The hybrid store on cold keys against the memory store: both services alive throughout on
    CPU 0, redis-server and the generator on CPU 1, HTTP `/json` closed loop over 10,000 keys in
    interleaved rounds; each hybrid run also counts the commands Redis ran."""
    redis_port = free_port()
    redis_proc = start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no"], log, cpus=GEN_CPU)
    wait_port(redis_port, "redis-server")
    stores = {"memory": ["--store", "memory"],
              "hybrid": ["--store", f"hybrid+redis://127.0.0.1:{redis_port}", "--store-prefix", "bench"]}
    runners = {}
    for name, store in stores.items():
        http_port, _ = start_serve(tmp, log, *store, rules="peers.yaml", cpus=SERVER_CPU)
        runners[name] = (children[-1], http_runner(f"http://127.0.0.1:{http_port}/json", BODY, secs))
    for _, run in runners.values():  # untimed: connections, allocator, the keys, the scripts
        run(1)

    def measured(name):
        proc, run = runners[name]

        def one():
            before = redis_calls(redis_port)
            report = sample(run, {"server": proc, "redis": redis_proc})
            after = redis_calls(redis_port)
            report["redis_calls"] = sum(after.values()) - sum(before.values())
            return report
        return one

    return rounds(runs, {name: measured(name) for name in runners}, "hybrid, cold keys")


def peer_usage(tmp, log, runs, secs):
    """A `/v1/reserve` plus a `/v1/settle` (one call of `sluice bench usage`) against one
    `/v1/check`, on one service on the memory store on CPU 0, the generator on CPU 1: closed
    loop, and both at `USAGE_PACE` HTTP requests a second. The kernel's cost per request falls
    as the rate rises, and closed loop a check runs at more requests a second than a pair (its
    generator does less per request), so only at one rate does the ratio compare the calls'
    own costs."""
    with open(os.path.join(tmp, "usage.yaml"), "w") as f:
        f.write(USAGE_RULES)
    port, _ = start_serve(tmp, log, rules="usage.yaml", cpus=SERVER_CPU)
    proc = children[-1]
    url = f"http://127.0.0.1:{port}"
    check = lambda s=secs, rate=None: bench("http", f"{url}/v1/check", "-X", "POST", "-d",
                                            USAGE_CHECK_BODY, secs=s, rate=rate, cpus=GEN_CPU)
    call = lambda s=secs, rate=None: bench("usage", url, "--flow", "reserve", "--domain", "llm",
                                           "--descriptor", "user=u{n}", "--ttl", "5m", secs=s,
                                           rate=rate, cpus=GEN_CPU)
    check(1)
    call(1)
    return rounds(runs, {
        "check": lambda: sample(check, {"server": proc}),
        "reserve_settle": lambda: sample(call, {"server": proc}),
        "check_paced": lambda: sample(lambda: check(rate=USAGE_PACE), {"server": proc}),
        "reserve_settle_paced": lambda: sample(lambda: call(rate=USAGE_PACE // 2), {"server": proc}),
    }, "usage calls")


def peer_gateway(tmp, log, runs, secs, bins):
    """`sluice proxy` and nginx `limit_req` on CPU 0 in front of the same trivial upstream on
    CPU 1 (with the generator): closed loop against the upstream direct, then every path at half
    of Sluice's maximum."""
    up_port, proxy_port, nginx_port = free_port(), free_port(), free_port()
    start([BIN, "bench", "upstream", "--listen", f"127.0.0.1:{up_port}"], log, cpus=GEN_CPU)
    upstream = children[-1]
    proxy = start([BIN, "proxy", "--config", os.path.join(tmp, "peers.yaml"), "--listen",
                   f"127.0.0.1:{proxy_port}", "--upstream", f"http://127.0.0.1:{up_port}"], log,
                  cpus=SERVER_CPU)
    conf = os.path.join(tmp, "nginx-gateway.conf")
    with open(conf, "w") as f:
        f.write(NGINX_COMMON.format(tmp=tmp, name="gateway", http=NGINX_GATEWAY.format(
            port=nginx_port, upstream=up_port)))
    nginx = start([bins["nginx"], "-p", tmp, "-c", conf, "-e", os.path.join(tmp, "nginx-gateway.log")],
                  log, cpus=SERVER_CPU)
    for port, what in [(up_port, "the upstream"), (proxy_port, "sluice proxy"), (nginx_port, "nginx")]:
        wait_port(port, what)
    paths = {"direct": (upstream, up_port), "sluice": (proxy, proxy_port), "nginx": (nginx, nginx_port)}

    def runner(name, rate=None, s=secs):
        proc, port = paths[name]
        return lambda: sample(lambda: bench("http", f"http://127.0.0.1:{port}/api/items/{{n}}", secs=s,
                                            rate=rate, cpus=GEN_CPU), {"server": proc})

    for name in paths:
        runner(name, s=1)()
    closed = rounds(runs, {n: runner(n) for n in paths}, "gateway, closed loop")
    half = round(med([tp(r) for r in closed["sluice"]]) / 2)
    at_half = rounds(runs, {n: runner(n, rate=half) for n in paths}, f"gateway at {half:,}/s")
    return {"closed": closed, "half": at_half, "rate": half}


def criterion_medians(baseline):
    """{bench id: criterion's median ns} of a saved baseline of the `decisions` bench."""
    root = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "criterion")
    out = {}
    if not os.path.isdir(root):
        return out
    for bench_dir in os.listdir(root):
        est = os.path.join(root, bench_dir, baseline, "estimates.json")
        meta = os.path.join(root, bench_dir, baseline, "benchmark.json")
        if os.path.exists(est) and os.path.exists(meta):
            with open(meta) as m, open(est) as e:
                out[json.load(m)["full_id"]] = json.load(e)["median"]["point_estimate"]
    return out


def peer_core(runs, saved):
    """The in-process decision against governor keyed: criterion's `decisions` bench, one hot
    key and 100k and 1M keys, 1 thread, once per round (baselines `peers-r1`, …), or the
    baselines of an earlier run with --core-saved."""
    out = []
    for r in range(1, runs + 1):
        name = f"peers-r{r}"
        if not saved:
            print(f"  core decisions, round {r}/{runs} (criterion)", file=sys.stderr, flush=True)
            load_before = os.getloadavg()[0]
            subprocess.run(["cargo", "bench", "-p", "sluice-core", "--bench", "decisions", "--",
                            CORE_FILTER, "--save-baseline", name], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            loads = (load_before, os.getloadavg()[0])
        else:
            loads = None
        times = criterion_medians(name)
        if not times:
            sys.exit(f"no criterion baseline {name} of the decisions bench under target/criterion; "
                     "run without --core-saved")
        out.append({"times": times, "loads": loads})
    return out


def key_memory():
    """Bytes per tracked key at 1M keys, from the `key_memory` example: {structure: bytes}."""
    done = subprocess.run(["cargo", "run", "--release", "-q", "-p", "sluice-core", "--example",
                           "key_memory"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the key_memory example failed:\n{done.stderr}")
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(\w+)\s+\d+\s+[\d.]+ MB\s+([\d.]+)$", done.stdout, re.M)}


def verdict(ok):
    return "**met**" if ok else "**missed**"


def peers(tmp, args):
    if (os.cpu_count() or 1) < 2:
        sys.exit("peers needs 2 CPUs: the servers run on CPU 0 and the generator on CPU 1")
    skip = set(args.skip or [])
    # Only the peers of the parts that run are needed.
    bins = {}
    if not {"memory", "gateway"} <= skip:
        bins["nginx"] = nginx_bin()
    if "memory" not in skip:
        bins["throttlecrab"] = throttlecrab_bin(args.peers_dir)
        bins["limitador"] = limitador_bin(args.limitador_bin, args.peers_dir)
    with open(os.path.join(tmp, "peers.yaml"), "w") as f:
        f.write(PEER_RULES)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "crates"],
                           cwd=ROOT, capture_output=True, text=True).stdout.split("\n")
    dirty = sorted({line[3:] for line in dirty if line.strip()})
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    log = open(os.path.join(tmp, "peers.log"), "w+")
    res = {}
    try:
        if "memory" not in skip:
            res.update(peer_memory(tmp, log, args.runs, args.secs, bins))
            stop_all()
            children.clear()
        if "redis" not in skip:
            res["redis"] = peer_redis(tmp, log, args.runs, args.secs)
            stop_all()
            children.clear()
        if "hybrid" not in skip:
            res["hybrid"] = peer_hybrid(tmp, log, args.runs, args.secs)
            stop_all()
            children.clear()
        if "usage" not in skip:
            res["usage"] = peer_usage(tmp, log, args.runs, args.secs)
            stop_all()
            children.clear()
        if "gateway" not in skip:
            res["gateway"] = peer_gateway(tmp, log, args.runs, args.secs, bins)
            stop_all()
            children.clear()
    except SystemExit:
        log.flush()
        log.seek(0)
        print("the servers' log:\n" + log.read()[-4000:], file=sys.stderr)
        raise
    if "core" not in skip:
        res["core"] = peer_core(args.runs, args.core_saved)
        res["memory_bytes"] = key_memory()
    print_peers(res, args, commit, dirty, started)


def shape(s):
    return f"{s[0]}×{s[1]}"


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def generator_paced(res):
    """The runs, by section and server, in which the generator was the limit (≥ 95% of its core)."""
    sections = []
    if "http" in res:
        sections.append(("HTTP", res["http"]))
    for s, by in res.get("grpc", {}).items():
        sections.append((f"gRPC {shape(s)}", by))
    if "gateway" in res:
        sections.append(("gateway", res["gateway"]["closed"]))
    return [f"{label} {name}" for label, by in sections for name, reps in by.items()
            if med([r["generator"] for r in reps]) >= 0.95]


def gen(reports):
    """The generator's median share of its core, as a percentage."""
    return f"{med([r['generator'] for r in reports]) * 100:.0f}%"


def print_peers(res, args, commit, dirty, started):
    """The one table of the targets (issues #15, #27 and #29), each row's figure, target, ratio
    and met or missed, then the figures behind each row."""
    rows, details, all_reports = [], [], []

    def busy_mark(reports):
        c = conditions(reports)
        all_reports.extend(reports)
        return c, (" (busy machine)" if c["busy"] else "")

    if "http" in res:
        h = res["http"]
        c, mark = busy_mark([r for v in h.values() for r in v])
        vs = {p: per_round(h["sluice"], h[p], cpu) for p in ["nginx", "limitador", "throttlecrab"]}
        rows.append((
            "HTTP `/json`, memory: server CPU per answer",
            f"{med([cpu(r) for r in h['sluice']]):.1f} µs; nginx's constant "
            f"{med([cpu(r) for r in h['nginx']]):.1f} µs{mark}",
            "≤ 1.15× nginx's constant answer", f"{vs['nginx']:.2f}×", verdict(vs["nginx"] <= 1.15)))
        rows.append((
            "HTTP `/json`, memory: ahead of the peers checking the same 10k keys",
            f"Limitador {med([cpu(r) for r in h['limitador']]):.1f} µs, throttlecrab "
            f"{med([cpu(r) for r in h['throttlecrab']]):.1f} µs per answer{mark}",
            "< 1× each peer's CPU per answer",
            f"{vs['limitador']:.2f}× Limitador, {vs['throttlecrab']:.2f}× throttlecrab",
            verdict(vs["limitador"] < 1 and vs["throttlecrab"] < 1)))
        lines = [f"#### HTTP `/json` on the memory store, {plural(args.runs, 'round')} × {args.secs} s, 64 "
                 f"HTTP/1.1 connections, 10,000 keys; {conditions_text(c)}", "",
                 "| server | answers/s | server CPU µs/answer | Sluice's CPU × this | p50 µs | p99 µs "
                 "| generator's CPU | limited | errors |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, reps in h.items():
            lines.append(f"| {name} | {med([tp(r) for r in reps]):,.0f} | {med([cpu(r) for r in reps]):.1f} "
                         f"| {per_round(h['sluice'], reps, cpu):.2f} | {med([r['latency']['p50_us'] for r in reps]):,.0f} "
                         f"| {med([p99(r) for r in reps]):,.0f} | {gen(reps)} | {sum(r['limited'] for r in reps)} "
                         f"| {sum(sum(r['errors'].values()) for r in reps)} |")
        details.append("\n".join(lines))

    if "grpc" in res:
        g = res["grpc"]
        c, mark = busy_mark([r for by in g.values() for v in by.values() for r in v])
        p99s = {s: per_round(by["sluice"], by["limitador"], p99) for s, by in g.items()}
        tps = {s: per_round(by["sluice"], by["limitador"], tp) for s, by in g.items()}
        rows.append((
            "gRPC `ShouldRateLimit`, memory: p99 against Limitador, connections × streams",
            ", ".join(f"{shape(s)} {med([p99(r) for r in by['sluice']]) / 1000:.1f} ms "
                      f"(Limitador {med([p99(r) for r in by['limitador']]) / 1000:.1f})"
                      for s, by in g.items()) + mark,
            "p99 ≤ Limitador's at every concurrency, 32 to 512 in flight",
            ", ".join(f"{shape(s)} {v:.2f}×" for s, v in p99s.items()),
            verdict(all(v <= 1 for v in p99s.values()))))
        rows.append((
            "gRPC `ShouldRateLimit`, memory: throughput against Limitador, 10k keys",
            ", ".join(f"{shape(s)} {med([tp(r) for r in by['sluice']]):,.0f}/s "
                      f"(Limitador {med([tp(r) for r in by['limitador']]):,.0f})" for s, by in g.items()) + mark,
            "≥ 1.5× Limitador's",
            ", ".join(f"{shape(s)} {v:.2f}×" for s, v in tps.items()),
            verdict(all(v >= 1.5 for v in tps.values()))))
        lines = [f"#### gRPC `ShouldRateLimit` on the memory store, {plural(args.runs, 'round')} × {args.secs} s, "
                 f"10,000 keys; {conditions_text(c)}", "",
                 "| connections × streams | server | answers/s | × Limitador | server CPU µs/answer "
                 "| × Limitador | p50 µs | p99 µs | × Limitador | generator's CPU |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s, by in g.items():
            for name, reps in by.items():
                lim = by["limitador"]
                lines.append(f"| {shape(s)} | {name} | {med([tp(r) for r in reps]):,.0f} "
                             f"| {per_round(reps, lim, tp):.2f} | {med([cpu(r) for r in reps]):.1f} "
                             f"| {per_round(reps, lim, cpu):.2f} | {med([r['latency']['p50_us'] for r in reps]):,.0f} "
                             f"| {med([p99(r) for r in reps]):,.0f} | {per_round(reps, lim, p99):.2f} | {gen(reps)} |")
        details.append("\n".join(lines))

    if "redis" in res:
        rd = res["redis"]
        c, mark = busy_mark([r for v in rd.values() for r in v])
        redis_cpu = lambda r: r["cpu"]["redis"]
        paths = [p for p in ["http", "http_check", "grpc"] if p in rd]
        label = {"http": "HTTP `/json`", "http_check": "HTTP `/v1/check`", "grpc": "gRPC"}
        vs_redis = {p: med([r["cpu"]["server"] / r["cpu"]["redis"] for r in rd[p]]) for p in paths}
        of_ceiling = {p: per_round(rd[p], rd["ceiling"], tp) for p in paths}
        rows.append((
            "Redis store: Sluice's CPU per decision against Redis's own in the same run",
            "; ".join(f"{label[p]} {med([cpu(r) for r in rd[p]]):.1f} µs against Redis's "
                      f"{med([redis_cpu(r) for r in rd[p]]):.1f}" for p in paths)
            + "; " + ", ".join(f"{of_ceiling[p]:.2f} ({label[p]})" for p in paths)
            + f" of the `redis-benchmark -P 16` ceiling{mark}",
            "≤ Redis's own CPU per decision (1.00×), on HTTP and gRPC",
            ", ".join(f"{label[p]} {vs_redis[p]:.2f}×" for p in paths),
            verdict(all(v <= 1 for v in vs_redis.values()))))
        lines = [f"#### The Redis store, {plural(args.runs, 'round')} × {args.secs} s, 64 workers, 10,000 keys; "
                 f"{conditions_text(c)}", "",
                 "| path | answers/s | × ceiling | Sluice CPU µs/decision | Redis CPU µs/decision "
                 "| Sluice ÷ Redis | p99 µs |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        lines.append(f"| `redis-benchmark -P 16 -c 50`, the same EVALSHA (**ceiling**) "
                     f"| {med([tp(r) for r in rd['ceiling']]):,.0f} | 1.00 | | "
                     f"{med([redis_cpu(r) for r in rd['ceiling']]):.1f} | | |")
        for p, name in [("http", "`sluice serve` HTTP `/json`"), ("http_check", "`sluice serve` HTTP `/v1/check`"),
                        ("grpc", "`sluice serve` gRPC, 2 connections")]:
            if p not in rd:
                continue
            lines.append(f"| {name} | {med([tp(r) for r in rd[p]]):,.0f} | {of_ceiling[p]:.2f} "
                         f"| {med([cpu(r) for r in rd[p]]):.1f} | {med([redis_cpu(r) for r in rd[p]]):.1f} "
                         f"| {vs_redis[p]:.2f} | {med([p99(r) for r in rd[p]]):,.0f} |")
        details.append("\n".join(lines))

    if "hybrid" in res:
        hy = res["hybrid"]
        c, mark = busy_mark([r for v in hy.values() for r in v])
        vs_memory = per_round(hy["hybrid"], hy["memory"], cpu)
        commands = med([r["redis_calls"] / max(r["requests"], 1) for r in hy["hybrid"]])
        per_key = med([tp(r) for r in hy["hybrid"]]) * SYNC_INTERVAL / KEYS
        rows.append((
            f"hybrid store, {KEYS:,} cold keys: CPU per answer against the memory store's, and "
            "Redis commands per decision",
            f"{med([cpu(r) for r in hy['hybrid']]):.1f} µs against {med([cpu(r) for r in hy['memory']]):.1f}; "
            f"{commands:.3f} commands per decision at {per_key:.2f} requests per key per sync{mark}",
            "≤ 1.1× the memory store's CPU per answer; ≤ 0.1 commands per decision",
            f"{vs_memory:.2f}× memory, {commands / 0.1:.2f}× the commands bound",
            verdict(vs_memory <= 1.1 and commands <= 0.1)))
        lines = [f"#### The hybrid store on cold keys, {plural(args.runs, 'round')} × {args.secs} s, HTTP "
                 f"`/json`, 64 connections, {KEYS:,} keys, the services on CPU 0, Redis and the generator "
                 f"on CPU 1; {conditions_text(c)}", "",
                 "| store | answers/s | server CPU µs/answer | × memory | Redis CPU µs/answer "
                 "| Redis commands per decision | p99 µs |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for name, reps in hy.items():
            cmds = (f"{med([r['redis_calls'] / max(r['requests'], 1) for r in reps]):.3f}"
                    if name == "hybrid" else "")
            lines.append(f"| {name} | {med([tp(r) for r in reps]):,.0f} | {med([cpu(r) for r in reps]):.1f} "
                         f"| {per_round(reps, hy['memory'], cpu):.2f} "
                         f"| {med([r['cpu']['redis'] for r in reps]):.2f} | {cmds} "
                         f"| {med([p99(r) for r in reps]):,.0f} |")
        details.append("\n".join(lines))

    if "usage" in res:
        us = res["usage"]
        c, mark = busy_mark([r for v in us.values() for r in v])
        vs_check = per_round(us["reserve_settle_paced"], us["check_paced"], cpu)
        closed_loop = per_round(us["reserve_settle"], us["check"], cpu)
        rows.append((
            "usage: `/v1/reserve` + `/v1/settle` against one `/v1/check`, memory: server CPU per "
            f"call at {USAGE_PACE:,} HTTP requests a second",
            f"{med([cpu(r) for r in us['reserve_settle_paced']]):.1f} µs against "
            f"{med([cpu(r) for r in us['check_paced']]):.1f} µs (closed loop {closed_loop:.2f}×: "
            f"{med([tp(r) for r in us['reserve_settle']]) * 2:,.0f} against "
            f"{med([tp(r) for r in us['check']]):,.0f} requests a second){mark}",
            "≤ 2× one `/v1/check`", f"{vs_check:.2f}×", verdict(vs_check <= 2)))
        lines = [f"#### Usage calls on the memory store, {plural(args.runs, 'round')} × {args.secs} s, 64 "
                 f"workers, {KEYS:,} keys, the server on CPU 0; {conditions_text(c)}", "",
                 "| call | load | calls/s | server CPU µs/call | × `/v1/check` | p99 µs |",
                 "|---|---|---:|---:|---:|---:|"]
        for name, label, load, base in [
                ("check", "`/v1/check`", "closed loop", "check"),
                ("reserve_settle", "`/v1/reserve` + `/v1/settle`", "closed loop", "check"),
                ("check_paced", "`/v1/check`", f"{USAGE_PACE:,}/s", "check_paced"),
                ("reserve_settle_paced", "`/v1/reserve` + `/v1/settle`", f"{USAGE_PACE // 2:,}/s",
                 "check_paced")]:
            reps = us[name]
            lines.append(f"| {label} | {load} | {med([tp(r) for r in reps]):,.0f} "
                         f"| {med([cpu(r) for r in reps]):.1f} "
                         f"| {per_round(reps, us[base], cpu):.2f} | {med([p99(r) for r in reps]):,.0f} |")
        details.append("\n".join(lines))

    if "gateway" in res:
        gw = res["gateway"]
        closed, half = gw["closed"], gw["half"]
        c, mark = busy_mark([r for v in list(closed.values()) + list(half.values()) for r in v])
        of_direct = {p: per_round(closed[p], closed["direct"], tp) for p in ["sluice", "nginx"]}
        added = {p: med([p99(x) - p99(d) for x, d in zip(half[p], half["direct"])]) for p in ["sluice", "nginx"]}
        vs_nginx = per_round(closed["sluice"], closed["nginx"], cpu)
        rows.append((
            "gateway: CPU per proxied answer against nginx `limit_req` + `proxy_pass`, same upstream",
            f"{med([cpu(r) for r in closed['sluice']]):.1f} µs against nginx's "
            f"{med([cpu(r) for r in closed['nginx']]):.1f} µs{mark}",
            "≤ 1.0× nginx's CPU per answer", f"{vs_nginx:.2f}× nginx's", verdict(vs_nginx <= 1)))
        rows.append((
            "gateway against nginx `limit_req` in front of the same upstream: throughput",
            f"{of_direct['sluice']:.2f} of direct against nginx's {of_direct['nginx']:.2f}{mark}",
            "≥ nginx's ratio of direct", f"{of_direct['sluice'] / of_direct['nginx']:.2f}× nginx's",
            verdict(of_direct["sluice"] >= of_direct["nginx"])))
        rows.append((
            "gateway: added p99 at half load",
            f"+{added['sluice'] / 1000:.2f} ms against nginx's +{added['nginx'] / 1000:.2f} ms at "
            f"{gw['rate']:,}/s{mark}",
            "≤ 1 ms and ≤ 2× nginx's",
            f"{added['sluice'] / max(added['nginx'], 1):.2f}× nginx's",
            verdict(added["sluice"] <= 1000 and added["sluice"] <= 2 * max(added["nginx"], 0))))
        lines = [f"#### Gateway, GET `/api/items/{{n}}`, {plural(args.runs, 'round')} × {args.secs} s, 64 "
                 f"connections, the gateway on CPU 0, the upstream and generator on CPU 1; "
                 f"{conditions_text(c)}", "",
                 "| path | closed loop answers/s | × direct | gateway CPU µs/answer | generator's CPU "
                 f"| p50 µs at {gw['rate']:,}/s | p99 µs at {gw['rate']:,}/s | added p99 µs |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for p, name in [("direct", "upstream direct"), ("sluice", "`sluice proxy`"),
                        ("nginx", "nginx `limit_req` + `proxy_pass`")]:
            add = "" if p == "direct" else f"{added[p]:,.0f}"
            cpu_cell = "" if p == "direct" else f"{med([cpu(r) for r in closed[p]]):.1f}"
            lines.append(f"| {name} | {med([tp(r) for r in closed[p]]):,.0f} "
                         f"| {per_round(closed[p], closed['direct'], tp):.2f} | {cpu_cell} | {gen(closed[p])} "
                         f"| {med([r['latency']['p50_us'] for r in half[p]]):,.0f} "
                         f"| {med([p99(r) for r in half[p]]):,.0f} | {add} |")
        details.append("\n".join(lines))

    if "core" in res:
        core = res["core"]
        ratio_of = lambda alg, keys: med([run["times"][f"{alg}/{keys}/1t"] / run["times"][f"governor/{keys}/1t"]
                                          for run in core])
        ns = lambda bench_id: med([run["times"][bench_id] for run in core])
        hot = {a: ratio_of(a, "hot") for a in CORE_ALGORITHMS}
        many = {(a, k): ratio_of(a, k) for a in CORE_ALGORITHMS for k in ["100k", "1M"]}
        loads = [x for run in core if run["loads"] for x in run["loads"]]
        load_note = (f", load average {min(loads):.1f}–{max(loads):.1f}" if loads else ", earlier baselines")
        rows.append((
            "in-process decision, one hot string key, against governor keyed",
            ", ".join(f"{a.replace('_', ' ')} {ns(f'{a}/hot/1t'):.0f} ns" for a in CORE_ALGORITHMS)
            + f"; governor {ns('governor/hot/1t'):.0f} ns",
            "≤ governor and ≤ 100 ns",
            ", ".join(f"{a.replace('_', ' ')} {v:.2f}×" for a, v in hot.items()),
            verdict(all(v <= 1 for v in hot.values()) and
                    all(ns(f"{a}/hot/1t") <= 100 for a in CORE_ALGORITHMS))))
        rows.append((
            "in-process decision over 100k and 1M keys, against governor keyed",
            ", ".join(f"{k}: governor {ns(f'governor/{k}/1t'):.0f} ns" for k in ["100k", "1M"]),
            "keep the lead (< 1×)",
            ", ".join(f"{a.replace('_', ' ')} {k} {v:.2f}×" for (a, k), v in many.items()),
            verdict(all(v < 1 for v in many.values()))))
        lines = [f"#### In process: criterion's `decisions` bench, 1 thread, {plural(len(core), 'run')}{load_note}", "",
                 "| algorithm | " + " | ".join(f"{k} ns | × governor" for k in CORE_KEYS) + " |",
                 "|---|" + "---:|---:|" * len(CORE_KEYS)]
        for a in CORE_ALGORITHMS + ["governor"]:
            cells = []
            for k in CORE_KEYS:
                cells.append(f"{ns(f'{a}/{k}/1t'):.0f}")
                cells.append("1.00" if a == "governor" else f"{ratio_of(a, k):.2f}")
            lines.append(f"| {a.replace('_', ' ')} | " + " | ".join(cells) + " |")
        details.append("\n".join(lines))
    if "memory_bytes" in res:
        m = res["memory_bytes"]
        ours = {k: v for k, v in m.items() if k.startswith("sluice")}
        rows.append((
            "memory per tracked key at 1M keys",
            ", ".join(f"{k.replace('sluice_', '').replace('_', ' ')} {v:.1f} B" for k, v in ours.items())
            + f"; governor {m.get('governor_keyed', float('nan')):.1f} B",
            "≤ 100 bytes", f"{max(ours.values()) / 100:.2f}× the bound",
            verdict(all(v <= 100 for v in ours.values()))))

    rows.extend(res.get("rows", []))
    details.extend(res.get("details", []))
    print(f"\n### The targets (issues #15, #27 and #29): commit `{commit}`, {started}\n")
    if dirty:
        print(f"The tree had uncommitted changes to {', '.join(f'`{d}`' for d in dirty)}; the binaries "
              "measured include them.\n")
    if all_reports:
        c = conditions(all_reports)
        print(f"Over the wire runs: {conditions_text(c)}. Ratios are medians of per-round ratios, "
              f"{plural(args.runs, 'round')} of {args.secs} s.\n")
    print("| path | measured | target | ratio | |")
    print("|---|---|---|---|---|")
    for row_ in rows:
        print("| " + " | ".join(row_) + " |")
    paced = generator_paced(res)
    if paced:
        print(f"\nThe generator used 95% or more of its core (median) against: {', '.join(paced)}. "
              "There closed-loop throughput, and its p99, is partly the generator's pace; CPU per "
              "answer is not.")
    for d in details:
        print("\n" + d)

USAGE_BUDGET = 100_000
USAGE_CALLERS = 1_000
USAGE_CALLS = 10_000

USAGE_RULES = """
domain: llm
descriptors:
  # The budget: 100,000 tokens an hour.
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: fixed_window}
  # The CPU comparison: one rule for the check and the reservation, never exhausted.
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: fixed_window}
"""

# HTTP requests a second of the usage comparison at one rate: a check each, or half as many
# reservations and settles; below what either reaches closed loop here (about 90,000).
USAGE_PACE = 40_000

USAGE_CHECK_BODY = '{"domain":"llm","descriptors":[{"entries":[{"key":"user","value":"u{n}"}]}]}'


def usage_call(urls, flow, tenant):
    """One budget run: `USAGE_CALLS` calls by `USAGE_CALLERS` callers against a fresh tenant."""
    # A run must stay inside one hour's window: wait out the last minute of an hour.
    left = 3600 - time.time() % 3600
    if left < 60:
        time.sleep(left + 1)
    args = [BIN, "bench", "usage", *urls, "--json", "--flow", flow, "--domain", "llm",
            "--descriptor", f"tenant={tenant}", "--declared", "500", "--used-min", "50",
            "--used-max", "500", "--budget", str(USAGE_BUDGET), "--ttl", "5m",
            "-c", str(USAGE_CALLERS), "--requests", str(USAGE_CALLS), "--timeout", "60s"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    report = json.loads(out.stdout)
    if report["errors"]:
        sys.exit(f"{' '.join(args)} had errors: {report['errors']}")
    return report


def usage(tmp, runs, secs):
    rules = "usage.yaml"
    with open(os.path.join(tmp, rules), "w") as f:
        f.write(USAGE_RULES)
    log = open(os.path.join(tmp, "usage.log"), "w")
    redis_port = free_port()
    start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no"], log)
    wait_port(redis_port, "redis-server")
    # 1,000 callers queue behind one Redis on a shared machine for longer than the default
    # 50 ms store timeout, after which on_store_error would decide instead of the store.
    store = ["--store", f"redis://127.0.0.1:{redis_port}", "--store-prefix", "usage",
             "--store-timeout-ms", "5000"]
    hybrid_store = ["--store", f"hybrid+redis://127.0.0.1:{redis_port}", "--store-prefix",
                    "usage-hybrid", "--store-timeout-ms", "5000"]
    memory = start_serve(tmp, log, rules=rules)[0]
    shared = [start_serve(tmp, log, *store, rules=rules)[0] for _ in range(3)]
    hybrid = [start_serve(tmp, log, *hybrid_store, rules=rules)[0] for _ in range(3)]
    setups = [("memory", [memory]), ("Redis, 1 instance", shared[:1]),
              ("Redis, 3 instances", shared), ("hybrid, 3 instances", hybrid)]
    results = {}
    for i in range(runs):
        for name, ports in setups:
            for flow in ["report", "reserve"]:
                urls = [f"http://127.0.0.1:{p}" for p in ports]
                tenant = f"t{os.getpid()}-{i}-{len(ports)}-{name[0]}-{flow}"
                results.setdefault((name, flow), []).append(usage_call(urls, flow, tenant))
    print(f"\n### Tokens admitted beyond a budget of {USAGE_BUDGET:,} an hour: "
          f"{USAGE_CALLERS:,} concurrent callers, {USAGE_CALLS:,} calls of 50–500 tokens "
          f"(500 declared), medians of {runs} runs\n")
    print("| store | flow | calls admitted | tokens used | beyond the budget | "
          "refunded / expected | runs with any beyond |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, _ in setups:
        for flow in ["report", "reserve"]:
            rs = results[(name, flow)]
            label = "check-then-report (Envoy)" if flow == "report" else "reserve-then-settle"
            refund = "" if flow == "report" else \
                f"{med([r['refunded'] / max(r['refunds_expected'], 1) for r in rs]):.4f}"
            over = sum(1 for r in rs if r["beyond_budget"] > 0)
            print(f"| {name} | {label} | {med([r['calls_admitted'] for r in rs]):,.0f} | "
                  f"{med([r['tokens_used'] for r in rs]):,.0f} | "
                  f"{med([r['beyond_budget'] for r in rs]):,.0f} | {refund} | {over} of {len(rs)} |")
    stop_all()
    children.clear()

    # The CPU of a reserve plus a settle against one check, on one pinned server.
    port = start_serve(tmp, log, rules=rules, cpus="0")[0]
    proc = children[-1]
    url = f"http://127.0.0.1:{port}"
    check, call = [], []
    for _ in range(runs):
        check.append(with_cpu(proc, lambda: bench(
            "http", f"{url}/v1/check", "-X", "POST", "-d", USAGE_CHECK_BODY, secs=secs,
            cpus="1")))
        call.append(with_cpu(proc, lambda: bench(
            "usage", url, "--flow", "reserve", "--domain", "llm", "--descriptor", "user=u{n}",
            "--ttl", "5m", secs=secs, cpus="1")))
    ratio = med([b["cpu_us"] / a["cpu_us"] for a, b in zip(check, call)])
    print(f"\n### Server CPU per call, memory store, server on CPU 0, generator on CPU 1, "
          f"64 workers over {KEYS:,} keys, {runs} × {secs} s\n")
    print("| call | calls/s (median) | server CPU µs per call (median) | × `/v1/check` |")
    print("|---|---:|---:|---:|")
    print(f"| `/v1/check` | {med([r['throughput'] for r in check]):,.0f} | "
          f"{med([r['cpu_us'] for r in check]):.1f} | 1.00 |")
    print(f"| `/v1/reserve` + `/v1/settle` | {med([r['throughput'] for r in call]):,.0f} | "
          f"{med([r['cpu_us'] for r in call]):.1f} | {ratio:.2f} |")
    rounds_text = ", ".join(f"{b['cpu_us'] / a['cpu_us']:.2f}" for a, b in zip(check, call))
    print(f"\nPer-round ratios: {rounds_text}.")


# ---------------------------------------------------------------------------------------------
# cluster: issue #27's last row, a request of 5 descriptors on a 3-master Cluster against one of 1.

CLUSTER_RULES = "domain: bench\ndescriptors:\n" + "".join(
    f"  - key: d{i}\n    rate_limit: {{unit: second, requests_per_unit: 1000000, algorithm: gcra}}\n"
    for i in range(1, 6))


def cluster_body(descriptors):
    entries = ",".join('{"entries":[{"key":"d%d","value":"u{n}"}]}' % i
                       for i in range(1, descriptors + 1))
    return '{"domain":"bench","descriptors":[' + entries + ']}'


def crc16(data):
    """Redis Cluster's CRC16 (XMODEM), whose value mod 16,384 is a key's slot."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def cluster(tmp, runs, secs, baseline_bin=None, rtt_ms=0.0):
    """`sluice serve --store redis+cluster://` on a real 3-master Cluster (`redis-cli --cluster
    create`, no replicas, the masters and the generator on CPU 1, the service on CPU 0): HTTP
    `/json` requests of 5 descriptors (each its own counter, in its own slot, 10,000 keys)
    against requests of 1, at two fixed rates, a tenth and a half of the 5-descriptor
    closed-loop throughput (of the slower build), so that p99 compares at the same load.
    Interleaved rounds; per build and load, p99, p50 and the service's CPU per answer (and the
    masters', summed), as medians of per-round ratios 5 / 1. With
    --baseline-bin, the same for that build, both services alive at once, a prefix each."""
    last = (os.cpu_count() or 1) - 1
    own, rest = ("0", f"1-{last}" if last > 1 else "1") if last > 0 else (None, None)
    rules = os.path.join(tmp, "cluster.yaml")
    with open(rules, "w") as f:
        f.write(CLUSTER_RULES)
    log = open(os.path.join(tmp, "cluster.log"), "w")
    nodes, relayed = [], []
    for i in range(3):
        port, bus = free_port(), free_port()
        # With --cluster-rtt, clients reach each master through a relay that holds every byte
        # half the round trip each way: the master announces the relay's port as its own.
        relay = free_port() if rtt_ms else None
        announce = (["--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", str(relay),
                     "--cluster-announce-bus-port", str(bus)] if relay else [])
        proc = start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--cluster-enabled", "yes", "--cluster-port", str(bus),
                      "--cluster-node-timeout", "5000", "--dir", tmp, *announce,
                      "--cluster-config-file", os.path.join(tmp, f"nodes-{port}.conf")], log, cpus=rest)
        wait_port(port, "a cluster node")
        nodes.append((port, proc))
        if relay:
            start([BIN, "bench", "relay", "--listen", f"127.0.0.1:{relay}", "--to",
                   f"127.0.0.1:{port}", "--delay", f"{max(1, round(rtt_ms / 2))}ms"], log, cpus=rest)
            wait_port(relay, "a master's relay")
            relayed.append(f"127.0.0.1:{relay}")
    addrs = [f"127.0.0.1:{port}" for port, _ in nodes]
    subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "0",
                    "--cluster-yes"], check=True, capture_output=True)
    for port, _ in nodes:
        for _ in range(200):
            info = subprocess.run(["redis-cli", "-p", str(port), "CLUSTER", "INFO"],
                                  capture_output=True, text=True).stdout
            if "cluster_state:ok" in info and "cluster_known_nodes:3" in info:
                break
            time.sleep(0.05)
        else:
            sys.exit(f"cluster node {port} never saw the cluster ok")
    # Which master serves each slot, to say how many masters the 5-descriptor requests touch.
    owner = [0] * 16384
    for line in subprocess.run(["redis-cli", "-p", str(nodes[0][0]), "CLUSTER", "NODES"],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) < 9 or "master" not in fields[2]:
            continue
        for r in fields[8:]:
            if r.startswith("["):
                continue
            a, _, b = r.partition("-")
            for slot in range(int(a), int(b or a) + 1):
                owner[slot] = fields[1].split("@")[0]
    spans = {1: 0, 2: 0, 3: 0}
    for n in range(KEYS):
        masters = {owner[crc16(f"bench|d{i}=u{n}".encode()) % 16384] for i in range(1, 6)}
        spans[len(masters)] += 1
    url = "redis+cluster://" + ",".join(relayed or addrs)
    builds = {"this build": BIN}
    if baseline_bin:
        builds["baseline"] = baseline_bin
    redis_procs = {f"m{i}": proc for i, (_, proc) in enumerate(nodes)}
    servers = {}
    for name, binary in builds.items():
        http_port, grpc_port = free_port(), free_port()
        serve = start([binary, "serve", "--config", rules, "--http-addr", f"127.0.0.1:{http_port}",
                       "--grpc-addr", f"127.0.0.1:{grpc_port}", "--store", url,
                       "--store-prefix", f"bench-{len(servers)}"], log, cpus=own)
        wait_port(http_port, f"{name} serve")
        json_url = f"http://127.0.0.1:{http_port}/json"
        # Warm: scripts loaded on every master, connections open.
        http_runner(json_url, cluster_body(5), 1)()
        closed = http_runner(json_url, cluster_body(5), secs)()
        print(f"  cluster, {name}: 5 descriptors closed loop {closed['throughput']:,.0f}/s",
              file=sys.stderr, flush=True)
        servers[name] = (serve, json_url, closed["throughput"])
    # Two rates for every runner, a fraction of the slowest build's 5-descriptor maximum, so
    # that every p99 of a load is taken at the same rate: a tenth, where a request's rounds are
    # what its latency is made of, and a half, where the masters' shared core queues them.
    top = min(t for _, _, t in servers.values())
    loads = {"a tenth": round(top / 10), "half": round(top / 2)}
    runners = {}
    for name, (serve, json_url, _) in servers.items():
        for load, rate in loads.items():
            for d in (1, 5):
                procs = {"serve": serve, **redis_procs}
                runners[(name, load, d)] = lambda u=json_url, b=cluster_body(d), p=procs, r=rate: sample(
                    lambda: bench("http", u, "-X", "POST", "-d", b, secs=secs, rate=r, cpus=rest), p)
    res = rounds(runs, runners, "cluster")
    every = [r for reports in res.values() for r in reports]
    rates = " and ".join(f"{rate:,}/s" for rate in loads.values())
    away = f", each master {rtt_ms:g} ms of round trip away (a relay)" if rtt_ms else ""
    print(f"\n### Redis Cluster: 5 descriptors on 3 masters against 1, HTTP `/json`{away}, "
          f"{runs} × {secs} s at {rates}\n")
    print("5-descriptor closed-loop maximum: " + ", ".join(
        f"{name} {t:,.0f}/s" for name, (_, _, t) in servers.items()) + ".\n")
    print(f"{KEYS:,} keys; of the 5-descriptor requests, {spans[3] / KEYS:.0%} touch 3 masters, "
          f"{spans[2] / KEYS:.0%} 2 and {spans[1] / KEYS:.0%} 1. {conditions_text(conditions(every))}.\n")
    print("| build | load | descriptors | answers/s | p50 µs | p99 µs | service CPU µs/answer | masters' CPU µs/answer |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, load, d), reports in res.items():
        masters_cpu = med([sum(r["cpu"][m] for m in redis_procs) for r in reports])
        print(f"| {name} | {load} | {d} | {med([tp(r) for r in reports]):,.0f} | "
              f"{med([r['latency']['p50_us'] for r in reports]):,.0f} | {med([p99(r) for r in reports]):,.0f} | "
              f"{med([cpu(r) for r in reports]):.1f} | {masters_cpu:.1f} |")
    print("\n| build | load | p99 5 / 1 (target ≤ 1.3) | p50 5 / 1 | service CPU 5 / 1 | per-round p99 ratios |")
    print("|---|---|---:|---:|---:|---|")
    p50 = lambda r: r["latency"]["p50_us"]
    for name in builds:
        for load in loads:
            five, one = res[(name, load, 5)], res[(name, load, 1)]
            ratio = per_round(five, one, p99)
            rounds_text = ", ".join(f"{p99(a) / p99(b):.2f}" for a, b in zip(five, one))
            print(f"| {name} | {load} | {ratio:.2f} {verdict(ratio <= 1.3)} | "
                  f"{per_round(five, one, p50):.2f} | {per_round(five, one, cpu):.2f} | {rounds_text} |")

OVERRIDE_KEYS = 1_000


def overrides(tmp, runs, secs):
    log = open(os.path.join(tmp, "overrides.log"), "w")
    plain = start_serve(tmp, log, cpus="0")[0]
    plain_proc = children[-1]
    over = start_serve(tmp, log, cpus="0")[0]
    over_proc = children[-1]
    for n in range(OVERRIDE_KEYS):
        body = json.dumps({"descriptor": [{"key": "user", "value": f"o{n}"}],
                           "rate_limit": {"unit": "second", "requests_per_unit": 2000000,
                                          "algorithm": "gcra"}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{over}/v1/overrides/bench", data=body,
                                     method="PUT", headers={"content-type": "application/json"})
        urllib.request.urlopen(req).read()
    overridden_body = BODY.replace('"u{n}"', '"o{n}"')

    def run(proc, port, body):
        return with_cpu(proc, lambda: bench("http", f"http://127.0.0.1:{port}/json", "-X", "POST",
                                            "-d", body, secs=secs, cpus="1", keys=OVERRIDE_KEYS))

    none, rule, overridden = [], [], []
    for _ in range(runs):
        none.append(run(plain_proc, plain, BODY))
        rule.append(run(over_proc, over, BODY))
        overridden.append(run(over_proc, over, overridden_body))
    print(f"\n### Server CPU per decision with runtime overrides, memory store, HTTP `/json`, "
          f"server on CPU 0, generator on CPU 1, 64 workers over {OVERRIDE_KEYS:,} keys, "
          f"{runs} × {secs} s\n")
    print("| decision | answers/s (median) | server CPU µs per answer (median) | × a rule's |")
    print("|---|---:|---:|---:|")
    ratio = lambda xs: med([b["cpu_us"] / a["cpu_us"] for a, b in zip(rule, xs)])
    for name, rs in [("a rule, no overrides in the service", none),
                     (f"a rule, {OVERRIDE_KEYS:,} overrides in its domain (**baseline**)", rule),
                     ("an overridden descriptor", overridden)]:
        print(f"| {name} | {med([r['throughput'] for r in rs]):,.0f} | "
              f"{med([r['cpu_us'] for r in rs]):.2f} | {ratio(rs):.3f} |")
    rounds_text = ", ".join(f"{b['cpu_us'] / a['cpu_us']:.3f}" for a, b in zip(rule, overridden))
    print(f"\nPer-round ratios, overridden against a rule: {rounds_text}.")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", default=["service", "redis", "gateway"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--secs", type=int, default=5)
    parser.add_argument("--baseline-bin", help="ab, cluster: the other build of sluice to compare with")
    parser.add_argument("--cluster-rtt", type=float, default=0.0, metavar="MS",
                        help="cluster: reach each master through `sluice bench relay`, MS "
                        "milliseconds of round trip away (default 0: directly)")
    parser.add_argument("--few-keys", type=int, default=20,
                        help="hybrid: the keys of the commands-per-decision runs")
    parser.add_argument("--pin", action="store_true",
                        help="gateway: give the gateway a CPU of its own (taskset)")
    parser.add_argument("--peers-dir", default=PEERS_DIR,
                        help="peers: where throttlecrab-server is installed (and limitador-server "
                        "looked for); default $SLUICE_PEERS_DIR or /tmp/sluice-peers")
    parser.add_argument("--limitador-bin", help="peers: the limitador-server binary (default: "
                        "PEERS_DIR/limitador/limitador-server)")
    parser.add_argument("--skip", action="append",
                        choices=["memory", "redis", "hybrid", "usage", "gateway", "core"],
                        help="peers: leave a part out (repeatable)")
    parser.add_argument("--core-saved", action="store_true",
                        help="peers: read the in-process figures from the criterion baselines "
                        "peers-r1 … peers-rRUNS of an earlier run instead of running criterion")
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "--release", "--bin", "sluice"], cwd=ROOT, check=True)
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "rules.yaml"), "w") as f:
            f.write(RULES)
        try:
            for what in args.what:
                if what == "gateway":
                    gateway(tmp, args.runs, args.secs, pin=args.pin)
                elif what == "ab":
                    if not args.baseline_bin:
                        sys.exit("ab needs --baseline-bin PATH, another build of sluice")
                    ab(tmp, args.runs, args.secs, args.baseline_bin)
                elif what == "hybrid":
                    hybrid(tmp, args.runs, args.secs, args.few_keys)
                elif what == "peers":
                    peers(tmp, args)
                elif what == "cluster":
                    cluster(tmp, args.runs, args.secs, args.baseline_bin, args.cluster_rtt)
                else:
                    {"service": service, "redis": redis, "usage": usage,
                     "overrides": overrides}[what](
                        tmp, args.runs, args.secs)
                stop_all()
                children.clear()
        finally:
            stop_all()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
