"""Message ids (`Nats-Msg-Id`) of chunks and results, and what a JetStream ack subject says."""

from __future__ import annotations

from .tokens import token


class MessageIds:
    """The dedup ids of work and result messages; none depends on the prefix."""

    __slots__ = ()

    @staticmethod
    def chunk_msg_id(job: str, index: int, last: int | None = None) -> str:
        """Value of `Nats-Msg-Id` for one chunk (or a pack to `last`): its submission's key."""
        return f"{job}:{int(index)}" if last is None else f"{job}:{int(index)}-{int(last)}"

    @staticmethod
    def chunk_range_of(msg_id: str) -> tuple[int, int] | None:
        """(first, last) chunk of a work message's `Nats-Msg-Id`, if it parses.

        `<job>:<chunk>[:<run>]` names one chunk, `<job>:<first>-<last>[:<run>]` a pack.
        """
        parts = msg_id.split(":")
        if len(parts) not in (2, 3):
            return None
        first, dash, last = parts[1].partition("-")
        last = last if dash else first
        if not (first.isdigit() and last.isdigit()) or int(last) < int(first):
            return None
        return int(first), int(last)

    @staticmethod
    def delivery_of(reply: str) -> tuple[int, int] | None:
        """(times delivered, stream sequence) of a JetStream message, from its ack subject.

        What nats-py's `msg.metadata` gives, without building its dataclasses (a hot path):
        `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...` (9 tokens) or, with a domain and
        an account hash, `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>...`
        (11 or 12). None if `reply` is neither.
        """
        parts: list[str] = reply.split(".") if reply else []
        if len(parts) < 9 or parts[0] != "$JS" or parts[1] != "ACK":
            return None
        at = 4 if len(parts) == 9 else 6
        if len(parts) not in (9, 11, 12) or not (parts[at].isdigit() and parts[at + 1].isdigit()):
            return None
        return int(parts[at]), int(parts[at + 1])

    @staticmethod
    def chunk_retry_msg_id(job: str, index: int, run: str, last: int | None = None) -> str:
        """`Nats-Msg-Id` of a chunk (or pack) submitted again by a `retry_failed` run.

        A fresh id, so the stream's dedup window does not swallow it.
        """
        return f"{MessageIds.chunk_msg_id(job, index, last)}:{token(run, 'run')}"

    @staticmethod
    def result_msg_id(job: str, index: int, work_seq: int, last: int | None = None) -> str:
        """Value of `Nats-Msg-Id` for a chunk's (or pack's) result: a retried publish is idempotent.

        `work_seq` is the work message's stream sequence: a chunk submitted again (a
        `retry_failed` rerun) is a new message, and its result must not be taken for a
        duplicate of the first one's inside the dedup window.
        """
        return f"r:{MessageIds.chunk_msg_id(job, index, last)}:{int(work_seq)}"
