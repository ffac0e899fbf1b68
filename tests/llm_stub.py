"""A scripted OpenAI-compatible chat endpoint on a loopback port, for the agent and consolidation tests.

Each POST to /v1/chat/completions records the request body and answers with the next
scripted reply: a completion body (see `tool_calls` and `text`), or (status, body) for
an HTTP error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(message: dict, finish_reason: str) -> dict:
    return {"id": "stub", "object": "chat.completion", "created": 0, "model": "stub-model",
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", **message}}]}


def tool_calls(*calls: tuple[str, dict | str]) -> dict:
    """A reply calling tools; a str argument is sent as is (to script malformed JSON)."""
    return completion({"content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}, "tool_calls")


def text(content: str) -> dict:
    return completion({"content": content}, "stop")


class ScriptedLLM:
    def __init__(self, replies: list) -> None:
        self.replies = list(replies)
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                reply = stub.replies.pop(0) if stub.replies else (500, {"error": {"message": "script exhausted"}})
                status, payload = reply if isinstance(reply, tuple) else (200, reply)
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@contextmanager
def scripted_llm(replies: list) -> Iterator[ScriptedLLM]:
    stub = ScriptedLLM(replies)
    stub.thread.start()
    try:
        yield stub
    finally:
        stub.server.shutdown()
        stub.server.server_close()
