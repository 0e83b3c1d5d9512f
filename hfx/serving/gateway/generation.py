"""The tokens of one stream turned into text pieces, with stop strings applied."""

from __future__ import annotations

from hfx.cluster.control import TokenEvent
from hfx.serving.server import ServingCore, Stream


class Generation:
    """Text is detokenized incrementally (vLLM's prefix/read offsets): each token decodes a short
    window of recent tokens, not the whole output. With stop strings, the last
    ``longest stop − 1`` characters are held back until they cannot begin a stop string, so a
    stream never shows text that the stop string then cuts; they come in the final chunk
    (``rest``)."""

    def __init__(self, server: ServingCore, stream: Stream, stop: list[str]) -> None:
        self.server, self.stream, self.stop = server, stream, stop
        self.tokens: list[int] = []
        self.text = ""  # the output so far, cut at a stop string
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.end: TokenEvent | None = None  # the event that ended the stream
        self._sent = 0  # characters of ``text`` already given out
        self._hold = max(map(len, stop), default=1) - 1
        self._prefix = self._read = 0  # detokenization window: tokens[_prefix:] decode anew

    @property
    def rest(self) -> str:
        """Text not given out yet (held back for stop strings); for the final chunk."""
        return self.text[self._sent:]

    def _decode_new(self) -> str:
        prefix = self.server.text(self.tokens[self._prefix:self._read])
        new = self.server.text(self.tokens[self._prefix:])
        if len(new) <= len(prefix) or new.endswith("\ufffd"):
            return ""  # nothing yet, or an incomplete UTF-8 sequence: wait for the next token
        self._prefix, self._read = self._read, len(self.tokens)
        return new[len(prefix):]

    def feed(self, events: list[TokenEvent]) -> list[str]:
        """The text pieces of events that arrived together: one per token, empty or not, so
        that clients can time every token. After the end (``finish_reason`` set), nothing."""
        pieces: list[str] = []
        if self.finish_reason is not None:
            return pieces
        for event in events:
            if event.token is None:
                self.finish_reason, self.error = event.finish_reason, event.error
                self.end = event
                break
            self.tokens.append(event.token)
            start = max(0, len(self.text) - self._hold)  # a stop string may begin here
            self.text += self._decode_new()
            hits = [at for s in self.stop if (at := self.text.find(s, start)) >= 0]
            if hits:  # a stop string: the output ends before it
                self.text = self.text[:min(hits)]
                self.finish_reason = "stop"
                self.server.stopped(self.stream)  # finished, not abandoned: served
                break
            end = max(self._sent, len(self.text) - self._hold)
            pieces.append(self.text[self._sent:end])
            self._sent = end
        return pieces

    async def drain(self) -> None:
        """Read the stream to its end (a whole, non-streamed answer)."""
        while self.finish_reason is None:
            self.feed(await self.stream.take())
