"""Devices that share a machine (cluster.yaml `hosts:`): the work one input gives its cores bounds the
throughput evaluate predicts (compiler/cost/cpu_bounds.py `host_periods`).

Hand-made profiles with the runtime's costs, so every expected number is worked out here."""

from __future__ import annotations

import onnx
import pytest
import yaml
from onnx import shape_inference

from edgec.compiler.cluster import load_cluster
from edgec.compiler.cost import build_cost_table, evaluate
from edgec.compiler.errors import UserError
from edgec.compiler.ingest import load_model
from edgec.compiler.plan_types import Plan, Stage
from tests.conftest import conv_chain_model

FIG = {"op_overhead_us": 10.0, "gflops": {"conv": 2.0, "depthwise_conv": 1.0, "gemm": 2.0, "other": 1.0},
       "memory_gbps": 10.0}
RUNTIME = {"message_ms": 0.4, "message_ms_per_mb": 2.0, "request_ms": 1.0}


def write(tmp_path, hosts=None, device_hosts=("box", "box"), threads=(1, 1), runtime=True, name="c.yaml", quota=None,
          burst=None):
    prof = {"name": "p", "memory_mb": 4096, "usable_memory_fraction": 0.75, "runtime_overhead_mb": 50, **FIG,
            **({"runtime": RUNTIME if runtime is True else runtime} if runtime else {}),
            **({"cpu_quota": {"cores": quota, "period_us": 5000, "source": "cgroup v1", "burst_ms": burst}}
               if quota else {})}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    devices = []
    for i, (h, t) in enumerate(zip(device_hosts, threads)):
        devices.append({"name": f"d{i}", "profile": "p.yaml", **({"host": h} if h else {}),
                        **({"threads": t} if t else {})})
    doc = {"devices": devices, "network": {"bandwidth_mbps": 1000, "latency_ms": 0}}
    if hosts is not None:
        doc["hosts"] = hosts
    (tmp_path / name).write_text(yaml.safe_dump(doc))
    return tmp_path / name


