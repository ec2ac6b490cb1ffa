"""``python -m bitnet_gpu info`` and ``demo``: the Vulkan devices and what each can do, and
BitNet on this device, each step checked against NumPy."""

from __future__ import annotations

import time

import numpy as np

import bitnet_gpu as bg


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _telemetry_line(reading: dict) -> str:
    """A telemetry reading as one line, the fields the platform gave."""
    parts = []
    for field, unit in [
        ("temperature_c", " C"),
        ("power_w", " W"),
        ("power_limit_w", " W limit"),
        ("sm_clock_mhz", " MHz SM"),
        ("memory_clock_mhz", " MHz memory"),
    ]:
        if reading.get(field) is not None:
            parts.append(f"{reading[field]:.0f}{unit}")
    if reading.get("utilization") is not None:
        parts.append(f"{100 * reading['utilization']:.0f}% busy")
    if reading.get("throttle_reasons"):
        parts.append("throttled: " + ", ".join(reading["throttle_reasons"]))
    return ", ".join(parts) or "nothing reported"


def info(_args) -> int:
    chosen = bg.default_device().info.index
    for d in bg.devices():
        mark = "*" if d.index == chosen else " "
        print(f"{mark} device {d.index}: {d.name}")
        print(
            f"    type {d.type}, vendor 0x{d.vendor_id:04x}, Vulkan {d.vulkan_version}, "
            f"driver {d.driver_name} ({d.driver_info})"
        )
        heaps = ", ".join(
            f"{size_text(h['size'])}{' device-local' if h['device_local'] else ''}"
            for h in d.memory_heaps
        )
        print(f"    memory heaps: {heaps}")
        print(
            f"    subgroup {d.subgroup_size}, workgroup <= {d.max_workgroup_invocations} "
            f"invocations, shared memory {size_text(d.max_shared_memory)}, "
            f"storage buffer range {size_text(d.max_storage_buffer_range)}, "
            f"allocation <= {size_text(d.max_allocation_size)}"
            + (f", {d.multiprocessors} multiprocessors" if d.multiprocessors else "")
        )
        features = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in sorted(d.features.items()))
        print(f"    features: {features}")
        if d.cooperative_matrices:
            print(f"    cooperative matrices: {'; '.join(d.cooperative_matrices)}")
        if d.uuid or d.pci_address:
            print(f"    uuid {d.uuid}" + (f", PCI {d.pci_address}" if d.pci_address else ""))
        if d.index == chosen:
            device = bg.default_device()
            reading = device.telemetry()
            if reading["source"]:
                print(f"    now ({reading['source']}): {_telemetry_line(reading)}")
            heaps = device.memory_stats()["heaps"]
            if any(h["budget"] is not None for h in heaps):
                print(
                    "    heap budgets: "
                    + ", ".join(
                        f"{size_text(h['usage'])} used of {size_text(h['budget'])}" for h in heaps
                    )
                )
    print("(* = the device bitnet_gpu uses by default; BITNET_GPU_DEVICE=<index|name> changes it)")
    return 0


DEMO_CORPUS = [
    "BitNet b1.58 keeps every weight in three values and every activation in eight bits.",
    "The ternary matrix multiplies int8 activations exactly; a scale per tensor does the rest.",
    "Vulkan runs it on any GPU, and on the CPU where there is none.",
]


def _demo_tokenizer():
    """A byte-level BPE tokenizer trained here on a few sentences (the tokenizers library), as a
    checkpoint's tokenizer.json would be read."""
    import tempfile

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from bitnet_gpu.text import Tokenizer

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(DEMO_CORPUS * 10, trainer)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/tokenizer.json"
        tok.save(path)
        return Tokenizer(path)


