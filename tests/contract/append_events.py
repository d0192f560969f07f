"""An application outside Herald appending events through the outbox contract.

Run by crates/herald/tests/outbox_contract.rs:
    python3 tests/contract/append_events.py POSTGRES_URL RUN

Each event goes in with the application's own write, in its own transaction,
through herald.append_event(...). Prints one JSON object: the ids it
committed, the id it rolled back, and the errors PostgreSQL gave for a
duplicate and for data that is not what content_type says.
"""

import json
import sys

import psycopg
from psycopg.types.json import Jsonb

SOURCE = "/shop/orders"


def append(cur, event_id, event_type, order_id, data, extensions=None):
    cur.execute(
        "SELECT herald.append_event(source => %s, id => %s, type => %s, subject => %s,"
        " partition_key => %s, data => %s, content_type => 'application/json', extensions => %s)",
        (SOURCE, event_id, event_type, order_id, order_id, json.dumps(data).encode(), extensions and Jsonb(extensions)),
    )
    return cur.fetchone()[0]


def main():
    url, run = sys.argv[1], sys.argv[2]
    report = {"committed": [], "sequences": []}
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS shop_orders (order_id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL)")
        conn.commit()

        # One business transaction: the order row and its events commit together.
        with conn.transaction():
            cur = conn.cursor()
            for n in range(3):
                order_id = f"{run}-order-{n}"
                cur.execute("INSERT INTO shop_orders (order_id, total_cents) VALUES (%s, %s)", (order_id, 1000 + n))
                placed = f"{run}-placed-{n}"
                report["sequences"].append(
                    append(cur, placed, "shop.order.placed", order_id, {"order_id": order_id, "total_cents": 1000 + n}, {"tenant": "acme"})
                )
                paid = f"{run}-paid-{n}"
                report["sequences"].append(append(cur, paid, "shop.order.paid", order_id, {"order_id": order_id}))
                report["committed"] += [placed, paid]
            signup = f"{run}-signup"
            report["sequences"].append(append(cur, signup, "shop.customer.created", f"{run}-customer", {"name": "Ada"}))
            report["committed"].append(signup)

        # Rolled back: neither the row nor its event exists.
        report["rolled_back"] = f"{run}-rolled-back"
        try:
            with conn.transaction():
                cur = conn.cursor()
                cur.execute("INSERT INTO shop_orders (order_id, total_cents) VALUES (%s, 1)", (f"{run}-order-x",))
                append(cur, report["rolled_back"], "shop.order.placed", f"{run}-order-x", {"order_id": "x"})
                raise RuntimeError("the application changed its mind")
        except RuntimeError:
            pass

        # The same (source, id) again: refused, and the transaction with it.
        try:
            with conn.transaction():
                append(conn.cursor(), f"{run}-placed-0", "shop.order.placed", f"{run}-order-0", {"again": True})
            report["duplicate_error"] = None
        except psycopg.errors.UniqueViolation as e:
            report["duplicate_error"] = str(e).splitlines()[0]

        # application/json data that is not JSON: refused before anything is written.
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT herald.append_event(%s, %s, 'shop.order.placed', 's', 'k', %s)",
                    (SOURCE, f"{run}-not-json", b"{not json"),
                )
            report["bad_data_error"] = None
        except psycopg.errors.InvalidParameterValue as e:
            report["bad_data_error"] = str(e).splitlines()[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