@pytest.fixture
def chain(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(shape_inference.infer_shapes(conv_chain_model(n=4, channels=8, size=16)), path)
    return load_model(path)


def two_stages(graph) -> Plan:
    n = len(graph.layers)
    return Plan("manual", "throughput", (Stage("d0", 0, n // 2), Stage("d1", n // 2, n))).ensures(graph)


def predict(chain, cluster_path):
    cost = build_cost_table(chain.graph, load_cluster(cluster_path), chain.sha256)
    return cost, evaluate(two_stages(chain.graph), chain.graph, cost)


def test_a_shared_machine_bounds_the_period_by_its_cores_work(chain, tmp_path):
    cost, apart = predict(chain, write(tmp_path, device_hosts=(None, None)))
    _, shared = predict(chain, write(tmp_path, hosts={"box": {"cores": 1, "coordinator": True}}, name="h.yaml"))
    assert apart.host_ms == {}
    net = cost.network
    (tr,) = [t for t in shared.transfers]
    inputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    outputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.outputs)
    # both devices' compute (1 thread each), the message's runtime work at both ends, and the request's
    # hand-offs at both ends (device and coordinator, all on the one machine)
    work = (sum(shared.busy_ms.values()) + net.runtime_ms(tr.nbytes, "d0", "d1")
            + net.request_in_ms("d0", inputs) + net.request_out_ms("d1", outputs))
    assert net.runtime_ms(tr.nbytes, "d0", "d1") == pytest.approx(0.4 + tr.nbytes * 2.0 / 1e6)
    assert shared.host_ms == {"box": pytest.approx(work)}
    assert shared.bottleneck_ms == pytest.approx(max(work, apart.bottleneck_ms))
    assert shared.bottleneck_ms > apart.bottleneck_ms  # one core for two stages and the coordinator
    assert shared.throughput_ips == pytest.approx(1000.0 / shared.bottleneck_ms)
    assert shared.latency_ms == apart.latency_ms  # the bound is on throughput only
    # the manifest's predicted section says what bounds it; without hosts it is as before
    assert shared.to_dict()["hosts"] == {"box": {"period_ms": round(work, 4)}}
    assert "hosts" not in apart.to_dict()


def test_cores_threads_and_the_coordinators_place_scale_the_work(chain, tmp_path):
    _, one = predict(chain, write(tmp_path, hosts={"box": {"cores": 1, "coordinator": True}}))
    _, two = predict(chain, write(tmp_path, hosts={"box": {"cores": 2, "coordinator": True}}, name="2.yaml"))
    assert two.host_ms["box"] == pytest.approx(one.host_ms["box"] / 2)
    # a worker at the default thread count computes on every core of its machine
    _, wide = predict(chain, write(tmp_path, hosts={"box": {"cores": 2}}, threads=(None, 1), name="w.yaml"))
    _, narrow = predict(chain, write(tmp_path, hosts={"box": {"cores": 2}}, name="n.yaml"))
    assert wide.host_ms["box"] - narrow.host_ms["box"] == pytest.approx(narrow.busy_ms["d0"] / 2)
    # the coordinator elsewhere: the machine does half of each request hand-off
    cost, away = predict(chain, write(tmp_path, hosts={"box": {"cores": 2}}, name="a.yaml"))
    inputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    outputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.outputs)
    half = (cost.network.request_in_ms("d0", inputs) + cost.network.request_out_ms("d1", outputs)) / 2
    assert two.host_ms["box"] - away.host_ms["box"] == pytest.approx(half / 2)


def test_devices_on_different_machines_each_get_their_own(chain, tmp_path):
    cost, pred = predict(chain, write(tmp_path, hosts={"a": {"cores": 1}, "b": {"cores": 1}}, device_hosts=("a", "b")))
    (tr,) = pred.transfers
    msg = cost.network.runtime_ms(tr.nbytes, "d0", "d1") / 2
    inputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    outputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.outputs)
    assert pred.host_ms["a"] == pytest.approx(pred.busy_ms["d0"] + msg + cost.network.request_in_ms("d0", inputs) / 2)
    assert pred.host_ms["b"] == pytest.approx(pred.busy_ms["d1"] + msg + cost.network.request_out_ms("d1", outputs) / 2)


@pytest.mark.parametrize("hosts, device_hosts, message", [
    ({"box": {"cores": 2}}, ("box", "boz"), "device 'd1': host 'boz' is not in 'hosts' (hosts: box)"),
    (None, ("box", None), "device 'd0': host 'box' is not in 'hosts' (the file has no 'hosts' section)"),
    ({"box": {"cores": 2}, "idle": {"cores": 4}}, ("box", "box"), "hosts['idle']: no device names it"),
    ({"a": {"cores": 1, "coordinator": True}, "b": {"cores": 1, "coordinator": True}}, ("a", "b"),
     "hosts: the coordinator runs on one machine, but a, b all say coordinator: true"),
    ({"box": {"cores": 0}}, ("box", "box"), "hosts['box'].cores must be an integer from 1 to 4096, got int 0"),
    ({"box": {"cores": 2, "ram": 4}}, ("box", "box"), "unknown key 'ram' in hosts['box'] (allowed: cores, coordinator)"),
])
def test_bad_hosts_are_one_line_errors(tmp_path, hosts, device_hosts, message):
    with pytest.raises(UserError) as err:
        load_cluster(write(tmp_path, hosts=hosts, device_hosts=device_hosts))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_runtimes_cpu_figures_price_the_machines_work_where_measured(chain, tmp_path):
    """A profile with CPU figures: the machine's work uses them (ZeroMQ's I/O threads make a message cost
    more CPU than time); the timeline keeps the time figures."""
    _, timed = predict(chain, write(tmp_path, hosts={"box": {"cores": 1, "coordinator": True}}))
    cpu = {**RUNTIME, "message_cpu_ms": 0.9, "message_cpu_ms_per_mb": 5.0, "request_cpu_ms": 3.0}
    path = write(tmp_path, hosts={"box": {"cores": 1, "coordinator": True}}, name="cpu.yaml")
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    prof["runtime"] = cpu
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    cost, pred = predict(chain, path)
    (tr,) = pred.transfers
    net = cost.network
    assert net.runtime_ms(tr.nbytes, "d0", "d1") == pytest.approx(0.9 + tr.nbytes * 5.0 / 1e6)
    inputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    outputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.outputs)
    work = (sum(pred.busy_ms.values()) + 0.9 + tr.nbytes * 5.0 / 1e6
            + 3.0 + (inputs + outputs) * 5.0 / 1e6)
    assert pred.host_ms == {"box": pytest.approx(work)}
    assert pred.latency_ms == timed.latency_ms and pred.transfers == timed.transfers  # time figures unchanged


