"""Text in and out: a checkpoint directory in the Hugging Face layout (a byte-level BPE
tokenizer.json trained here by `tokenizers`, a Llama-3-style chat template, generation_config.json
with two end ids), read by from_weights; encode, decode, the chat template, generate_text and
stream_text, the end ids, and the command line."""

import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu.models import BitNetConfig, BitNetModel
from conftest import package_env
from hf_checkpoint import write_checkpoint

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny checkpoint directory as transformers writes one, in the 2B4T's dtype mix: weights,
    config, tokenizer, tokenizer_config (special tokens, chat template) and generation_config
    (two end ids)."""
    folder = tmp_path_factory.mktemp("checkpoint")
    config = BitNetConfig.preset("tiny", vocab_size=360, tie_word_embeddings=True)
    tok = write_checkpoint(folder, config)
    assert tok.get_vocab_size() == config.vocab_size
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
    sampling = dict(temperature=0.9, top_k=50, seed=3, eos_token_id=[])  # 40 tokens, no end
    streamed = list(model.stream_text("Grüße 東京", 40, **sampling))
    assert streamed and not any(piece.endswith("\ufffd") for piece in streamed)
    expected = model.generate_text("Grüße 東京", 40, **sampling)
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


def test_a_batch_of_prompts_of_different_lengths(model):
    """generate_text with a list: one ragged batch, each text what its prompt gives alone
    (greedy), conversations too."""
    prompts = ["The quick brown fox", "Grüße", [{"role": "user", "content": "Hello?"}]]
    texts = model.generate_text(prompts, 10)
    assert texts == [model.generate_text(p, 10) for p in prompts]
    assert any(texts)


def test_a_session_keeps_the_conversation(model, monkeypatch):
    """stream_text with a session feeds only what the session does not hold: a session holding
    the conversation so far takes only the new turn's tokens, and the reply is the one a fresh
    generation over the whole conversation gives; a prompt that does not continue what the
    session holds starts it again."""
    tok = model.tokenizer
    before = [
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "The quick brown fox"},
    ]
    conversation = before + [{"role": "user", "content": "And then?"}]
    held = tok.apply_chat_template(before, tokenize=True)
    whole = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    assert whole[: len(held)] == held
    session = model.session()
    session.step(np.array(held))
    fed, run = [], model.runner.run
    monkeypatch.setattr(
        model.runner, "run", lambda pool, step: fed.append(step.tokens) or run(pool, step)
    )
    new = []
    reply = "".join(
        model.stream_text(
            conversation, 12, session=session, callback=lambda step, token: new.append(token)
        )
    )
    assert reply == model.generate_text(conversation, 12)
    assert fed[0] == len(whole) - len(held)  # the new turn alone, then decode steps
    assert session.lengths.tolist() == [len(whole) + len(new)]
    np.testing.assert_array_equal(session.token_ids[0], whole + new)
    # a generated turn, then the next one: the same as a fresh generation
    talk = model.session()
    first = [{"role": "user", "content": "Hello?"}]
    answer = "".join(model.stream_text(first, 12, session=talk))
    followed = first + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
    ]
    assert "".join(model.stream_text(followed, 12, session=talk)) == model.generate_text(
        followed, 12
    )
    other = [{"role": "user", "content": "Something else"}]  # not a continuation: starts again
    assert "".join(model.stream_text(other, 8, session=session)) == model.generate_text(other, 8)
    assert session.lengths[0] < len(whole)
    with pytest.raises(bg.ArgumentError, match="batch 1"):
        list(model.stream_text(other, 8, session=model.session(batch=2)))


def test_loading_says_what_it_loaded(checkpoint, caplog, capsys):
    with caplog.at_level("INFO", logger="bitnet_gpu"):
        loaded = BitNetModel.from_pretrained(checkpoint, max_tokens=64, progress=True)
    assert loaded.load_summary in caplog.text
    assert "2 layers" in loaded.load_summary and "bitlinear" in loaded.load_summary
    assert "loading layers" in capsys.readouterr().err  # the progress bar
    BitNetModel.from_pretrained(checkpoint, max_tokens=64)  # small: no bar by default
    assert "loading layers" not in capsys.readouterr().err


def test_the_command_line_chats(checkpoint):
    """python -m bitnet_gpu chat: two turns from stdin, each reply what generate_text gives for
    the conversation so far; /reset starts again."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bitnet_gpu",
            "chat",
            "--weights",
            str(checkpoint),
            "--system",
            "Be brief.",
            "--tokens",
            "10",
            "--max-tokens",
            "128",
        ],
        input="Hello?\nAnd then?\n/reset\nHello?\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=package_env(),
    )
    assert run.returncode == 0, run.stderr
    model = BitNetModel.from_pretrained(checkpoint, max_tokens=128)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    first = model.generate_text(messages, 10)
    messages += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And then?"},
    ]
    second = model.generate_text(messages, 10)
    assert run.stdout == f"{first}\n{second}\n{first}\n"
    assert run.stderr.count("tokens/s") == 3 and "loaded" in run.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "bitnet_gpu", "chat", "--weights", "/nonexistent"],
        input="",
        capture_output=True,
        text=True,
        timeout=300,
        env=package_env(),
    )
    assert missing.returncode == 2 and "chat:" in missing.stderr


def test_text_with_prompt_lookup_is_the_plain_text(model):
    """generate_text and stream_text with prompt lookup give the plain text, also continuing a
    chat's session."""
    prompt = "the quick brown fox jumps over the quick brown fox jumps over the quick"
    want = model.generate_text(prompt, 24)
    assert model.generate_text(prompt, 24, prompt_lookup_num_tokens=4) == want
    assert "".join(model.stream_text(prompt, 24, prompt_lookup_num_tokens=6)) == want
    chat = [{"role": "user", "content": prompt}]
    plain, fast = model.session(), model.session()
    a = "".join(model.stream_text(chat, 12, session=plain))
    b = "".join(model.stream_text(chat, 12, session=fast, prompt_lookup_num_tokens=3))
    assert a == b and np.array_equal(plain.token_ids[0], fast.token_ids[0])
