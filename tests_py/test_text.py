"""Text in and out: a checkpoint directory in the Hugging Face layout (a byte-level BPE
tokenizer.json trained here by `tokenizers`, a Llama-3-style chat template, generation_config.json
with two end ids), read by from_weights; encode, decode, the chat template, generate_text and
stream_text, the end ids, and the command line."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu.checkpoint import save_safetensors
from bitnet_gpu.models import BitNetConfig, BitNetModel, weight_names
from conftest import package_env

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Ternary weights take three values.",
    "BitNet b1.58 runs on any Vulkan GPU, with int8 activations and exact accumulators.",
    "Grüße aus Köln — naïve café, 東京の天気は晴れ, emoji 🙂 and ✓ marks.",
] * 20


def build_tokenizer(path):
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny checkpoint directory as transformers writes one: weights, config, tokenizer,
    tokenizer_config (special tokens, chat template) and generation_config (two end ids)."""
    folder = tmp_path_factory.mktemp("checkpoint")
    tok = build_tokenizer(folder / "tokenizer.json")
    config = BitNetConfig.preset("tiny", vocab_size=tok.get_vocab_size(), tie_word_embeddings=True)
    rng = np.random.default_rng(7)
    weights = {
        name: (
            rng.standard_normal(shape) * (0.5 if len(shape) == 2 else 0.1) + (len(shape) == 1)
        ).astype(np.float32)
        for name, shape in weight_names(config).items()
    }
    save_safetensors(folder / "model.safetensors", weights)
    values = dataclasses.asdict(config)
    del values["rope_theta"]  # transformers 5 writes it in rope_parameters
    values.update(
        model_type="bitnet",
        hidden_act="relu2",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    (folder / "config.json").write_text(json.dumps(values))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": {"content": "<|eot_id|>"},
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    ends = [tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>")]
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ends, "do_sample": False})
    )
    return folder


@pytest.fixture(scope="module")
def model(checkpoint):
    return BitNetModel.from_pretrained(checkpoint, max_tokens=128)


def test_from_pretrained_takes_a_checkpoint_directory(checkpoint, tmp_path):
    with pytest.raises(bg.ArgumentError, match="not a checkpoint directory"):
        BitNetModel.from_pretrained(checkpoint / "model.safetensors")
    with pytest.raises(bg.ArgumentError, match="no config.json"):
        BitNetModel.from_pretrained(tmp_path)


def test_the_checkpoint_brings_its_tokenizer_and_generation_config(model, checkpoint):
    tok = model.tokenizer
    assert tok is not None and tok.vocab_size == model.config.vocab_size
    assert model.config.rope_theta == 10000.0  # from rope_parameters
    assert model.generation_config["eos_token_id"] == [
        tok.token_id("<|eot_id|>"),
        tok.token_id("<|end_of_text|>"),
    ]
    for text in ["The quick brown fox", "Grüße, 東京 🙂 ✓", " leading space\nand lines"]:
        ids = tok.encode(text)
        assert ids[0] == tok.token_id("<|begin_of_text|>")  # the post-processor adds it
        assert tok.decode(ids) == text  # special tokens skipped
        assert tok.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>" + text
        assert tok.encode(text, add_special_tokens=False) == ids[1:]
    with pytest.raises(TypeError):
        tok.encode(3)


def test_the_chat_template_renders_as_transformers_does(model):
    messages = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hello?"}]
    text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert ids == model.tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(model.tokenizer.token_id("<|begin_of_text|>")) == 1  # the template's own
    assert not model.tokenizer.apply_chat_template(messages).endswith(
        "assistant<|end_header_id|>\n\n"
    )


def test_generate_text_is_the_decoded_ids_up_to_an_end_id(model):
    prompt = "The quick brown"
    ids = np.array(model.tokenizer.encode(prompt))
    generated = model.generate(ids, 24, eos_token_id=[])[len(ids) :]  # [] : no end ids
    ends = model.generation_config["eos_token_id"]
    stop = next((i for i, t in enumerate(generated) if t in ends), len(generated))
    assert model.generate_text(prompt, 24) == model.tokenizer.decode(generated[:stop]).rstrip(
        "\ufffd"
    )