def test_a_plan_for_a_shared_machine_runs_and_reproduces_the_model(chain, tmp_path):
    """compile -> run: a cluster with hosts compiles to a build whose predicted section names the bound,
    and running it streams verified outputs."""
    from edgec.compiler.api import compile as compile_model
    from edgec.runtime.front.api import execute

    path = write(tmp_path, hosts={"box": {"cores": 2, "coordinator": True}})
    compile_model(chain.path, path, tmp_path / "out", strategy="pipeline", objective="throughput")
    manifest = yaml.safe_load((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest["predicted"]["hosts"]) == {"box"}
    _, result, checked = execute(tmp_path / "out", random_inputs=True, verify=True, repeat=4, threads=1)
    assert checked is not None and checked.passed and result.completed == 4 and result.lost == 0



def test_of_a_planners_plans_the_one_predicted_best_is_chosen(chain, tmp_path):
    """The pipeline DP ranks its top-K by each stage's compute and each cut's transfer; evaluate also prices
    what it leaves out (the CPU a shared machine's messages take of its cores). The driver orders a planner's
    plans by their predictions, stably: a plan the planner listed first but predicted slower becomes a
    runner-up, and a tie keeps the planner's order."""
    from edgec.compiler.plan.choose import _candidate, _key

    path = write(tmp_path, device_hosts=(None, None))
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    prof["gflops"] = {k: 0.05 for k in prof["gflops"]}  # compute, not the messages, bounds the period
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    cost = build_cost_table(chain.graph, load_cluster(path), chain.sha256)
    n = len(chain.graph.layers)
    lopsided = Plan("pipeline", "throughput", (Stage("d0", 0, 1), Stage("d1", 1, n))).ensures(chain.graph)
    balanced = two_stages(chain.graph)
    c = _candidate("pipeline", chain.graph, cost, [lopsided, balanced], "throughput")
    assert c.plan == balanced and [p for p, _ in c.runners_up] == [lopsided]
    assert c.prediction.bottleneck_ms < c.runners_up[0][1].bottleneck_ms
    assert _key(c, "throughput") < _key(type(c)("pipeline", lopsided, c.runners_up[0][1]), "throughput")
    # the same stages on the other device (the two are alike) tie: the planner's order stands
    mirror = Plan("pipeline", "throughput", tuple(Stage(("d1", "d0")[i], s.lo, s.hi)
                                                 for i, s in enumerate(balanced.stages))).ensures(chain.graph)
    for first, second in ((mirror, balanced), (balanced, mirror)):
        c = _candidate("pipeline", chain.graph, cost, [first, second, lopsided], "throughput")
        assert c.plan == first and [p for p, _ in c.runners_up] == [second, lopsided]


def test_like_devices_on_other_machines_are_distinct_plans(chain, tmp_path):
    """Three alike devices, two on one machine of one core.  The pipeline DP takes interchangeable devices in
    index order and, for the planner, returns no relabelled copies.  Devices on different machines are not
    interchangeable (evaluate charges a machine's devices for its cores), so every way to place the best split
    on the two machines is a plan of the planner's own, and the driver chooses the best of them: here the
    first stage on the other machine (the DP's device order would put it on the shared one)."""
    import itertools

    from edgec.compiler.plan.choose import _candidate
    from edgec.compiler.plan.pipeline import plan_pipeline
    from edgec.compiler.plan.pipeline_problem import pipeline_problem
    from edgec.compiler.plan.pipeline_tables import device_classes
    from edgec.compiler.plan.planner import PlanOptions

    path = write(tmp_path, hosts={"box": {"cores": 1, "coordinator": True}, "other": {"cores": 1}},
                 device_hosts=("box", "box", "other"), threads=(1, 1, 1))
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    prof["gflops"] = {k: 0.05 for k in prof["gflops"]}  # compute, not the messages, bounds the period
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    cost = build_cost_table(chain.graph, load_cluster(path), chain.sha256)
    assert device_classes(pipeline_problem(chain.graph, cost)).tolist() == [0, 0, 2]
    plans = plan_pipeline(chain.graph, cost, "throughput", PlanOptions())
    assert len({p.stages for p in plans}) == len(plans) == 3
    c = _candidate("pipeline", chain.graph, cost, plans, "throughput")
    spans = [(s.lo, s.hi) for s in c.plan.stages]
    every = [evaluate(Plan("pipeline", "throughput", tuple(Stage(d, lo, hi) for d, (lo, hi) in zip(order, spans)))
                      .ensures(chain.graph), chain.graph, cost).bottleneck_ms
             for order in itertools.permutations(cost.devices, len(spans))]
    assert c.prediction.bottleneck_ms == min(every) < max(every)
    assert c.plan.stages[0].device == "d2"


def test_devices_alike_but_for_their_power_are_not_interchangeable(chain, tmp_path):
    """Same figures, different power: swapping them changes a plan's energy, so the DP keeps both orders."""
    from edgec.compiler.plan.pipeline_problem import pipeline_problem
    from edgec.compiler.plan.pipeline_tables import device_classes

    path = write(tmp_path, device_hosts=(None, None, None), threads=(1, 1, 1))
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({**prof, "power_w": {"idle": 2.0, "busy": 5.0}}))
    doc = yaml.safe_load(path.read_text())
    doc["devices"][2]["profile"] = "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    cost = build_cost_table(chain.graph, load_cluster(path), chain.sha256)
    assert device_classes(pipeline_problem(chain.graph, cost)).tolist() == [0, 0, 2]


