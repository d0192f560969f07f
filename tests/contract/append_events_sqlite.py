"""An application outside Herald appending to a SQLite outbox: the INSERT
docs/outbox-contract.md documents, the slice computed by the rule it states.

Run by crates/herald/tests/outbox_contract.rs:
    python3 tests/contract/append_events_sqlite.py DATABASE_FILE RUN < documented-insert.sql

Prints one JSON object: the ids it committed, the one it rolled back, and
the error SQLite gave for a duplicate (source, id).
"""

import json
import sqlite3
import sys
import time

SOURCE = "/shop/orders"


def slice_of(partition_key):
    """FNV-1a-64 of the key's UTF-8 bytes, modulo 16 (the contract's rule)."""
    h = 0xCBF29CE484222325
    for byte in partition_key.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) % (1 << 64)
    return h % 16


def append(conn, insert, event_id, event_type, order_id, data):
    now = int(time.time() * 1000)
    conn.execute(
        insert,
        (event_id, SOURCE, event_type, order_id, now, None, json.dumps(data).encode(), order_id, now,
         slice_of(order_id), "application/json", json.dumps({"tenant": "acme"})),
    )


def main():
    path, run = sys.argv[1], sys.argv[2]
    insert = sys.stdin.read()
    report = {"committed": []}
    # isolation_level=None: transactions are the explicit BEGIN/COMMIT below.
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS shop_orders (order_id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")

    order_id = f"{run}-order-1"
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO shop_orders VALUES (?, ?)", (order_id, 4200))
    for event_type in ("shop.order.placed", "shop.order.paid"):
        event_id = f"{run}-{event_type}"
        append(conn, insert, event_id, event_type, order_id, {"order_id": order_id})
        report["committed"].append(event_id)
    conn.execute("COMMIT")

    report["rolled_back"] = f"{run}-rolled-back"
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO shop_orders VALUES (?, ?)", (f"{run}-order-x", 1))
    append(conn, insert, report["rolled_back"], "shop.order.placed", f"{run}-order-x", {"order_id": "x"})
    conn.execute("ROLLBACK")

    try:
        append(conn, insert, f"{run}-shop.order.placed", "shop.order.placed", order_id, {"again": True})
        report["duplicate_error"] = None
    except sqlite3.IntegrityError as e:
        report["duplicate_error"] = str(e)
    conn.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