def demo(_args) -> int:
    """BitNet on this device, each step against NumPy: a layer quantized to ternary weights, a
    BitLinear with exact integer accumulators, and a small decoder generating text."""
    from bitnet_gpu import reference
    from bitnet_gpu.models import BitNetConfig, BitNetModel

    device = bg.default_device()
    print(f"device: {device.name} ({device.info.type}, Vulkan {device.info.vulkan_version})")
    rng = np.random.default_rng()
    ok = True

    def report(name: str, good: bool, detail: str, seconds: float) -> None:
        nonlocal ok
        ok &= good
        print(f"  {'PASS' if good else 'FAIL'}  {name}: {detail} ({seconds * 1e3:.0f} ms)")

    w = rng.standard_normal((6912, 2560)).astype(np.float32)
    start = time.perf_counter()
    q = bg.quantize_weights(w, device=device)
    values, gamma = q.unpack(), q.scale
    seconds = time.perf_counter() - start
    # gamma sums |W| in another order than NumPy (NUMERICS.md: 1e-5); the values follow from it,
    # a value that lands on a rounding tie (|W| / gamma = 0.5 within float32) either way.
    ref_gamma = float(reference.weight_scale(w)[0])
    ref_values, _ = reference.quantize_ternary(w, gamma=gamma)
    differ = values != ref_values
    ties = np.abs(np.abs(w.astype(np.float64) / float(gamma)) - 0.5) <= 1e-6
    report(
        "a 2560 -> 6912 layer quantized to ternary weights on the GPU",
        abs(gamma - ref_gamma) <= 1e-5 * abs(ref_gamma) and not np.any(differ & ~ties),
        f"{w.size} weights, {q.nbytes / 2**20:.1f} MiB packed, every value NumPy's"
        + (f" but {int(differ.sum())} on rounding ties" if differ.any() else ""),
        seconds,
    )

    x = rng.standard_normal((8, 2560)).astype(np.float32)
    start = time.perf_counter()
    y, acc = bg.bitlinear(x, q, return_accumulator=True)
    seconds = time.perf_counter() - start
    y_ref, acc_ref = reference.bitlinear(x, values, gamma)
    error = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
    report(
        "BitLinear, 8 int8 rows x ternary weights",
        np.array_equal(acc, acc_ref) and error <= 1e-6,
        f"int32 accumulators exact, y within {error:.1e} of NumPy's",
        seconds,
    )

    try:
        tokenizer = _demo_tokenizer()
    except ImportError:
        print('  SKIP  text generation: pip install "bitnet_gpu[text]" for tokenizers and jinja2')
        tokenizer = None
    if tokenizer is not None:
        config = BitNetConfig.preset("tiny", vocab_size=tokenizer.vocab_size)
        start = time.perf_counter()
        model = BitNetModel.random(config, seed=int(rng.integers(1 << 31)), max_tokens=64)
        model.tokenizer = tokenizer
        prompt = "BitNet runs on"
        ids = np.array(tokenizer.encode(prompt), np.int64)
        logits = model.forward(ids[None])[0]
        expected, ties = reference.bitnet_forward(
            model.reference_params(), config, ids[None], return_ties=True
        )
        # Past an int8 rounding tie a token's logits and the later ones may move (NUMERICS.md).
        clean, error, whole = reference.logits_agreement(logits, expected[0], ties[0])
        text = model.generate_text(prompt, 24)
        seconds = time.perf_counter() - start
        report(
            "a small BitNet decoder built here, generating text through a BPE tokenizer",
            error <= 1e-4 and whole <= 5e-2,
            f"{config.num_hidden_layers} layers, "
            + (
                f"prompt logits within {error:.1e} of NumPy's"
                if clean == len(ids)
                else f"prompt logits within {error:.1e} of NumPy's over the {clean} token"
                f"{'s' * (clean != 1)} before an int8 rounding tie, {whole:.1e} in all"
                if clean
                else f"prompt logits within {whole:.1e} of NumPy's (an int8 rounding tie at the "
                "first token)"
            )
            + f"; random weights wrote {text[:40]!r}",
            seconds,
        )
    print("demo passed" if ok else "demo FAILED")
    return 0 if ok else 1
