"""Text and token ids for the local backend: a prompt's ids, and generated text as it grows.

:class:`PromptEncoder` turns a validated OpenAI body into the ids the model prefills:

* with the checkpoint's tokenizer (``tokenizer.json``, the ``tokenizers`` package): the
  prompt text encoded with its special tokens (a Llama tokenizer adds BOS). A chat is
  rendered by the checkpoint's own chat template (``tokenizer_config.json``, Jinja in a
  sandbox, as ``transformers``' ``apply_chat_template`` renders it: ``messages``,
  ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``,
  ``strftime_now``) and encoded without adding special tokens (the template writes
  them); a template's error is a 400. Without a template, by :func:`chat_text`: a plain,
  documented rendering (``role: content`` lines, then ``assistant:``) that changes a tuned
  model's words, not what the scheduler measures.
* without a tokenizer (``--model-spec``: random weights have no vocabulary): the words and
  punctuation marks the gateway counts (:data:`~sloserve.serve.schemas.TOKEN_PATTERN`),
  each hashed to an id (BLAKE2b, so every process agrees, unlike ``hash``), after a BOS of
  id :data:`BOS_FALLBACK`: the same text always gives the same ids, and a completion's
  count equals the gateway's estimate.
* a prompt of token ids is used as it is (each must be inside the vocabulary).

:class:`IncrementalDetokenizer` turns each generated id into the text it adds. Decoding a
single id is wrong for most tokenizers (a SentencePiece word start drops its space at the
start of a text, a byte-level token may be part of a multi-byte UTF-8 character), so it
decodes a short window twice, with and without the new ids, and emits the difference, as
vLLM and TGI do: the window starts :data:`DETOKENIZE_CONTEXT` ids into the prompt, and
while the decoded text ends in U+FFFD (an incomplete UTF-8 character) nothing is emitted
until the bytes that complete it arrive; a stream's last token flushes what is left.
Without a tokenizer each id is emitted as text, ``" 123"``.

:class:`StopMatcher` ends a stream at the first of its ``stop`` strings (OpenAI's rule: the
stop string and what follows are not sent): text that could be the start of a stop string
is held back until the next token decides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sloserve.core.errors import ConfigError
from sloserve.serve.backend import Endpoint, ServeError
from sloserve.serve.schemas import TOKEN_PATTERN

BOS_FALLBACK = 0
"""The first id of a prompt encoded without a tokenizer (stands for BOS)."""
DETOKENIZE_CONTEXT = 5
"""Prompt ids decoded before the first generated one (its leading space, a word's start)."""
_REPLACEMENT = "\ufffd"


def chat_text(messages: Sequence[dict[str, Any]]) -> str:
    """The plain chat template: one ``role: content`` line per message, then
    ``assistant:`` to prime the reply (text parts of a list content are joined)."""
    lines = []
    for m in messages:
        content = _text_content(m)["content"]
        lines.append(f"{m.get('role', 'user')}: {content or ''}\n")
    return "".join(lines) + "assistant:"


def _word_id(word: str, vocab_size: int) -> int:
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


def _text_content(m: dict[str, Any]) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, list):  # text parts (the API refuses other kinds)
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return {**m, "content": content}


def _compile_chat_template(source: str) -> Any:
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError(
            "the checkpoint's chat template needs jinja2: pip install 'sloserve[execute]'"
        ) from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as e:
        msg = f"tokenizer_config.json: the chat template does not compile: {e}"
        raise ConfigError(msg) from None