def test_stream_text_yields_whole_characters(model):
    """Pieces end on whole characters: the bytes of one spread over several tokens come together.
    (A random model also draws byte sequences that are no character at all: those decode to
    U+FFFD, as transformers decodes them, but never end a piece.)"""
    from bitnet_gpu.text import stream_pieces

    tok = model.tokenizer
    text = "Grüße 東京 🙂✓"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # several of these characters take more than one token
    pieces = list(stream_pieces(tok, iter(ids)))
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert all(not piece.endswith("\ufffd") for piece in pieces)
    pieces = list(stream_pieces(tok, iter(ids[:-1])))  # cut inside the last character
    assert "".join(pieces) == text[:-1]
    streamed = list(model.stream_text("Grüße 東京", 40, temperature=0.9, top_k=50, seed=3))
    assert streamed and not any(piece.endswith("\ufffd") for piece in streamed)
    expected = model.generate_text("Grüße 東京", 40, temperature=0.9, top_k=50, seed=3)
    assert "".join(streamed) == expected


def test_generation_stops_at_the_configured_end_ids(model):
    ids = np.array(model.tokenizer.encode("BitNet b1.58"))
    free = model.generate(ids, 12, eos_token_id=[])[len(ids) :]
    saved = model.generation_config
    try:
        model.generation_config = {"eos_token_id": [int(free[4]), 0]}  # the fifth new token ends it
        stopped = model.generate(ids, 12)[len(ids) :]
        assert list(stopped) == list(free[: list(free).index(free[4]) + 1])
        text = model.generate_text("BitNet b1.58", 12)
        assert text == model.tokenizer.decode(free[: list(free).index(free[4])]).rstrip("\ufffd")
    finally:
        model.generation_config = saved


def test_sampling_defaults_come_from_generation_config(model):
    saved = model.generation_config
    try:
        model.generation_config = dict(saved, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
        by_config = model.generate_text("The lazy dog", 16, seed=11)
        assert by_config == model.generate_text(
            "The lazy dog", 16, temperature=0.7, top_k=5, top_p=0.9, seed=11
        )
        assert model.generate_text("The lazy dog", 16, temperature=0) == model.generate_text(
            "The lazy dog", 16, temperature=0.0, top_k=None
        )
    finally:
        model.generation_config = saved


def test_a_conversation_is_a_prompt(model):
    messages = [{"role": "user", "content": "Hello?"}]
    ids = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = model.generate(np.array(ids), 10)[len(ids) :]
    ends = model.generation_config["eos_token_id"]
    stop = next((i for i, t in enumerate(expected) if t in ends), len(expected))
    assert model.generate_text(messages, 10) == model.tokenizer.decode(expected[:stop]).rstrip(
        "\ufffd"
    )
    with pytest.raises(TypeError, match="prompt"):
        model.generate_text(42)


def test_without_a_tokenizer_or_the_library(monkeypatch, checkpoint):
    random = BitNetModel.random(BitNetConfig.preset("tiny"), seed=0)
    assert random.tokenizer is None
    with pytest.raises(bg.ArgumentError, match="no tokenizer"):
        random.generate_text("hello")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    from bitnet_gpu.text import Tokenizer

    with pytest.raises(ImportError, match=r"bitnet_gpu\[text\]"):
        Tokenizer.from_directory(str(checkpoint))


def test_the_command_line_streams_text(checkpoint):
    env = package_env()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bitnet_gpu",
            "generate",
            "--weights",
            str(checkpoint),
            "--prompt",
            "The quick",
            "--tokens",
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    model = BitNetModel.from_weights(checkpoint, max_tokens=128)
    assert run.stdout == model.generate_text("The quick", 12) + "\n"
    assert "tokens/s" in run.stderr
    ids = subprocess.run(
        [
            sys.executable,
            "-m",
            "bitnet_gpu",
            "generate",
            "--weights",
            str(checkpoint),
            "--prompt-ids",
            "1,2,3",
            "--tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert ids.returncode == 0 and "token ids:" in ids.stdout, ids.stderr