def test_the_spatial_searches_group_devices_of_different_machines(chain, tmp_path):
    """The spatial and hybrid searches take the first k devices of each interchangeable class: alike devices on
    different machines are different classes, so a group of one device of each machine is searched (two
    devices of one machine share its memory path and cores)."""
    from edgec.compiler.plan.spatial import _subsets, device_classes

    path = write(tmp_path, hosts={"box": {"cores": 2}, "other": {"cores": 1}},
                 device_hosts=("box", "box", "other"), threads=(1, 1, 1))
    cost = build_cost_table(chain.graph, load_cluster(path), chain.sha256)
    assert device_classes(cost, cost.devices) == ["d0", "d2"]
    assert ["d0", "d2"] in _subsets(cost) and ["d0", "d1"] in _subsets(cost)
    alike = build_cost_table(chain.graph, load_cluster(write(tmp_path, device_hosts=(None, None, None),
                                                             threads=(1, 1, 1), name="n.yaml")), chain.sha256)
    assert device_classes(alike, alike.devices) == ["d0"]


def test_allocation_classes_keep_machines_apart(tmp_path):
    """edgec allocate gives a service a count of devices per class, the first of each: alike devices on
    different machines are different classes, so a count can take one device of each machine."""
    from edgec.compiler.allocate.classes import device_classes as allocation_classes

    path = write(tmp_path, hosts={"box": {"cores": 2}, "other": {"cores": 1}},
                 device_hosts=("box", "box", "other"), threads=(1, 1, 1))
    assert allocation_classes(load_cluster(path)).members == (("d0", "d1"), ("d2",))
    alone = write(tmp_path, device_hosts=(None, None, None), threads=(1, 1, 1), name="n.yaml")
    assert allocation_classes(load_cluster(alone)).members == (("d0", "d1", "d2"),)


def test_a_quota_bounds_a_devices_period_by_its_compute_and_messaging_work(chain, tmp_path):
    """A device profiled under a CPU quota (cpu_quota.cores): its compute (already at the quota's pace) and its
    runtime's messaging work share the quota, so each device's period is at least compute + messaging / quota."""
    cost, free = predict(chain, write(tmp_path, device_hosts=(None, None)))
    qcost, limited = predict(chain, write(tmp_path, device_hosts=(None, None), quota=0.4, name="q.yaml"))
    assert qcost.cluster.devices[0].profile.cpu_quota_cores == 0.4
    net = qcost.network
    (tr,) = limited.transfers
    inputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    outputs = sum(chain.graph.tensors[t].nbytes for t in chain.graph.outputs)
    half = net.runtime_ms(tr.nbytes, "d0", "d1") / 2.0
    # 1 thread over 0.4 cores: the compute's CPU is 0.4 x its time, over 0.4 cores: its time
    d0 = limited.busy_ms["d0"] + (half + net.request_in_ms("d0", inputs, cpu=True) / 2.0) / 0.4
    d1 = limited.busy_ms["d1"] + (half + net.request_out_ms("d1", outputs, cpu=True) / 2.0) / 0.4
    assert limited.period_ms == {"d0": pytest.approx(d0), "d1": pytest.approx(d1)}
    assert limited.bottleneck_ms == pytest.approx(max(d0, d1, *[v for v in free.period_ms.values()]))
    assert free.period_ms == free.busy_ms  # without a quota, a pipeline stage's period is its compute
    assert limited.latency_ms == free.latency_ms  # lone inputs one after another: no device's period is longer
    # a device sharing a machine (hosts:) is bounded by the machine's cores instead
    _, shared = predict(chain, write(tmp_path, hosts={"box": {"cores": 1}}, quota=0.4, name="qh.yaml"))
    assert shared.period_ms == shared.busy_ms and shared.host_ms


