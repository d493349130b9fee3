"""GGUFTokenizer: llama.cpp-compatible encoding, lossless round trips, the chat template, streaming decode."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from opentela.model.tokenizer import GGUFTokenizer, StreamDecoder, byte_to_char


def test_known_encodings(tokenizer: GGUFTokenizer) -> None:
    # Ids as llama.cpp's /tokenize gives them for the same file: digits one by one, whitespace runs kept
    # apart from the word after them, control tokens written in the text parsed as one token.
    assert tokenizer.encode("<|im_start|>user\nHello 12345   world!!  \n\n  x<|im_end|>") == [
        1, 4093, 198, 19556, 216, 33, 34, 35, 36, 37, 256, 905, 10095, 256, 8866, 1792, 2
    ]  # fmt: skip
    assert tokenizer.encode("a   b\n\n\tc") == [81, 256, 278, 1116, 197, 83]
    assert tokenizer.encode("") == []
    assert tokenizer.encode("hi", add_special=True) == tokenizer.encode("hi")  # SmolLM2 adds no bos


def test_special_tokens_and_stops(tokenizer: GGUFTokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.token_to_id("<|im_end|>") == 2 and tokenizer.token_to_id("<|endoftext|>") == 0
    assert tokenizer.stop_token_ids == (0, 2)  # eos is <|im_end|>; <|endoftext|> also ends a generation
    assert tokenizer.decode([1, 57, 2]) == "I"  # control tokens are left out, as llama.cpp's server does
    assert tokenizer.decode([1, 57, 2], skip_special=False) == "<|im_start|>I<|im_end|>"


def unencodable(tokenizer: GGUFTokenizer) -> set[int]:
    """Bytes with no token of their own in this vocabulary (SmolLM2 lacks 21, such as 0x04 and 0xF1)."""
    return {b for b, c in byte_to_char().items() if tokenizer.token_to_id(c) is None}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_any_text(tokenizer: GGUFTokenizer, text: str) -> None:
    assume(not unencodable(tokenizer) & set(text.encode()))
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids, skip_special=False) == text


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["12", "  ", "\n", "<|im_end|>", "é", "😀", "word", "'s", "\t", "中"]), max_size=12
    )
)
def test_round_trip_tricky_pieces(tokenizer: GGUFTokenizer, pieces: list[str]) -> None:
    text = "".join(pieces)
    assert tokenizer.decode(tokenizer.encode(text), skip_special=False) == text


def test_bytes_without_a_token_are_dropped_like_llamacpp_does(tokenizer: GGUFTokenizer) -> None:
    assert unencodable(tokenizer) >= {0x04, 0xF1}
    assert tokenizer.encode("a\x04b") == [81, 82]  # llama.cpp's /tokenize gives the same
    assert tokenizer.encode("\U00050000x") == [234, 218, 218, 104]  # bytes F1 90 80 80: F1 has no token


def test_byte_alphabet_is_a_bijection() -> None:
    table = byte_to_char()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_chat_template(tokenizer: GGUFTokenizer) -> None:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(own_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_chat_template_is_sandboxed_and_can_raise(model_path: Path) -> None:
    tok = GGUFTokenizer(model_path)
    tok.chat_template = "{{ raise_exception('no ' + messages[0]['role'] + ' here') }}"
    with pytest.raises(jinja2.TemplateError, match="no tool here"):
        tok.apply_chat_template([{"role": "tool", "content": ""}])
    tok.chat_template = "{{ bos_token }}|{{ eos_token }}|{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template([])
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([])


def test_stream_decoder_never_splits_a_character(tokenizer: GGUFTokenizer) -> None:
    text = "I 😀 you 🎉🎉 café"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # the emoji do take several tokens each
    decoder = StreamDecoder(tokenizer)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) + decoder.flush() == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[:3] == ["I", " ", "😀"]  # the emoji's first bytes wait for the token that completes it


def test_stream_decoder_flushes_an_unfinished_character(tokenizer: GGUFTokenizer) -> None:
    decoder = StreamDecoder(tokenizer)
    first = tokenizer.encode("😀")[0]  # b"\xf0\x9f"
    assert decoder.push(first) == ""
    assert decoder.push(tokenizer.encode("A")[0]) == "\ufffdA"  # can never complete: replaced, like decode
    assert decoder.push(first) == ""
    assert decoder.flush() == "\ufffd"
    assert tokenizer.decode([first, tokenizer.encode("A")[0], first]) == "\ufffdA\ufffd"
    assert decoder.push(2) == ""  # control tokens add nothing