class PromptEncoder:
    """A request's prompt as token ids (module docstring); ``tokenizer``: a
    ``tokenizers.Tokenizer`` or ``None``; ``chat_template``: Jinja source, with
    ``special_tokens`` (``bos_token``, ``eos_token``) for it."""

    def __init__(
        self,
        tokenizer: Any | None,
        vocab_size: int,
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.special_tokens = dict(special_tokens or {})
        self._chat = _compile_chat_template(chat_template) if chat_template and tokenizer else None

    def chat_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """A chat's prompt ids: the checkpoint's template, else :func:`chat_text`."""
        tok = self.tokenizer
        if self._chat is None or tok is None:
            return self.encode_text(chat_text(messages))
        from jinja2 import TemplateError

        try:
            text = self._chat.render(
                messages=[_text_content(m) for m in messages],
                add_generation_prompt=True,
                **self.special_tokens,
            )
        except TemplateError as e:
            raise ServeError(
                f"the model's chat template refused the messages: {e}",
                status=400,
                reason="invalid_prompt",
            ) from None
        return list(tok.encode(text, add_special_tokens=False).ids)

    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text``: the tokenizer's (special tokens added), else hashed words."""
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text).ids)
        words = TOKEN_PATTERN.findall(text)
        return [BOS_FALLBACK] + [_word_id(w, self.vocab_size) for w in words]

    def encode(self, endpoint: Endpoint, body: dict[str, Any]) -> list[int]:
        """The prompt ids of a validated OpenAI ``body``; :class:`ServeError` 400 for an
        empty prompt or an id outside the vocabulary."""
        if endpoint == "chat.completions":
            ids = self.chat_ids(body.get("messages") or [])
        else:
            p = body.get("prompt", "")
            if isinstance(p, list) and p and isinstance(p[0], (str, list)):
                p = p[0]  # one prompt in a list (the API refuses several)
            if isinstance(p, list):
                ids = [int(t) for t in p]
                bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
                if bad is not None:
                    raise ServeError(
                        f"prompt token id {bad} is outside the model's vocabulary "
                        f"(0..{self.vocab_size - 1})",
                        status=400,
                        reason="invalid_prompt",
                    )
            else:
                ids = self.encode_text(str(p))
        if not ids:
            raise ServeError("the prompt has no tokens", status=400, reason="invalid_prompt")
        return ids


class IncrementalDetokenizer:
    """The text each generated id adds to a stream (module docstring)."""

    __slots__ = ("ids", "prefix", "read", "tokenizer")

    def __init__(self, tokenizer: Any | None, prompt: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt[-DETOKENIZE_CONTEXT:]) if tokenizer else []
        self.prefix = 0
        """Start of the window: text before it has been emitted long ago."""
        self.read = len(self.ids)
        """End of what has been emitted: ids from here on are still held back."""

    def add(self, token: int, *, last: bool = False) -> str:
        """The new text once ``token`` is appended (``""`` while a character is still
        incomplete); ``last`` flushes everything held back."""
        tok = self.tokenizer
        if tok is None:
            return f" {token}"
        ids = self.ids
        ids.append(token)
        before: str = tok.decode(ids[self.prefix : self.read], skip_special_tokens=True)
        after: str = tok.decode(ids[self.prefix :], skip_special_tokens=True)
        if not last and (len(after) <= len(before) or after.endswith(_REPLACEMENT)):
            return ""  # nothing visible yet, or a multi-byte character cut in the middle
        new = after[len(before) :]
        # the emitted ids become the next window's left context; older ones are dropped
        del ids[: self.read]
        self.prefix, self.read = 0, len(ids)
        return new


class StopMatcher:
    """The first of ``stops`` in a stream's text (module docstring)."""

    __slots__ = ("held", "stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [x for x in stops if x]
        self.held = ""
        """Text not sent yet: it may begin a stop string."""

    def feed(self, text: str, *, last: bool = False) -> tuple[str, bool]:
        """The text to send now, and whether a stop string ended the stream."""
        buf = self.held + text
        found = [i for i in (buf.find(x) for x in self.stops) if i >= 0]
        if found:
            self.held = ""
            return buf[: min(found)], True
        if last:
            self.held = ""
            return buf, False
        # the longest end of the text that is the start of a stop string waits: an
        # occurrence that spans tokens can only begin there
        keep = 0
        for x in self.stops:
            for k in range(min(len(x) - 1, len(buf)), keep, -1):
                if buf.endswith(x[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False
