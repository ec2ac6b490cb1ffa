"""Whether one persistent dispatch can beat a dispatch an op for a decode layer's tail on this
driver, and where its time goes: the persistent tail of b72a04a (o_proj, gate/up, down and the
next layer's q/k/v as four phases of one dispatch, one round of workgroups) with the device clock
read at each phase's steps. Its workgroups wait for a phase either on a device-scope counter (as
b72a04a did: release fence and atomic, polling, acquire) or, tagged, on tags stored beside the
values they load (no counter, no fence: each value's 64-bit word carries the dispatch's epoch).
Prints the variants' results against the ops one by one, then per phase the wait (from the last
workgroup's end of the phase before), the pre-pass and the rows (medians over workgroups and
links, weights hot in L2 or cycling over six layers), then the 2B4T decode step with each.

It runs against b72a04a with persistent_tail.patch (the device clock of d7fee7d, the clock reads,
the tagged variant), built apart from this tree, from that tree's root:

    git worktree add /tmp/tail b72a04a
    git -C /tmp/tail apply $PWD/benchmarks/investigations/persistent_tail.patch
    (cd /tmp/tail && pip install --no-build-isolation --no-deps --target /tmp/tail_site .)
    cd /tmp/tail && PYTHONPATH=/tmp/tail_site \
        python3 <this tree>/benchmarks/investigations/persistent_tail.py

On lavapipe only one workgroup gives the ops' results (as b72a04a noted); the H100's are exact.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import _core

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # the patched tree's benchmarks/
import bench_model
from common import arguments, busy_gpu, torch_cuda, write_results

VARIANTS = {"counters": None, "tagged": "1"}
LINKS = 30
SLOTS = 16  # clock words a workgroup: its start, then (wait or barrier, pre-pass, rows) a phase


def variant(name):
    """Selects the wait the patched decoder_tail compiles in (read at each call)."""
    if VARIANTS[name] is None:
        os.environ.pop("PROBE_TAGGED", None)
    else:
        os.environ["PROBE_TAGGED"] = VARIANTS[name]


def layer_sets(rng, count, h, i, kv):
    def w(n, k):
        return bg.quantize_weights(rng.standard_normal((n, k), dtype=np.float32))

    return [[w(h, h), w(i, h), w(i, h), w(h, i), w(h, h), w(kv, h), w(kv, h)] for _ in range(count)]


def main():
    args = arguments(__doc__)
    device = bg.default_device()
    torch = torch_cuda()
    gpu = device.info.type != "cpu"
    groups = device.info.multiprocessors if gpu else 1
    rng = np.random.default_rng(0)
    h, i, kv = (2560, 6912, 640) if gpu else (256, 512, 64)
    sets = layer_sets(rng, 6 if gpu else 2, h, i, kv)
    nh = bg.Tensor.from_numpy((1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
    ni = bg.Tensor.from_numpy((1 + 0.1 * rng.standard_normal(i)).astype(np.float32))
    norms = [nh, nh, ni, nh]
    a = bg.Tensor.from_numpy(rng.standard_normal((1, h)).astype(np.float32))
    x0 = bg.Tensor.from_numpy(rng.standard_normal((1, h)).astype(np.float32))
    results = {"device": device.name, "exact": [], "phases": [], "decode_step": []}

    def tail(weights, x, **settings):
        with bg.tuning(**settings):
            return _core.decoder_tail(a, x, [t._core for t in weights], norms, 1e-5)

    def layers_timed(layers, after_replay=lambda: None, **settings):
        """Median GPU µs a layer of a graph of LINKS tails cycling over `layers` weight sets,
        replayed args.repeats times after one, after_replay() after each."""
        graph = bg.Graph(device, timings="total")
        x = x0
        with graph:
            for n in range(LINKS):
                x, *_ = tail(sets[n % layers], x, **settings)
        graph.run()
        totals = []
        for _ in range(args.repeats):
            if torch is not None:
                busy_gpu(torch, 0.2)
            graph.run()
            totals.append(graph.timings()[0][1] / LINKS * 1e6)
            after_replay()
        return float(np.median(totals))

    expected = [t.numpy() for t in tail(sets[0], x0, chain_workgroups=0)]
    for name in VARIANTS:
        variant(name)
        for count, local in ((groups, 256), (groups, 512), (2 * groups, 256)):
            try:
                out = [
                    t.numpy()
                    for t in tail(sets[0], x0, chain_workgroups=count, chain_local_size=local)
                ]
                exact = all(np.array_equal(o, e) for o, e in zip(out, expected))
            except bg.Error as error:  # a wait bounded out: not all resident
                exact = f"{type(error).__name__}: {error}"
            results["exact"].append(
                {"wait": name, "workgroups": count, "local_size": local, "exact": exact}
            )
            print(f"{name:8s} {count:4d} workgroups of {local}: {exact}", flush=True)

    variant("counters")
    for layers in (1, len(sets)):  # the same links as the ops one by one: four dispatches a layer
        row = {
            "wait": "dispatches",
            "layers": layers,
            "us_per_layer": layers_timed(layers, chain_workgroups=0),
        }
        results["phases"].append(row)
        print(
            f"ops one by one, {layers} layer(s): {row['us_per_layer']:.2f} µs a layer", flush=True
        )
    for name in VARIANTS:
        variant(name)
        for local in (512, 256):
            for layers in (1, len(sets)):
                _core.scratch_timelines_clear()  # each tail recorded adds its counters
                reads = []

                def read_timelines(reads=reads):
                    for timeline in _core.scratch_timelines():
                        # the clock words follow the counters (TL in the patch's shader); ns
                        # from the link's first start, the clock's low word possibly wrapped
                        t = timeline.numpy()[256:].reshape(-1, SLOTS).astype(np.int64)
                        reads.append((t - t[:, :1].min() + 2**31) % 2**32 - 2**31)

                us = layers_timed(
                    layers, read_timelines, chain_local_size=local, chain_workgroups=groups
                )
                r = np.array(reads, np.float64) / 1000.0  # [link, workgroup, slot] in µs
                row = {"wait": name, "local_size": local, "layers": layers, "us_per_layer": us}
                text = []
                previous_end = None
                for p in range(4):
                    begin, prepass, rows = 1 + 3 * p, 2 + 3 * p, 3 + 3 * p
                    end = r[:, :, rows].max(1)
                    phase = {
                        "prepass_us": float(np.median(r[:, :, prepass] - r[:, :, begin])),
                        "rows_us": float(np.median(r[:, :, rows] - r[:, :, prepass])),
                        "end_us": float(np.median(end)),
                    }
                    if previous_end is not None:
                        phase["wait_us"] = float(np.median(r[:, :, begin].max(1) - previous_end))
                    previous_end = end
                    row[f"phase{p}"] = phase
                    text.append(
                        f"P{p} "
                        + ("" if p == 0 else f"wait {phase['wait_us']:.2f} ")
                        + f"pre-pass {phase['prepass_us']:.2f} rows {phase['rows_us']:.2f}"
                    )
                results["phases"].append(row)
                print(
                    f"{name:8s} {local} invocations, {layers} layer(s): "
                    f"{row['us_per_layer']:.2f} µs a layer; " + "; ".join(text),
                    flush=True,
                )

    model = bench_model.BitNetModel.random(
        bench_model.BitNetConfig.preset("2b4t" if gpu else "tiny"), seed=0, max_tokens=2100
    )
    contexts = (128, 2048) if gpu else (16,)
    bench_model.fill_cache(model, max(contexts))
    cases = [("ops one by one", "counters", {"chain_workgroups": 0})]
    cases += [(f"tail, {name}", name, {"chain_local_size": 512}) for name in VARIANTS]
    for label, name, settings in cases:
        variant(name)
        with bg.tuning(**settings):
            model.reset_graphs()
            for context in contexts:
                step = bench_model.decode_step(model, context)
                step()
                if torch is not None:
                    busy_gpu(torch, 0.3)
                us = bench_model.gpu_seconds(model, step, args.repeats * 6) * 1e6
                results["decode_step"].append({"case": label, "context": context, "gpu_us": us})
                print(f"decode step, {label:16s} context {context:5d}: {us:8.1f} µs", flush=True)
    variant("counters")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
