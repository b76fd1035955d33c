"""The control socket of a ckptfs mount: one JSON line out, JSON lines back.

The protocol (the repository's README documents it for other clients):
the socket's path is the value of the attribute `user.ckptfs.control` of the
mount point; a client connects (AF_UNIX, SOCK_STREAM), writes one JSON
object and a newline, and reads newline-terminated JSON objects back: zero
or more progress lines `{"progress": done, "total": n}` during long work,
then the reply, `{"ok": true, ...}` or `{"ok": false, "error": "..."}`.
Strings that are not UTF-8 (file names are bytes) travel as a display form
in "K" and their exact bytes, base64, in "K_b64", both ways.
"""
from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any, Callable, Dict, Iterator, List, Optional

from .errors import CkptfsError, ProtocolError, RefusedError
from .mount import XATTR_CONTROL

ProgressCallback = Callable[[int, int], None]

# The daemon's bounds (a reply line as ckptfsctl accepts it; a request as
# the daemon accepts it).
MAX_REPLY_LINE = 64 << 20
MAX_REQUEST = 64 * 1024
_B64 = "_b64"


def _display(raw: bytes) -> str:
    """The display form: valid UTF-8 as it is, other bytes as \\xNN."""
    return raw.decode("utf-8", "backslashreplace")


def encode_paths(value: Any) -> Any:
    """A request with every str path made sendable: names that came from
    os.fsdecode() of non-UTF-8 bytes go as "K" (display) and "K_b64"."""
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, (str, bytes)):
                raw = os.fsencode(item)
                try:
                    out[key] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    out[key] = _display(raw)
                    out[key + _B64] = base64.b64encode(raw).decode("ascii")
            else:
                out[key] = encode_paths(item)
        return out
    if isinstance(value, list):
        return [encode_paths(v) for v in value]
    return value


def _apply_mirror(target: Any, mirror: Any, where: str) -> Any:
    if mirror is None:
        return target
    if isinstance(mirror, str):
        try:
            return os.fsdecode(base64.b64decode(mirror, validate=True))
        except ValueError as e:
            raise ValueError(f"{where}: not base64 ({e})") from None
    if not isinstance(mirror, list):
        raise ValueError(f"{where} must be a string, an array or null")
    if target is None or target == []:
        target = [None] * len(mirror)
    if not isinstance(target, list) or len(target) != len(mirror):
        raise ValueError(f"{where} does not match its array")
    return [_apply_mirror(t, m, f"{where}[{i}]") for i, (t, m) in enumerate(zip(target, mirror))]


def decode_paths(value: Any, where: str = "$") -> Any:
    """A reply with every "K_b64" applied to "K" and removed: paths as str
    that os.fsencode() turns back into their exact bytes."""
    if isinstance(value, list):
        return [decode_paths(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    out = {k: decode_paths(v, f"{where}.{k}") for k, v in value.items() if not (k.endswith(_B64) and len(k) > 4)}
    for key, mirror in value.items():
        if key.endswith(_B64) and len(key) > 4:
            base = key[:-len(_B64)]
            out[base] = _apply_mirror(out.get(base), mirror, f"{where}.{key}")
    return out


def socket_path(mountpoint: str) -> str:
    try:
        return os.fsdecode(os.getxattr(mountpoint, XATTR_CONTROL))
    except OSError as e:
        raise ProtocolError(mountpoint, f"not a ckptfs mount (cannot read {XATTR_CONTROL}: {e.strerror})",
                            e.errno) from None


def _read_lines(sock: socket.socket, about: str) -> Iterator[bytes]:
    pending = b""
    while True:
        nl = pending.find(b"\n")
        if nl >= 0:
            line, pending = pending[:nl], pending[nl + 1:]
            yield line
            continue
        if len(pending) > MAX_REPLY_LINE:
            raise ProtocolError(about, f"a reply line longer than {MAX_REPLY_LINE} bytes")
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ProtocolError(about, "the daemon closed the control connection without a reply")
        pending += chunk


def call(mountpoint: str, request: Dict[str, Any], *, about: Optional[str] = None,
         on_progress: Optional[ProgressCallback] = None, timeout: float = 600.0) -> Dict[str, Any]:
    """Sends `request` to the mount's daemon and returns its reply, decoded.

    `about` is the path errors name (the mount point by default). Raises
    RefusedError with the daemon's words when it answers "ok": false, and
    ProtocolError when it cannot be reached or answers something malformed.
    `timeout` bounds each wait for a line (a preload sends progress lines
    while it works).
    """
    about = about or mountpoint
    path = socket_path(mountpoint)
    line = json.dumps(encode_paths(request), separators=(",", ":")).encode("utf-8") + b"\n"
    if len(line) > MAX_REQUEST:
        raise CkptfsError(about, f"request of {len(line)} bytes is over the daemon's limit of {MAX_REQUEST}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(line)
            for raw in _read_lines(sock, about):
                try:
                    message = json.loads(raw)
                except ValueError as e:
                    raise ProtocolError(about, f"malformed reply line from {path}: {e}") from None
                if not isinstance(message, dict):
                    raise ProtocolError(about, f"reply line from {path} is not a JSON object")
                if "ok" not in message:
                    if on_progress is not None and "progress" in message:
                        on_progress(int(message.get("progress", 0)), int(message.get("total", 0)))
                    continue
                return _final(message, about)
    except socket.timeout:
        raise ProtocolError(about, f"no answer from the control socket {path} within {timeout:g} s") from None
    except OSError as e:
        raise ProtocolError(about, f"control socket {path}: {e.strerror or e}", e.errno) from None
    raise AssertionError("unreachable")


def _final(message: Dict[str, Any], about: str) -> Dict[str, Any]:
    try:
        decoded: Dict[str, Any] = decode_paths(message)
    except ValueError as e:
        raise ProtocolError(about, f"malformed reply: {e}") from None
    if decoded.get("ok") is not True:
        error = decoded.get("error")
        raise RefusedError(about, error if isinstance(error, str) else "request refused")
    return decoded


def rows_under(rows: List[Dict[str, Any]], rel: str) -> List[Dict[str, Any]]:
    """The checkpoint rows at or below `rel` (a path below the mount point),
    as ckptfsctl shows them: a digest directory names its own row, a by-name
    path the rows whose by-name paths are at or below it."""
    if not rel:
        return rows
    top = rel.split("/", 1)[0]
    if top.startswith("sha256-"):
        return [r for r in rows if r.get("name") == top]
    return [r for r in rows
            if any(isinstance(p, str) and (p == rel or p.startswith(rel + "/")) for p in r.get("by_name", []))]
