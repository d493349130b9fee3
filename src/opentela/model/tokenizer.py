"""The tokenizer stored in a GGUF file: byte-level BPE, special tokens, chat template, streaming decode."""

from __future__ import annotations

import codecs
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from opentela.model.weights import field, open_gguf

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = (
    1,
    3,
    4,
)  # llama.cpp's token types in tokenizer.ggml.token_type

_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
"""Pre-tokenizers that split every digit off on its own, then apply GPT-2's regex (llama.cpp's grouping)."""
_GPT2 = ("gpt2", "default")

_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
"""Control tokens that end a generation besides the file's eos (llama.cpp treats these as end-of-generation)."""


@functools.cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable bytes stand for themselves)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    spare = 0x100
    for b in range(0x100):
        if b not in table:
            table[b] = chr(spare)
            spare += 1
    return table


def _raise(message: str) -> None:
    raise TemplateError(message)


class GGUFTokenizer:
    """Encode and decode text as the GGUF's byte-level BPE does (matching llama.cpp), and render chats."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        reader = open_gguf(path)
        kind = field(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{path}: tokenizer {kind!r} is not supported (byte-level BPE, 'gpt2', only)")
        pre = str(field(reader, "tokenizer.ggml.pre", "default"))
        if pre not in _DIGITS_THEN_GPT2 + _GPT2:
            raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported")
        self.tokens: list[str] = list(field(reader, "tokenizer.ggml.tokens"))
        types = field(reader, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(self.tokens)
        self.token_types: list[int] = [int(t) for t in types]
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}
        self.bos_token_id: int | None = field(reader, "tokenizer.ggml.bos_token_id")
        self.eos_token_id: int | None = field(reader, "tokenizer.ggml.eos_token_id")
        self.add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
        self.add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False))
        self.chat_template: str | None = field(reader, "tokenizer.chat_template")
        self.special_ids = frozenset(i for i, t in enumerate(self.token_types) if t == TOKEN_CONTROL)
        self._hf = self._build(field(reader, "tokenizer.ggml.merges") or [], pre)
        self._bytes = self._token_bytes()

    def _build(self, merges: Sequence[str], pre: str) -> Tokenizer:
        pairs = [(left, right) for left, _, right in (m.partition(" ") for m in merges)]
        hf = Tokenizer(models.BPE(vocab=dict(self._ids), merges=pairs))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGITS_THEN_GPT2:
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            hf.pre_tokenizer = byte_level
        # Control and user-defined tokens are matched whole in the text before BPE, as llama.cpp does when
        # parsing special tokens.
        hf.add_special_tokens(
            [
                AddedToken(self.tokens[i], special=t == TOKEN_CONTROL, normalized=False)
                for i, t in enumerate(self.token_types)
                if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
            ]
        )
        return hf

    def _token_bytes(self) -> list[bytes]:
        back = {c: b for b, c in byte_to_char().items()}
        out = []
        for tok, kind in zip(self.tokens, self.token_types, strict=True):
            if kind == TOKEN_NORMAL and all(c in back for c in tok):
                out.append(bytes(back[c] for c in tok))
            else:  # control and user-defined tokens are plain text
                out.append(tok.encode("utf-8"))
        return out

    def __repr__(self) -> str:
        return f"<GGUFTokenizer {self.path} vocab={self.vocab_size}>"

    @property
    def vocab_size(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token's exact text (byte-level form), or None."""
        return self._ids.get(token)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a generation: eos, and the end-of-turn control tokens the vocabulary has."""
        ids = {self.eos_token_id} if self.eos_token_id is not None else set()
        ids.update(i for t in _END_OF_TURN if (i := self._ids.get(t)) is not None and i in self.special_ids)
        return tuple(sorted(ids))

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in it are parsed. `add_special` adds bos/eos as the file says."""
        ids: list[int] = self._hf.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.add_bos and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self.add_eos and self.eos_token_id is not None:
                ids.append(self.eos_token_id)
        return ids

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes a token stands for (b"" for control tokens when `skip_special`)."""
        if skip_special and token_id in self.special_ids:
            return b""
        return self._bytes[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`; control tokens are left out by default, as llama.cpp's server does."""
        data = b"".join(self.token_bytes(int(i), skip_special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render `messages` with the GGUF's chat template, in a sandboxed Jinja environment."""
        if not self.chat_template:
            raise ValueError(f"{self.path} has no chat template")
        special = {
            "bos_token": self._text_of(self.bos_token_id),
            "eos_token": self._text_of(self.eos_token_id),
        }
        return _compile(self.chat_template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **special,
            **extra,
        )

    def _text_of(self, token_id: int | None) -> str:
        return self.tokens[token_id] if token_id is not None else ""


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    # Hugging Face's conventions for chat templates: blocks trim their newline and leading spaces.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


class StreamDecoder:
    """Text of a token stream as it grows, never splitting a UTF-8 character across pieces.

    Bytes of a character spread over several tokens (an emoji is often two or three) are held back until it
    is complete; bytes that can never form a character come out as U+FFFD, like `decode`. So the pieces of
    a stream joined with `flush()` equal `decode` of all its tokens.
    """

    def __init__(self, tokenizer: GGUFTokenizer, skip_special: bool = True) -> None:
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that token `token_id` completes (possibly "")."""
        return self._utf8.decode(self.tokenizer.token_bytes(token_id, self.skip_special))

    def flush(self) -> str:
        """Whatever is held back at the end of the stream (an unfinished character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
