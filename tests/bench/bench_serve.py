"""Benchmark (issue 40, item 4): `edgec serve` under stock Open Inference Protocol clients, on the network testbed.

Run (as root, with iproute2; see tests/netbed.py):

    python tests/bench/bench_serve.py [--quick] [--seconds S] [--mbps 100] [--model mobilenetv2] [--json FILE]
    python tests/bench/bench_serve.py --local --quick      # no testbed: local workers, a smoke run of the same steps

Setup: a tests/netbed.py testbed of an unshaped coordinator host and three device hosts (dev-a, dev-b, dev-c)
shaped to --mbps, an `edgec worker --threads 1` with its own key on each device host. Each device host has a CPU
quota of --device-cpus cores (0.4 by default, tests/netbed_limits.py), so that the devices' CPU is theirs, as on
separate boards, and the coordinator host (the server and its clients, or `edgec run`) has the rest of the cores:
without quotas every host shares this machine's 2 cores, and the server's and the clients' CPU would slow the
devices, which no deployment sees. Every host also gets a heavy CPU weight (--cpu-weight), so that other jobs
on this machine do not take the devices' quotas or the server's CPU. One device host's cgroup is profiled (`edgec profile --threads 1`, as
bench_fidelity's hetero part does) for all three. `--device-cpus 0` runs without quotas: this machine profiled
once, the cluster saying that its hosts share the cores (`hosts:`). The model is compiled for the three devices with `--strategy pipeline
--objective throughput --fallbacks` (the plan uses two or three of them). `edgec serve` runs on the coordinator host (HTTP and gRPC on
its loopback, --keys) and the clients run there too, in a process of their own (`bench_serve.py load ...`): stock tritonclient in the
closed loops, the soak and the failover; in the open loop, one request encoded by tritonclient and sent as is from
one asyncio loop (a pool of tritonclient threads took more CPU per request than the server's front).

Measured, side by side in one run:
- baseline: `edgec run --repeat N` streaming the same build at its default --inflight: its throughput;
- closed loop: N clients each sending its next request when the last is answered, at N = 1, 4, 16, over HTTP
  with binary tensors and over gRPC, --seconds each (60 by default; 10 with --quick);
- open loop: requests at 50%, 80% and 100% of the plan's predicted throughput (a fixed schedule; latency counted
  from each request's scheduled time, so that a server falling behind shows it), --seconds each, HTTP binary;
- soak: 10,000 valid requests (1,000 with --quick) with 1 malformed in 10 mixed in (wrong shape, unknown input,
  malformed JSON), 4 clients: lost requests, 5xx on valid ones, 4xx on malformed ones; the server's and the
  workers' RSS at its start and end;
- failover: 4 clients in a closed loop, the last working device that has a fallback plan SIGKILLed mid-load:
  every request the server accepted must be answered (no 5xx, none lost).
Each point reports throughput, p50/p90/p99 latency, errors, and the CPU ms per request of the server, the workers
and the load generator.

Targets (issue 40), checked and printed (PASS/FAIL), enforced in the exit code except where load decides:
saturation throughput (the best closed loop) >= 0.9 x the run's; p99 <= 2 x p50 at 80% of the predicted
throughput, with the cluster answering at least 97% of the rate sent (else it was over capacity); 0 lost and
0 5xx on valid requests in the soak, RSS drift <= 5%; every accepted request answered across the failover. Markdown to stdout, progress to stderr, --json for the figures; exit 0 when every target
holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* are imported from the checkout
    sys.path.insert(0, str(ROOT))

from benchlib import recorded  # noqa: E402  (tests/bench is sys.path[0] when a script runs)

DEVICES = ("dev-a", "dev-b", "dev-c")
PORT, HTTP_PORT, GRPC_PORT = 7000, 8000, 8001
THREADS = 1
DEVICE_CPUS = 0.4  # each device host's CPU quota: three leave the server and the clients 0.8 of 2 cores
COORDINATOR_CPUS = 0.5  # the least the devices' quotas must leave the coordinator host
CPU_WEIGHT = 5000  # the testbed's hosts before other jobs on a shared machine (tests/netbed_limits.py)
CONCURRENCY = (1, 4, 16)
OPEN_FRACTIONS = (0.5, 0.8, 1.0)
OPEN_CONNECTIONS = 64  # the open loop's requests outstanding at most (a request finding none free waits)
SATURATION_OVER_RUN, P99_OVER_P50, RSS_DRIFT = 0.9, 2.0, 0.05  # issue 40's targets
KEPT_UP = 0.97  # an open-loop point counts only if the cluster answered this share of the rate sent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the load generator (run as `bench_serve.py load ...`, in the coordinator's namespace) ------------------
class Load:
    """Stock tritonclient against one model; each call returns {requests, seconds, throughput_ips, p50/p90/p99_ms,
    errors: {status: count}, lost}."""

    def __init__(self, http: str, grpc: str, model: str, token: str | None):
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.http, self.grpc, self.model = http, grpc, model
        self.headers = {"authorization": f"Bearer {token}"} if token else None  # gRPC metadata keys are lowercase
        self.httpclient, self.grpcclient = httpclient, grpcclient
        meta = httpclient.InferenceServerClient(http).get_model_metadata(model, headers=self.headers)
        self.inputs = [(t["name"], t["shape"], t["datatype"]) for t in meta["inputs"]]
        self.outputs = {t["name"]: t["shape"] for t in meta["outputs"]}
        rng = np.random.default_rng(0)
        self.arrays = {n: rng.standard_normal(s).astype(_NP[d]) for n, s, d in self.inputs}
        self.local = threading.local()

    def _client(self, kind: str):
        key = f"client_{kind}"
        if not hasattr(self.local, key):
            lib = self.httpclient if kind == "http" else self.grpcclient
            setattr(self.local, key, lib.InferenceServerClient(self.http if kind == "http" else self.grpc))
        return getattr(self.local, key)

    def one(self, kind: str, malformed: str | None = None) -> str:
        """Send one request; "ok", or the error's status ("400", "503", "StatusCode.UNAVAILABLE", "lost: ...")."""
        lib = self.httpclient if kind == "http" else self.grpcclient
        given = []
        for name, shape, dtype in self.inputs:
            array = self.arrays[name]
            if malformed == "shape":
                array = array.reshape(-1)[:-1] if array.size > 1 else np.concatenate([array.reshape(-1)] * 2)
            i = lib.InferInput("nope" if malformed == "name" else name, list(array.shape), dtype)
            if kind == "http":
                i.set_data_from_numpy(array, binary_data=True)
            else:
                i.set_data_from_numpy(array)
            given.append(i)
        try:
            if kind == "http":
                self._client(kind).infer(self.model, given, headers=self.headers)
            else:
                self._client(kind).infer(self.model, given, headers=self.headers)
            return "ok"
        except Exception as exc:  # noqa: BLE001 - tritonclient's InferenceServerException, or the connection's
            status = getattr(exc, "status", lambda: None)()
            return str(status) if status else f"lost: {type(exc).__name__}"

    def closed(self, kind: str, clients: int, seconds: float) -> dict:
        cpu = time.process_time()
        end = time.perf_counter() + seconds
        results: list[list[tuple[float, float, str]]] = [[] for _ in range(clients)]

        def loop(k: int) -> None:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                status = self.one(kind)
                results[k].append((t0, time.perf_counter(), status))

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(loop, range(clients)))
        return _summary([r for rs in results for r in rs], time.process_time() - cpu)

    def open(self, rate: float, seconds: float) -> dict:
        """Requests at `rate` per second on a fixed schedule; latency from each request's scheduled time.

        The generator must cost the shared cores less than the server it measures (a thread pool of
        tritonclients took more CPU per request than the server's whole front): the request is encoded once by
        tritonclient (generate_request_body, binary tensors both ways) and sent as the same bytes over
        keep-alive connections from one asyncio loop, up to OPEN_CONNECTIONS at once (a request finding
        none free waits for one, its latency still counted from its scheduled time); each answer's status
        and length are checked, and the first answer is decoded by tritonclient and its outputs checked."""
        import asyncio

        return asyncio.run(self._open(rate, seconds))

    async def _open(self, rate: float, seconds: float) -> dict:
        import asyncio

        lib = self.httpclient
        given = []
        for name, shape, dtype in self.inputs:
            i = lib.InferInput(name, list(shape), dtype)
            i.set_data_from_numpy(self.arrays[name], binary_data=True)
            given.append(i)
        wanted = [lib.InferRequestedOutput(name, binary_data=True) for name in self.outputs]
        body, json_size = lib.InferenceServerClient.generate_request_body(given, outputs=wanted)
        host, port = self.http.rsplit(":", 1)
        head = [f"POST /v2/models/{self.model}/infer HTTP/1.1", f"Host: {self.http}",
                "Content-Type: application/octet-stream", f"Content-Length: {len(body)}"]
        if json_size is not None:
            head.append(f"Inference-Header-Content-Length: {json_size}")
        if self.headers:
            head += [f"{k}: {v}" for k, v in self.headers.items()]
        request = "\r\n".join(head).encode() + b"\r\n\r\n" + body
        idle: list = []
        slots = asyncio.Semaphore(OPEN_CONNECTIONS)
        results: list[tuple[float, float, str]] = []
        checked: list[bytes] = []

        async def send(due: float) -> None:
            async with slots:
                conn = idle.pop() if idle else None
                try:
                    if conn is None:
                        conn = await asyncio.open_connection(host, int(port))
                    reader, writer = conn
                    writer.write(request)
                    status, headers = await _read_head(reader)
                    answer = await reader.readexactly(int(headers.get(b"content-length", b"0")))
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    results.append((due, time.perf_counter(), f"lost: {type(exc).__name__}"))
                    if conn is not None:
                        conn[1].close()
                    return
                results.append((due, time.perf_counter(), "ok" if status == 200 else str(status)))
                if status == 200 and not checked:
                    checked.append(answer)
                    self._check_answer(answer, headers)
                if headers.get(b"connection", b"").lower() == b"close":
                    writer.close()
                else:
                    idle.append(conn)

        count = max(1, int(rate * seconds))
        cpu = time.process_time()
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + 0.2
        tasks = []
        for i in range(count):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(send(due)))
        await asyncio.gather(*tasks)
        for _, writer in idle:
            writer.close()
        return _summary(results, time.process_time() - cpu)

    def _check_answer(self, answer: bytes, headers: dict) -> None:
        """tritonclient decodes the answer; every output the model has must come back in its shape."""
        size = headers.get(b"inference-header-content-length")
        result = self.httpclient.InferenceServerClient.parse_response_body(
            answer, header_length=None if size is None else int(size))
        for name, shape in self.outputs.items():
            got = result.as_numpy(name)
            if got is None or list(got.shape) != list(shape):
                raise SystemExit(f"open loop: output {name!r} came back as {None if got is None else got.shape}, "
                                 f"expected {shape}")

    def soak(self, valid: int, clients: int) -> dict:
        """`valid` requests over HTTP, one malformed request after every nine valid ones."""
        kinds = ["shape", "name"]
        plan = []
        for i in range(valid):
            plan.append(None)
            if i % 9 == 8:
                plan.append(kinds[(i // 9) % 2])
        statuses: list[tuple[str | None, str]] = []
        lock = threading.Lock()
        it = iter(plan)

        def loop(_k: int) -> None:
            while True:
                with lock:
                    bad = next(it, "end")
                if bad == "end":
                    return
                status = self.one("http", bad)
                with lock:
                    statuses.append((bad, status))

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(loop, range(clients)))
        ok = [s for b, s in statuses if b is None]
        bad = [s for b, s in statuses if b is not None]
        return {"valid": len(ok), "malformed": len(bad), "valid_ok": ok.count("ok"),
                "valid_5xx": sum(1 for s in ok if s.startswith("5")),
                "valid_lost": sum(1 for s in ok if s.startswith("lost")),
                "valid_other": sorted({s for s in ok if s != "ok"}),
                "malformed_4xx": sum(1 for s in bad if s.startswith("4")),
                "malformed_other": sorted({s for s in bad if not s.startswith("4")})}


async def _read_head(reader) -> tuple[int, dict[bytes, bytes]]:
    """An HTTP/1.1 response's status code and headers (names lowercased)."""
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


_NP = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
       "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


def _summary(results: list[tuple[float, float, str]], cpu_s: float | None = None) -> dict:
    """Throughput, latency percentiles and errors of (start, end, status) triples; with `cpu_s`, the load
    generator's own CPU time over them, per request answered."""
    ok = sorted((t1 - t0) * 1000.0 for t0, t1, s in results if s == "ok")
    errors: dict[str, int] = {}
    for _, _, s in results:
        if s != "ok":
            errors[s] = errors.get(s, 0) + 1
    span = (max(t1 for _, t1, _ in results) - min(t0 for t0, _, _ in results)) if results else 0.0

    def pct(p: float) -> float | None:
        return ok[min(len(ok) - 1, int(p * len(ok)))] if ok else None

    return {"requests": len(results), "ok": len(ok), "seconds": span,
            "throughput_ips": len(ok) / span if span > 0 else 0.0,
            "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99), "errors": errors,
            "lost": sum(n for s, n in errors.items() if s.startswith("lost")),
            "client_cpu_ms": None if cpu_s is None or not ok else cpu_s * 1000.0 / len(ok)}


def load_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_serve.py load")
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--token")
    p.add_argument("what", choices=["closed", "open", "soak"])
    p.add_argument("--kind", default="http")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--valid", type=int, default=10_000)
    a = p.parse_args(argv)
    load = Load(a.http, a.grpc, a.model, a.token)
    if a.what == "closed":
        out = load.closed(a.kind, a.clients, a.seconds)
    elif a.what == "open":
        out = load.open(a.rate, a.seconds)
    else:
        out = load.soak(a.valid, a.clients)
    print(json.dumps(out))
    return 0


# -- the orchestration ----------------------------------------------------------------------------------------
def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """The CPU time (user + system, every thread's, those ended too) a process has taken so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ms(before: dict[int, float | None], after: dict[int, float | None], requests: int) -> float | None:
    """CPU ms per request the processes took between two readings (those that ended meanwhile left out)."""
    spent = [after[p] - b for p, b in before.items() if b is not None and after.get(p) is not None]
    return sum(spent) * 1000.0 / requests if spent and requests else None


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (a local serve's workers)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = []
        for task in Path(f"/proc/{parent}/task").glob("*"):  # the session's I/O thread starts the workers
            try:
                children += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        found += children
        frontier += children
    return found


class Bench:
    """Where things run: a testbed (host namespaces) or, with --local, this machine with local workers."""

    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.tb = None
        self.workers: dict = {}
        self.keys: Path | None = None
        self.profile_record: dict | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        return argv if self.tb is None else self.tb.exec_argv("coord", argv)

    def edgec(self, *args: str) -> list[str]:
        from tests.e2e.netbed_cluster import edgec_argv

        return self.wrap(edgec_argv(*args))

    def compile(self) -> tuple[Path, dict]:
        from edgec import models
        from tests.e2e.netbed_cluster import cluster_doc, write_yaml

        from benchlib import on_this_machine

        out = self.tmp / "build"
        model = models.ensure(self.args.model)
        if self.tb is None:
            devices = "\n".join(f"  - {{name: {d}, profile: rpi5}}" for d in DEVICES)
            cluster = self.tmp / "cluster.yaml"
            cluster.write_text(f"devices:\n{devices}\nnetwork: {{bandwidth_mbps: {self.args.mbps}, latency_ms: 0.2}}\n")
        else:
            profile = self.tmp / "profile.yaml"
            if self.args.device_cpus:
                from fidelity_hetero_cluster import profile_in_host

                log(f"profiling {DEVICES[0]}'s cgroup ({self.args.device_cpus:g} cores) for every device")
                self.profile_record = profile_in_host(self.tb, DEVICES[0], profile, quick=self.args.quick)
                doc = cluster_doc(self.tb, {d: str(profile) for d in DEVICES}, self.args.mbps, PORT)
                for d in doc["devices"]:  # a quota each, so no `hosts:`: the cores are partitioned, not shared
                    d["threads"] = THREADS
            else:
                from bench_distributed import measure_profile

                measure_profile(profile, self.args.quick)
                doc = on_this_machine(cluster_doc(self.tb, {d: str(profile) for d in DEVICES}, self.args.mbps, PORT),
                                      THREADS)
            cluster = write_yaml(self.tmp / "cluster.yaml", doc)
        done = subprocess.run(self.edgec("compile", str(model), "--devices", str(cluster), "-o", str(out),
                                         "--strategy", "pipeline", "--objective", "throughput", "--fallbacks",
                                         "--json"),
                              capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"edgec compile exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return out, json.loads(done.stdout)

    def keys_args(self) -> list[str]:
        return [] if self.keys is None else ["--keys", str(self.keys)]

    def run_baseline(self, build: Path, repeat: int) -> dict:
        """`edgec run`'s figures, with its CPU ms per request: the run's process and what it started and
        reaped (locally: its workers too; its start-up included), and the testbed's workers over it."""
        workers = [w.proc.pid for w in self.workers.values()]
        before, usage = {p: cpu_s(p) for p in workers}, resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(self.edgec("run", str(build), "--random-inputs", "--repeat", str(repeat), "--json",
                                         *self.keys_args()), capture_output=True, text=True, timeout=3600)
        spent = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"edgec run exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        report = json.loads(done.stdout)
        n = report["completed"]
        return {"throughput_ips": report["throughput_ips"], "inflight": report["inflight"],
                "latency_ms": report["latency_ms"], "requests": n,
                "cpu_ms": (spent.ru_utime + spent.ru_stime - usage.ru_utime - usage.ru_stime) * 1000.0 / n if n else None,
                "workers_cpu_ms": cpu_ms(before, {p: cpu_s(p) for p in workers}, n)}

    def serve(self, build: Path, token: Path) -> subprocess.Popen:
        http = "127.0.0.1:0" if self.tb is None else f"127.0.0.1:{HTTP_PORT}"
        grpc = "127.0.0.1:0" if self.tb is None else f"127.0.0.1:{GRPC_PORT}"
        proc = subprocess.Popen(self.edgec("serve", str(build), "--http", http, "--grpc", grpc, "--model-name", "m",
                                           "--token-file", str(token), *self.keys_args()),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            log(f"  serve: {line.rstrip()}")
            if "edgec: ready:" in line:
                http_port = line.split("http://127.0.0.1:")[1].split("/")[0]
                grpc_port = line.rsplit("grpc 127.0.0.1:", 1)[1].strip()
                proc.addresses = (f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
                threading.Thread(target=lambda: [log(f"  serve: {ln.rstrip()}") for ln in proc.stderr],
                                 daemon=True).start()
                return proc
        raise SystemExit(f"edgec serve exited {proc.wait()} before it was ready")

    def load(self, proc: subprocess.Popen, token: str, *args: str) -> dict:
        """One load point's figures, with the CPU ms per request answered of the server and the workers over it
        (the load generator reports its own)."""
        http, grpc = proc.addresses
        argv = self.wrap([sys.executable, str(Path(__file__).resolve()), "load", "--http", http, "--grpc", grpc,
                          "--model", "m", "--token", token, *args])
        workers = self.worker_pids(proc)
        server0, workers0 = {proc.pid: cpu_s(proc.pid)}, {p: cpu_s(p) for p in workers}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"the load generator exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        out = json.loads(done.stdout)
        answered = out.get("ok", out.get("valid_ok", 0))
        out["server_cpu_ms"] = cpu_ms(server0, {proc.pid: cpu_s(proc.pid)}, answered)
        out["workers_cpu_ms"] = cpu_ms(workers0, {p: cpu_s(p) for p in workers}, answered)
        return out

    def worker_pids(self, serve: subprocess.Popen) -> list[int]:
        return [w.proc.pid for w in self.workers.values()] if self.tb is not None else descendants(serve.pid)

    def victim_pid(self, build: Path, serve: subprocess.Popen) -> tuple[str, int]:
        from bench_distributed import pick_victim

        _, victim = pick_victim(build)
        if self.tb is not None:
            return victim, self.workers[victim].proc.pid
        for pid in descendants(serve.pid):  # a local worker's command line names its device's key
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if victim.encode() in cmdline:
                return victim, pid
        from tests.e2e.netbed_cluster import ClusterError

        # Local workers started with in-memory keys carry no device name on their command line: the failover
        # is then reported as not run (a FAIL), and the other figures still printed.
        raise ClusterError(f"no local worker's command line names {victim}")


def measure(bench: Bench) -> dict:
    a = bench.args
    seconds = a.seconds or (10.0 if a.quick else 60.0)
    build, summary = bench.compile()
    predicted = summary["predicted_throughput_ips"]
    log(f"compiled {a.model}: predicted {predicted:.1f}/s, {summary['predicted_latency_ms']:.1f} ms")
    result: dict = {"model": a.model, "mbps": a.mbps, "seconds": seconds, "predicted_throughput_ips": predicted,
                    "local": a.local, "cores": os.cpu_count() or 1,
                    "device_cpus": None if a.local else (a.device_cpus or None),
                    "cpu_weight": None if a.local or not a.device_cpus else (a.cpu_weight or None),
                    "profile": bench.profile_record,
                    "predicted_busy_ms": {d["name"]: d["predicted_busy_ms"] for d in summary["devices"]
                                          if d.get("fragments")}}
    result["run"] = bench.run_baseline(build, min(20_000, max(200, int(predicted * seconds))))
    log(f"edgec run: {result['run']['throughput_ips']:.1f}/s at inflight {result['run']['inflight']}; CPU ms a request: "
        f"run {_ms(result['run']['cpu_ms'])}, workers {_ms(result['run']['workers_cpu_ms'])}")
    token_text = "bench-serve-token-0123456789"
    token = bench.tmp / "token"
    token.write_text(token_text + "\n")
    serve = bench.serve(build, token)
    try:
        result["closed"] = []
        for kind in ("http", "grpc"):
            for n in CONCURRENCY:
                r = bench.load(serve, token_text, "closed", "--kind", kind, "--clients", str(n), "--seconds", str(seconds))
                result["closed"].append({"kind": kind, "clients": n, **r})
                log(f"closed {kind} x{n}: {r['throughput_ips']:.1f}/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
                    f"errors {r['errors']}; {_cpu_line(r)}")
        result["open"] = []
        for f in OPEN_FRACTIONS:
            r = bench.load(serve, token_text, "open", "--rate", str(f * predicted), "--seconds", str(seconds))
            result["open"].append({"fraction": f, "rate_ips": f * predicted, **r})
            log(f"open {f:.0%}: {r['throughput_ips']:.1f}/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, errors {r['errors']}; "
                f"{_cpu_line(r)}")
        pids = [serve.pid, *bench.worker_pids(serve)]
        before = {pid: rss_kb(pid) for pid in pids}
        r = bench.load(serve, token_text, "soak", "--clients", "4", "--valid", str(1000 if a.quick else 10_000))
        after = {pid: rss_kb(pid) for pid in pids}
        result["soak"] = {**r, "rss_kb": {str(p): [before[p], after[p]] for p in pids}}
        log(f"soak: {r}; RSS {result['soak']['rss_kb']}")
        from tests.e2e.netbed_cluster import ClusterError

        try:
            victim, pid = bench.victim_pid(build, serve)
        except ClusterError as exc:
            result["failover"] = {"skipped": str(exc)}
            log(f"failover: not run: {exc}")
        else:
            killer = threading.Timer(seconds / 2, lambda: os.kill(pid, signal.SIGKILL))
            killer.start()
            r = bench.load(serve, token_text, "closed", "--clients", "4", "--seconds", str(seconds))
            killer.join()
            result["failover"] = {"victim": victim, **r}
            log(f"failover ({victim} killed at {seconds / 2:g} s): {r}")
    finally:
        serve.send_signal(signal.SIGTERM)
        result["serve_exit"] = serve.wait(timeout=120)
    return result


def _cpu_budget(r: dict) -> str:
    """The CPU a request takes on the machine's cores, as the plan priced it and as `edgec run` spent it: the
    devices, their workers and the coordinator share these cores on the testbed (and the server and the
    load generator too while serving), so that the prediction holds only if its CPU per request does."""
    run, busy = r["run"], sum(r["predicted_busy_ms"].values())
    spent = None if run.get("cpu_ms") is None or run.get("workers_cpu_ms") is None else run["cpu_ms"] + run["workers_cpu_ms"]
    spent_text = (f"edgec run spent {_ms(spent)} ms (workers {_ms(run.get('workers_cpu_ms'))}, its own process "
                  f"{_ms(run.get('cpu_ms'))}, start-up included)")
    if r.get("device_cpus"):
        return (f"CPU per request: each device host has a quota of {r['device_cpus']:g} cores and the coordinator "
                f"host (edgec run or serve, and the clients) the rest of the {r['cores']}; the plan prices the "
                f"devices' compute at {busy:.2f} ms; {spent_text}.")
    priced = r["cores"] * 1000.0 / r["predicted_throughput_ips"]
    return (f"CPU per request: at the predicted rate the {r['cores']} cores have {priced:.2f} ms for each (the plan "
            f"prices the devices' compute at {busy:.2f} ms); {spent_text}.")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cpu_line(r: dict) -> str:
    return (f"CPU ms a request: server {_ms(r.get('server_cpu_ms'))}, workers {_ms(r.get('workers_cpu_ms'))}, "
            f"load generator {_ms(r.get('client_cpu_ms'))}")


def targets(r: dict) -> list[tuple[str, bool, str]]:
    best = max(c["throughput_ips"] for c in r["closed"])
    out = [("saturation >= 0.9 x edgec run", best >= SATURATION_OVER_RUN * r["run"]["throughput_ips"],
            f"{best:.1f}/s vs {r['run']['throughput_ips']:.1f}/s")]
    at80 = next(o for o in r["open"] if o["fraction"] == 0.8)
    ratio = (at80["p99_ms"] or 0) / (at80["p50_ms"] or 1)
    kept_up = at80["throughput_ips"] >= KEPT_UP * at80["rate_ips"]
    text = f"{ratio:.2f}" if kept_up else (f"{ratio:.2f}, but the cluster answered {at80['throughput_ips']:.1f}/s of "
                                          f"{at80['rate_ips']:.1f}/s sent: over its capacity, the latencies are a queue's")
    out.append(("p99 <= 2 x p50 at 80%", kept_up and at80["p50_ms"] is not None and ratio <= P99_OVER_P50, text))
    s = r["soak"]
    out.append(("soak: 0 lost, 0 5xx on valid", s["valid_lost"] == 0 and s["valid_5xx"] == 0 and s["valid_ok"] == s["valid"],
                f"{s['valid_ok']}/{s['valid']} ok, {s['valid_5xx']} 5xx, {s['valid_lost']} lost; "
                f"{s['malformed_4xx']}/{s['malformed']} malformed got 4xx"))
    drifts = [(b2 - b1) / b1 for b1, b2 in s["rss_kb"].values() if b1 and b2]
    out.append(("RSS drift <= 5%", all(d <= RSS_DRIFT for d in drifts), ", ".join(f"{d:+.1%}" for d in drifts)))
    f = r["failover"]
    if "skipped" in f:
        out.append(("failover: every accepted request answered", False, f"not run: {f['skipped']}"))
        out.append(("serve exits 0 on SIGTERM", r["serve_exit"] == 0, str(r["serve_exit"])))
        return out
    served_errors = {k: v for k, v in f["errors"].items() if k.startswith("5") or k.startswith("lost")
                     or "UNAVAILABLE" in k or "INTERNAL" in k}
    out.append(("failover: every accepted request answered", not served_errors and f["lost"] == 0,
                f"{f['ok']} ok, errors {f['errors']}"))
    out.append(("serve exits 0 on SIGTERM", r["serve_exit"] == 0, str(r["serve_exit"])))
    return out


def markdown(r: dict) -> str:
    where = "local workers" if r["local"] else f"3 devices at {r['mbps']:g} Mbps"
    if r.get("device_cpus"):
        where = f"3 devices of {r['device_cpus']:g} cores at {r['mbps']:g} Mbps"
    run = r["run"]
    lines = [f"## edgec serve: {r['model']} on {where}",
             "", f"predicted {r['predicted_throughput_ips']:.1f}/s; edgec run {run['throughput_ips']:.1f}/s "
             f"(inflight {run['inflight']})", "",
             "| load | throughput/s | p50 ms | p90 ms | p99 ms | errors | CPU ms/request: server | workers "
             "| load generator |", "|---|---|---|---|---|---|---|---|---|"]

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    def cpu(point):
        return f"{f(point.get('server_cpu_ms'))} | {f(point.get('workers_cpu_ms'))} | {f(point.get('client_cpu_ms'))}"

    lines.append(f"| edgec run (its process, start-up included{', local workers too' if r['local'] else ''}) | "
                 f"{run['throughput_ips']:.1f} | - | - | - | 0 | {f(run.get('cpu_ms'))} | "
                 f"{f(run.get('workers_cpu_ms'))} | - |")
    for c in r["closed"]:
        lines.append(f"| closed {c['kind']} x{c['clients']} | {c['throughput_ips']:.1f} | {f(c['p50_ms'])} | "
                     f"{f(c['p90_ms'])} | {f(c['p99_ms'])} | {c['errors'] or 0} | {cpu(c)} |")
    for o in r["open"]:
        lines.append(f"| open {o['fraction']:.0%} ({o['rate_ips']:.1f}/s) | {o['throughput_ips']:.1f} | {f(o['p50_ms'])} | "
                     f"{f(o['p90_ms'])} | {f(o['p99_ms'])} | {o['errors'] or 0} | {cpu(o)} |")
    lines += ["", _cpu_budget(r)]
    lines += ["", "| target | | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {text} |" for name, ok, text in targets(r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["load"]:
        return load_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 s a point, a 1,000-request soak")
    p.add_argument("--seconds", type=float, default=None, help="seconds a load point (default 60; 10 with --quick)")
    p.add_argument("--mbps", type=float, default=100.0)
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--device-cpus", type=float, default=DEVICE_CPUS, metavar="CORES",
                   help=f"each device host's CPU quota (default {DEVICE_CPUS:g}; 0: no quota, the hosts share the cores)")
    p.add_argument("--cpu-weight", type=int, default=CPU_WEIGHT, metavar="W",
                   help=f"with --device-cpus, every testbed host's CPU weight against the machine's other processes "
                        f"(default {CPU_WEIGHT}, the kernel's 100; 0: the kernel's)")
    p.add_argument("--local", action="store_true", help="no testbed: local workers on this machine")
    p.add_argument("--json", dest="json_file")
    a = p.parse_args(argv)
    if a.device_cpus < 0 or (a.device_cpus and a.device_cpus < 0.2):
        p.error(f"--device-cpus {a.device_cpus:g}: 0 (no quota) or at least 0.2 cores")
    if not 0 <= a.cpu_weight <= 10_000:
        p.error(f"--cpu-weight {a.cpu_weight}: 0 (the kernel's) or from 1 to 10000")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        bench = Bench(a, Path(tmp))
        if a.local:
            result = measure(bench)
        else:
            from tests import netbed
            from tests.e2e.netbed_cluster import deploy
            from tests.netbed import Testbed

            reason = netbed.unavailable_reason()
            if reason:
                raise SystemExit(f"no testbed: {reason} (use --local for a smoke run)")
            from fidelity_testbed import burst_ms

            limits = {}
            if a.device_cpus:
                from tests.netbed import HostLimits

                spare = (os.cpu_count() or 1) - len(DEVICES) * a.device_cpus
                if spare < COORDINATOR_CPUS:
                    raise SystemExit(f"--device-cpus {a.device_cpus:g}: {len(DEVICES)} devices leave the server and "
                                     f"the clients {spare:g} of this machine's cores, under {COORDINATOR_CPUS:g}")
                reason = netbed.unavailable_reason(limits=True)
                if reason:
                    raise SystemExit(f"no CPU quotas: {reason} (use --device-cpus 0)")
                weight = a.cpu_weight or None
                limits = {"coord": HostLimits(cpu_weight=weight)} if weight else {}
                limits.update({d: HostLimits(cpus=a.device_cpus, cpu_weight=weight) for d in DEVICES})
            with Testbed(["coord", *DEVICES], a.mbps, unshaped=["coord"], burst_ms=burst_ms(a.mbps),
                         limits=limits) as tb:
                bench.tb = tb
                bench.keys, bench.workers = deploy(tb, "coord", DEVICES, Path(tmp), port=PORT, threads=THREADS)
                try:
                    result = measure(bench)
                finally:
                    for w in bench.workers.values():
                        w.stop()
    print(markdown(result))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(result, indent=1))
    return 0 if all(ok for _, ok, _ in targets(result)) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:  # a load generator the bench started: its figures go to the bench, not a file
        sys.exit(main())
    sys.exit(recorded(main))