def compute_ms(pred, device):
    (ev,) = [e for e in pred.timeline if e.kind == "compute" and e.device == device]
    return ev.end_ms - ev.start_ms


def test_a_lone_input_runs_a_quotad_devices_burst_at_full_speed(chain, tmp_path):
    """A device profiled under a quota with a measured burst (cpu_quota.burst_ms, CPU ms at full speed after
    idle): a lone input's compute there runs its first burst_ms of CPU at full speed and the rest at the share
    (cost/quota_burst.py); throughput and periods stay as without the burst; and inputs one after another
    follow each other no faster than any quota'd device's period, so the latency is at least that."""
    _, slow = predict(chain, write(tmp_path, device_hosts=(None, None), quota=0.4, name="q.yaml"))
    d0, d1 = slow.busy_ms["d0"], slow.busy_ms["d1"]  # at the share: CPU = 0.4 x these, at 1 thread
    burst = 0.4 * d0 / 2  # half of d0's CPU
    _, part = predict(chain, write(tmp_path, device_hosts=(None, None), quota=0.4, burst=burst, name="b.yaml"))
    assert compute_ms(part, "d0") == pytest.approx(burst + (0.4 * d0 - burst) / 0.4)
    assert compute_ms(part, "d1") == pytest.approx(burst + (0.4 * d1 - burst) / 0.4)
    saved = (d0 - compute_ms(part, "d0")) + (d1 - compute_ms(part, "d1"))
    assert part.latency_ms == pytest.approx(slow.latency_ms - saved)
    assert part.period_ms == slow.period_ms and part.throughput_ips == slow.throughput_ips
    assert part.stage_ms == slow.stage_ms  # the fragments' compute, which the emulator pads runs to
    # a burst longer than all of it: full speed, and the latency is the longest quota'd period
    _, fast = predict(chain, write(tmp_path, device_hosts=(None, None), quota=0.4, burst=1e3, name="f.yaml"))
    assert compute_ms(fast, "d0") == pytest.approx(0.4 * d0)
    timeline = slow.latency_ms - 0.6 * (d0 + d1)  # the lone input's path, at full speed
    assert fast.latency_ms == pytest.approx(max(timeline, *fast.period_ms.values()))
    # one device: its whole request in a burst is faster than it can take requests one after another
    cost = build_cost_table(chain.graph, load_cluster(tmp_path / "f.yaml"), chain.sha256)
    one = evaluate(Plan("manual", "latency", (Stage("d0", 0, len(chain.graph.layers)),)).ensures(chain.graph),
                   chain.graph, cost)
    assert one.latency_ms == one.period_ms["d0"] > compute_ms(one, "d0") + cost.network.request_in_ms(
        "d0", sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs))
    # without a quota the burst is not read
    _, free = predict(chain, write(tmp_path, device_hosts=(None, None)))
    assert compute_ms(free, "d0") == free.busy_ms["d0"]


