"""A small OVSDB client: RFC 7047 JSON-RPC over ovsdb-server's unix socket.

Just what nictune needs of the Open_vSwitch database: read the root row's
other_config map, and change some of its keys in one transaction that
leaves every other key as it is.  No ovs-vsctl, no shell, no dependency:
JSON objects on a stream socket, one request at a time.

The wire: each message is one JSON object, not framed (RFC 7047 section 4:
the stream is a sequence of JSON texts), so replies are cut out of the
byte stream with a raw JSON decoder.  The server may send an "echo"
request (its keepalive) at any time: it is answered; notifications (id
null) are ignored.  Values come as RFC 7047 section 5.1 <value>s: a
<map> is ["map", [[key, value], ...]], a <uuid> is ["uuid", "..."].
"""

from __future__ import annotations

import codecs
import json
from typing import Dict, List, Optional, Tuple

DEFAULT_DB_SOCKET = "/var/run/openvswitch/db.sock"
DATABASE = "Open_vSwitch"
TABLE = "Open_vSwitch"  # the root table: one row (maxRows 1 in vswitch.ovsschema)
TIMEOUT = 10.0          # seconds for any one reply
MAX_REPLY = 16 << 20    # bytes: more than any root row carries


class OvsdbError(Exception):
    """The server answered with an error, or not in the protocol."""


class Conflict(OvsdbError):
    """The transaction's wait found other_config changed since it was read."""


class Client:
    """One connection to ovsdb-server.  OSError when it cannot be reached."""

    def __init__(self, path: str = DEFAULT_DB_SOCKET, timeout: float = TIMEOUT, io=None):
        """io: the host's port (Host.io) the connection is made through."""
        from nictune.host.transports.io import LIVE

        self.path = path
        self._sock = (io or LIVE).unix_connect(path, timeout)
        self._buffer = ""
        self._decoder = json.JSONDecoder()
        # JSON text is UTF-8 (RFC 7047 section 4); a character split across
        # two reads waits in the decoder for the rest.
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._id = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- JSON-RPC ------------------------------------------------------------
    def call(self, method: str, params: list):
        self._id += 1
        ident = self._id
        self._send({"method": method, "params": params, "id": ident})
        while True:
            message = self._receive()
            if message.get("method") == "echo" and message.get("id") is not None:
                self._send({"result": message.get("params", []), "error": None,
                            "id": message["id"]})
                continue
            if message.get("id") != ident:
                continue  # a notification (update, locked...) or a stale reply
            if message.get("error") is not None:
                raise OvsdbError(f"{method}: {_said(message['error'])}")
            return message.get("result")

    def _send(self, message: dict) -> None:
        self._sock.sendall(json.dumps(message, separators=(",", ":")).encode())

    def _receive(self) -> dict:
        while True:
            text = self._buffer.lstrip()
            if text:
                try:
                    message, end = self._decoder.raw_decode(text)
                except ValueError:
                    pass  # not complete yet
                else:
                    self._buffer = text[end:]
                    if not isinstance(message, dict):
                        raise OvsdbError(f"{self.path}: not a JSON-RPC message: {text[:60]!r}")
                    return message
            if len(self._buffer) > MAX_REPLY:
                raise OvsdbError(f"{self.path}: a reply larger than {MAX_REPLY} bytes")
            chunk = self._sock.recv(65536)
            if not chunk:
                raise OvsdbError(f"{self.path}: the server closed the connection")
            try:
                self._buffer += self._utf8.decode(chunk)
            except UnicodeDecodeError:
                raise OvsdbError(f"{self.path}: a reply that is not UTF-8") from None

    # -- the Open_vSwitch root row -----------------------------------------------
    def databases(self) -> list:
        return self.call("list_dbs", [])

    def root_other_config(self) -> Tuple[str, Dict[str, str]]:
        """(uuid, other_config) of the root Open_vSwitch row.  OvsdbError
        when the server has no such database or row."""
        if DATABASE not in self.databases():
            raise OvsdbError(f"{self.path} serves no {DATABASE} database")
        (result,) = self.transact([{"op": "select", "table": TABLE, "where": [],
                                    "columns": ["_uuid", "other_config"]}])
        rows = result.get("rows", [])
        if len(rows) != 1:
            raise OvsdbError(f"the {TABLE} table has {len(rows)} rows, not its one root row "
                             "(ovs-ctl, or `ovs-vsctl init`, creates it)")
        row = rows[0]
        return _uuid(row["_uuid"]), map_of(row["other_config"])

    def set_other_config(self, uuid: str, seen: Dict[str, str], changes: Dict[str, Optional[str]],
                         comment: str = "") -> None:
        """Set (value) or remove (None) the keys of `changes` in the root
        row's other_config, in one transaction, if the whole map is still
        `seen`: a wait on the column makes the write atomic with that
        read (Conflict otherwise).  Only the keys of `changes` are
        touched: "delete" then "insert" mutations (RFC 7047 5.1
        <mutation>), never an update of the column."""
        row = [["_uuid", "==", ["uuid", uuid]]]
        ops: List[dict] = [
            {"op": "wait", "table": TABLE, "where": row, "columns": ["other_config"],
             "until": "==", "rows": [{"other_config": map_value(seen)}], "timeout": 0},
            {"op": "mutate", "table": TABLE, "where": row,
             "mutations": [["other_config", "delete", ["set", sorted(changes)]]]},
        ]
        inserted = {k: v for k, v in changes.items() if v is not None}
        if inserted:
            ops.append({"op": "mutate", "table": TABLE, "where": row,
                        "mutations": [["other_config", "insert", map_value(inserted)]]})
        if comment:  # ovsdb-server logs it with the transaction (ovsdb-tool show-log)
            ops.append({"op": "comment", "comment": comment})
        results = self.transact(ops)
        for op, result in zip(ops[1:], results[1:]):
            if op["op"] == "mutate" and result.get("count") != 1:
                raise OvsdbError(f"the root {TABLE} row {uuid} is gone")

    def transact(self, ops: list) -> list:
        results = self.call("transact", [DATABASE, *ops])
        if not isinstance(results, list):
            raise OvsdbError(f"transact: unexpected reply {str(results)[:80]}")
        for op, result in zip(ops + [{"op": "commit"}], results):
            if isinstance(result, dict) and result.get("error"):
                if op["op"] == "wait" and result["error"] == "timed out":
                    raise Conflict(f"{op['table']} changed since it was read")
                raise OvsdbError(f"transact: {op['op']}: {_said(result)}")
        if any(r is None for r in results):  # ops after a failed one are not executed
            raise OvsdbError("transact: the transaction was aborted")
        return results


def map_of(value) -> Dict[str, str]:
    """An RFC 7047 <map> of strings as a dict."""
    if not (isinstance(value, list) and len(value) == 2 and value[0] == "map"):
        raise OvsdbError(f"not an OVSDB map: {str(value)[:80]}")
    return {str(k): str(v) for k, v in value[1]}


def map_value(items: Dict[str, str]) -> list:
    return ["map", [[k, items[k]] for k in sorted(items)]]


def _uuid(value) -> str:
    if not (isinstance(value, list) and len(value) == 2 and value[0] == "uuid"):
        raise OvsdbError(f"not an OVSDB uuid: {str(value)[:80]}")
    return value[1]


def _said(error) -> str:
    if isinstance(error, dict):
        return ": ".join(str(error[k]) for k in ("error", "details") if error.get(k))
    return str(error)
