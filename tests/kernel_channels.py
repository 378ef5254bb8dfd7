"""Running code in a Jupyter kernel through its websocket, as the browser does (the lab's and the hub's
end-to-end tests): what a notebook user would see of it as text."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any


def execute_code(url: str, code: str, *, headers: Sequence[str] = (), username: str = "test",
                 timeout: float = 120, wait: bool = True) -> str:
    """Run ``code`` in the kernel whose ``.../channels`` websocket is ``url``; its stdout and stderr, plain-text
    displays and results (the magic's notices are displays, updated in place; ``[image/png]`` marks a plot) and
    errors, until the kernel is idle again (``wait=False``: send it and return at once)."""
    import websocket

    ws = websocket.create_connection(url, timeout=timeout, header=list(headers))
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": username,
                                   "session": uuid.uuid4().hex, "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": True,
                                    "user_expressions": {}, "allow_stdin": False}}))
    out = ""
    try:
        while wait:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            out += _text(msg["msg_type"], msg["content"])
    finally:
        ws.close()
    return out


def _text(kind: str, content: dict[str, Any]) -> str:
    if kind == "stream":
        return str(content["text"])
    if kind in ("display_data", "update_display_data", "execute_result"):
        data = content.get("data", {})
        return str(data.get("text/plain", "")) + ("[image/png]" if "image/png" in data else "") + "\n"
    if kind == "error":
        return f"{content['ename']}: {content['evalue']}\n"
    return ""