def test_a_lone_inputs_messages_to_a_bursting_device_go_at_the_cpu_figure_and_streaming_at_the_share(
        chain, tmp_path, monkeypatch):
    """A lone input's hand-offs to and from a device whose quota bursts run at full speed: their bytes at the
    profile's message_cpu_ms_per_mb (the runtime's work timed on one CPU), not at message_ms_per_mb, which
    follows the share (cost/quota_burst.py); the links' periods and the coordinator's stay at the share."""
    from edgec.compiler.cluster.cluster import DeviceSpec

    cpu = {**RUNTIME, "message_cpu_ms_per_mb": 0.5}
    path = write(tmp_path, device_hosts=(None, None), quota=0.4, burst=1e3, runtime=cpu, name="f.yaml")
    _, fast = predict(chain, path)
    with monkeypatch.context() as m:  # the same cluster with a lone input's costs those of streaming
        m.setattr(DeviceSpec, "lone_runtime", property(lambda self: self.runtime))
        _, share = predict(chain, path)
    (tr,) = share.transfers
    (ev,) = [e for e in fast.timeline if e.kind == "transfer" and e.device == "d0" and "-> d1" in e.what]
    assert fast.transfers == share.transfers  # what holds the link while inputs stream
    assert ev.end_ms - ev.start_ms == pytest.approx(tr.ms - tr.nbytes * (2.0 - 0.5) / 1e6)
    assert fast.period_ms == share.period_ms and fast.throughput_ips == share.throughput_ips
    assert fast.coordinator_ms == share.coordinator_ms
    ins = sum(chain.graph.tensors[t].nbytes for t in chain.graph.inputs)
    saved = (tr.nbytes + ins) * (2.0 - 0.5) / 1e6  # the hand-off between the devices and the model's input
    timeline = lambda p: max(e.end_ms for e in p.timeline)  # the last compute (the output's hand-off follows it)
    assert timeline(fast) == pytest.approx(timeline(share) - saved)
    # without a burst (or without a quota) the lone input meets the share's figures
    for quota, burst in ((0.4, None), (None, None)):
        _, plain = predict(chain, write(tmp_path, device_hosts=(None, None), quota=quota, burst=burst, runtime=cpu,
                                        name="plain.yaml"))
        (ev,) = [e for e in plain.timeline if e.kind == "transfer" and e.device == "d0" and "-> d1" in e.what]
        assert ev.end_ms - ev.start_ms == pytest.approx(plain.transfers[0].ms)


def test_a_spatial_stage_on_bursting_devices_times_its_tiles_and_messages_as_a_lone_request_meets_them(
        tmp_path, monkeypatch):
    """A spatial stage's timeline is run at the share for what it holds its devices for while inputs stream
    (spans, compute, the links' transfers) and as a lone request meets it for the latency: its tiles spend their
    devices' bursts (here longer than all of it: full speed, the price times the quota) and its messages go at
    the CPU figure (cost/quota_burst.py)."""
    from edgec.compiler.cluster.cluster import DeviceSpec
    from edgec.compiler.plan.spatial import search_spatial

    path = tmp_path / "wide.onnx"
    onnx.save(shape_inference.infer_shapes(conv_chain_model(n=4, channels=32, size=32)), path)
    graph = load_model(path).graph
    cluster = load_cluster(write(tmp_path, device_hosts=(None, None), quota=0.4, burst=1e3,
                                 runtime={**RUNTIME, "message_cpu_ms_per_mb": 0.5}, name="q.yaml"))
    cost = build_cost_table(graph, cluster)
    plan, _ = search_spatial(graph, cost)
    assert plan.stages[0].spatial is not None and len(set(plan.stages[0].spatial.devices)) == 2
    lone = evaluate(plan, graph, cost)
    with monkeypatch.context() as m:  # the same cluster with no burst and a lone input's costs at the share
        m.setattr(DeviceSpec, "quota_burst", property(lambda self: None))
        share = evaluate(plan, graph, build_cost_table(graph, cluster))
    assert (lone.period_ms, lone.busy_ms, lone.transfers, lone.stage_ms) == (
        share.period_ms, share.busy_ms, share.transfers, share.stage_ms)
    tiles = lambda p: [e.end_ms - e.start_ms for e in p.timeline if e.kind == "compute" and " rows " in e.what]
    assert len(tiles(lone)) > 1 and tiles(lone) == pytest.approx([0.4 * ms for ms in tiles(share)])
    sends = lambda p: {(e.device, e.what): e.end_ms - e.start_ms for e in p.timeline
                       if e.kind == "transfer" and not e.what.endswith(f"-> {e.device}")}  # not a stage's own
    assert sends(lone).keys() == sends(share).keys() and len(sends(lone)) > 0
    assert all(ms < sends(share)[k] for k, ms in sends(lone).items())
    assert max(e.end_ms for e in lone.timeline) < max(e.end_ms for e in share.timeline)
