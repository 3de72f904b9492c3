#!/usr/bin/env python3
"""Benchmarks of the built binaries with `sluice bench`, each against a baseline in the same run.

    python3 scripts/bench.py [service|redis|gateway|ab|hybrid ...] [--runs 3] [--secs 5] [--pin]

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
  interval (the table prints how many). Reports throughput, the server's CPU per answer and
  p99 as medians of per-round ratios; and per decision, from `INFO commandstats` before and
  after each hybrid run: the script calls the store sent (evalsha …), every command Redis ran
  (those inside the scripts included, INFO aside), and redis-server's CPU time, all divided by
  the run's answers (warm-up included on both sides).

Every server runs in its own process on loopback; the generator is one more, on one thread.
Runs are interleaved (one of each, then again) and the medians printed as Markdown tables.
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

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


def redis_benchmark(port, sha, requests=200_000):
    args = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(requests),
            "-c", "50", "-P", "16", "-r", str(KEYS), "--csv",
            # The service's GCRA check: one key, offset 0, commit, algorithm 2, cost 1,
            # burst 1,000,000, interval 1,000 ns, then the unused parameters and token.
            "EVALSHA", sha, "1", "bench:{rb:__rand_int__}", "0", "1", "2", "1", "1000000", "1000",
            "", "", "", ""]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
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


def start_serve(tmp, log, *extra):
    """`sluice serve` on the bench rules; returns its HTTP and gRPC ports once it listens."""
    http_port, grpc_port = free_port(), free_port()
    start([BIN, "serve", "--config", os.path.join(tmp, "rules.yaml"),
           "--http-addr", f"127.0.0.1:{http_port}", "--grpc-addr", f"127.0.0.1:{grpc_port}",
           *extra], log)
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
    servers = {}
    for name, store in stores.items():
        http_port, grpc_port = free_port(), free_port()
        serve = start([BIN, "serve", "--config", rules, "--http-addr", f"127.0.0.1:{http_port}",
                       "--grpc-addr", f"127.0.0.1:{grpc_port}", *store], log, cpus=own)
        wait_port(http_port, f"{name} serve")
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
    for round_ in range(runs):
        order = ["memory", "hybrid"] if round_ % 2 == 0 else ["hybrid", "memory"]
        for path in results:
            for name in order:
                before, redis_cpu = redis_calls(redis_port), cpu_seconds(redis_proc.pid)
                report = servers[name][path]()
                after = redis_calls(redis_port)
                report["redis_cpu_us"] = (cpu_seconds(redis_proc.pid) - redis_cpu) * 1e6 / max(report["requests"], 1)
                report["script_calls"] = sum(n - before.get(c, 0) for c, n in after.items() if c in SCRIPT_CALLS)
                report["redis_calls"] = sum(after.values()) - sum(before.values())
                report["redis_by_cmd"] = {c: n - before.get(c, 0) for c, n in after.items()
                                          if n != before.get(c, 0)}
                results[path][name].append(report)
                loads.append(os.getloadavg()[0])
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
        print(f"| {path} | {per_key:,.1f} | {med(per):.4f} | {min(per):.4f} to {max(per):.4f} "
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", default=["service", "redis", "gateway"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--secs", type=int, default=5)
    parser.add_argument("--baseline-bin", help="ab: the other build of sluice to compare with")
    parser.add_argument("--few-keys", type=int, default=20,
                        help="hybrid: the keys of the commands-per-decision runs")
    parser.add_argument("--pin", action="store_true",
                        help="gateway: give the gateway a CPU of its own (taskset)")
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
                else:
                    {"service": service, "redis": redis}[what](tmp, args.runs, args.secs)
                stop_all()
                children.clear()
        finally:
            stop_all()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
