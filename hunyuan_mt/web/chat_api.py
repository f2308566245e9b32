"""The OpenAI-compatible routes of the REST API: chat completions (streamed per token, with log-probabilities
when asked) and the model list; a model id names a target ("hunyuan-mt:es") or a pair. Errors on these routes
answer in OpenAI's shape (`openai_route`).

`ChatRoutes` is the part of `api.RestApi` that serves them; `create_app` registers its handlers."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
import uuid
from typing import Any, AsyncIterator, Iterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..adapters.request import Pair
from ..errors import Cancelled, InvalidInput
from ..text import prompts
from ..text.languages import normalize_code
from ..scheduler.ticket import Ticket
from .requests import JSON, read_fields, wait_disconnected

log = logging.getLogger(__name__)


class ChatRoutes:
    """/v1/chat/completions and /v1/models (methods of `RestApi`; they use its access checks and thread pool)."""

    def _chat_request(self, fields: dict[str, Any]) -> tuple[str, str, str, str]:
        model = fields.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidInput("Invalid request: missing model (a target such as 'es' or a pair such as 'en2es')")
        messages = fields.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidInput("Invalid request: messages must be a non-empty list")
        last_user = None
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                last_user = message
                break
        if last_user is None:
            raise InvalidInput("Invalid request: no user message to translate")
        content = last_user.get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                # A number or an object where the text goes: the client's mistake, said as such (was a 500).
                raise InvalidInput("Invalid request: a text part's 'text' must be a string")
            content = "".join(texts)
        if not isinstance(content, str) or not content.strip():
            raise InvalidInput("Invalid request: the last user message has no text")
        prompt_target, text = prompts.parse(content)
        source, target = resolve_model_id(model)
        target = target or prompt_target
        if target is None:
            raise InvalidInput(f"Unknown model {model[:40]!r}: use a target language ('es') or a pair ('en2es'); "
                               f"see GET /v1/models")
        return model, source or "auto", target, text

    def _choices_asked(self, fields: dict[str, Any]) -> int:
        """OpenAI's `n`: how many choices, 1 to limits.max_alternatives + 1 (they are the alternatives)."""
        n = fields.get("n", 1)
        top = self.cfg.limits.max_alternatives + 1
        if n is None:
            return 1
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
            raise InvalidInput(f"Invalid request: n must be a whole number from 1 to {top} (the translation and "
                               f"up to {top - 1} alternatives, limits.max_alternatives).")
        if n > 1 and fields.get("stream"):
            raise InvalidInput("Invalid request: n > 1 cannot be streamed; ask without stream, or with n = 1.")
        return n

    async def chat_completions(self, request: Request) -> Response:
        try:
            fields = await read_fields(request, allow=(JSON,))
        finally:
            await request.close()
        caller = self._authorize(request, fields)
        model, source, target, text = self._chat_request(fields)
        n = self._choices_asked(fields)
        self.policy.check_chars([text])
        self.policy.spend_chars(caller, len(text))
        started = time.perf_counter()
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        ticket = Ticket(owner=caller.identity)
        if fields.get("stream"):
            stream = self.service.translate_stream(text, source, target, ticket=ticket)
            # The first item comes once the request is checked and planned: a refusal is still an HTTP error,
            # not an event inside a 200 stream.
            try:
                first = await self._call(next, stream)
            except BaseException:
                stream.close()
                raise
            chunks = _ChatChunks(completion_id, created, model)
            return StreamingResponse(self._stream_events(request, stream, first, chunks, ticket, started),
                                     media_type="text/event-stream")
        results = await self._watched(request, ticket, "openai", functools.partial(
            self.service.translate_batch, [text], source, target, alternatives=n - 1, ticket=ticket,
            token_logprobs=fields.get("logprobs") is True))
        self._observe(results, started, "openai")
        result = results[0]
        usage = {"prompt_tokens": len(text.split()), "completion_tokens": len(result.text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        # n choices: the translation, then the beam search's other outputs (fewer when it finds fewer distinct).
        contents = [result.text] + list(result.alternatives)[:n - 1]
        choices: list[dict[str, Any]] = [
            {"index": i, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            for i, content in enumerate(contents)]
        if fields.get("logprobs") is True:
            choices[0]["logprobs"] = _chat_logprobs(result)
        return JSONResponse({
            "id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage, "route": result.route_label,
        })

    async def _stream_events(self, request: Request, stream: Iterator[Any], first: Any, chunks: "_ChatChunks",
                             ticket: Ticket, started: float) -> AsyncIterator[bytes]:
        """Server-sent events for one streamed chat completion: each new piece of the translation as it grows.

        A client that goes away cancels the rows: seen by a watcher at once (Starlette itself may only notice at
        the next write, and none comes while the rows wait), or when Starlette closes this generator."""
        async def watch() -> None:
            await wait_disconnected(request)
            ticket.cancel("client disconnected")

        watcher = asyncio.ensure_future(watch())
        finished = False
        try:
            yield chunks.chunk({"role": "assistant", "content": ""}, None)
            item = first
            while True:
                if isinstance(item, str):
                    piece = chunks.advance(item)
                    if piece:
                        yield chunks.chunk({"content": piece}, None)
                else:
                    self._observe([item], started, "openai")
                    rest = chunks.advance(item.text)
                    if rest:
                        yield chunks.chunk({"content": rest}, None)
                    yield chunks.chunk({}, "stop")
                    yield b"data: [DONE]\n\n"
                    finished = True
                    return
                # Abandoned when the client goes away: the thread returns at the engine's next step.
                item = await self._call(next, stream, abandon_on_cancel=True)
        except Cancelled:
            return  # the watcher cancelled the rows: nobody is left to read an error
        finally:
            watcher.cancel()
            if not finished:
                ticket.cancel("client disconnected")
                self.metrics.count_cancelled("openai-stream")

    async def models(self) -> JSONResponse:
        infos = await self._call(self.service.languages)
        ids: list[str] = []
        targets = sorted({t for info in infos for t in info.targets})
        ids.extend(targets)
        ids.extend(f"{info.code}2{t}" for info in infos for t in info.targets)
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": 0, "owned_by": "hunyuan-mt"} for model_id in ids]})


def resolve_model_id(model: str | None) -> tuple[str | None, str | None]:
    """OpenAI `model` → (source or None, target or None): "es" names a target, "en2es"/"en-es" a pair.

    Anything else (e.g. "hunyuan-mt") names neither; the Hunyuan prompt then has to say the target.
    """
    if not model:
        return None, None
    name = model.strip()
    # Pair forms first: "en-es" is a pair here, although normalize_code would read it as a locale tag (en-ES).
    if "2" in name:
        try:
            pair = Pair.parse(name)
            return pair.src, pair.tgt
        except InvalidInput:
            pass
    for sep in ("-", ":", "_", ">"):
        # Try both splits: "en-zh-Hant" and "zh-Hant-en" each have one that parses.
        for left, right in (name.split(sep, 1), name.rsplit(sep, 1)) if sep in name else ():
            try:
                return normalize_code(left), normalize_code(right)
            except InvalidInput:
                continue
    try:
        return None, normalize_code(name)
    except InvalidInput:
        return None, None


def _chat_logprobs(result: Any) -> dict[str, Any]:
    """OpenAI's `logprobs` for a chat translation: one entry per token of each sentence the model wrote (its last
    hop's, the text each token adds, placeholders put back), the whitespace between sentences joined to the next
    sentence's first token, so the entries' texts join into the message. A sentence without token scores that join
    up (from the translation memory: log-probability 0.0; a repaired placeholder: its mean log-probability) is one
    entry; one with no score at all (beam search) is left out, and so the texts no longer join up."""
    content: list[dict[str, Any]] = []
    cursor = 0
    tokens = result.segment_tokens or [None] * len(result.segment_texts)
    for text, confidence, pieces in zip(result.segment_texts, result.segment_confidences, tokens):
        if confidence is None or not text.strip():
            continue
        found = result.text.find(text.strip(), cursor)
        gap = result.text[cursor:found] if found >= 0 else ""
        cursor = found + len(text.strip()) if found >= 0 else cursor
        # A token that adds no text (the end of the sentence, half a character) is no entry.
        entries = [(p, lp) for p, lp in pieces if p] if pieces else [(text.strip(), math.log(confidence))]
        for n, (piece, logprob) in enumerate(entries):
            piece = gap + piece.lstrip() if n == 0 else piece
            content.append({"token": piece, "logprob": round(logprob, 6), "bytes": list(piece.encode()),
                            "top_logprobs": []})
    return {"content": content, "refusal": None}


class _ChatChunks:
    """OpenAI's chat.completion.chunk events for one completion, and the text already sent as deltas."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self.completion_id, self.created, self.model = completion_id, created, model
        self.sent = ""

    def chunk(self, delta: dict[str, Any], finish: str | None) -> bytes:
        payload = {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                   "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode("utf-8")

    def advance(self, text: str) -> str:
        """The part of `text` not sent yet. Deltas only append, so a text that no longer extends what was sent
        (rare: the final clean-up changed an earlier word) sends nothing more, and is logged."""
        if not text.startswith(self.sent):
            log.warning("chat stream %s: the final text differs from what was streamed", self.completion_id)
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


def openai_route(path: str) -> bool:
    """The OpenAI-compatible routes answer errors in OpenAI's shape; every other route (documents under /v1 too)
    in LibreTranslate's."""
    return path.startswith(("/v1/chat/", "/v1/models"))
