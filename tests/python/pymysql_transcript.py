#!/usr/bin/env python3
"""Runs a fixed PyMySQL session against one server and prints a canonical JSON
transcript on stdout (results, cursor descriptions, row counts, insert ids, warnings,
errors). Running it directly against MariaDB and through the proxy, on freshly created
databases of the same name, must print identical transcripts.

Usage: pymysql_transcript.py --host H --port P --user U --password PW --db DB
"""

import argparse
import datetime
import decimal
import json
import os
import sys
import tempfile

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT


def canon(v):
    """Values as JSON-friendly, type-tagged data."""
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v).hex()}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)):
        return {type(v).__name__: str(v)}
    if isinstance(v, float):
        return {"float": repr(v)}
    if isinstance(v, dict):
        return {str(k): canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    return v


class Transcript:
    def __init__(self):
        self.steps = []

    def add(self, step, **fields):
        entry = {"step": step}
        entry.update({k: canon(v) for k, v in fields.items()})
        self.steps.append(entry)

    def result(self, step, cur, warnings=True):
        """Records a cursor's result. `warnings=False` while more result sets are
        pending (SHOW WARNINGS cannot be sent until they are read)."""
        self.add(
            step,
            description=cur.description,
            rowcount=cur.rowcount,
            lastrowid=cur.lastrowid,
            rows=cur.fetchall() if cur.description else None,
            warnings=cur.connection.show_warnings() if warnings else None,
        )

    def error(self, step, fn):
        try:
            fn()
            self.add(step, error=None)
        except pymysql.MySQLError as e:
            self.add(step, error_class=type(e).__name__, error=list(e.args))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--db", required=True)
    a = ap.parse_args()

    t = Transcript()
    conn = pymysql.connect(
        host=a.host,
        port=a.port,
        user=a.user,
        password=a.password,
        database=a.db,
        charset="utf8mb4",
        autocommit=False,
        local_infile=True,
        client_flag=CLIENT.MULTI_STATEMENTS,
        connect_timeout=10,
        read_timeout=30,
        write_timeout=30,
    )
    t.add(
        "connect",
        server=conn.get_server_info(),
        proto=conn.get_proto_info(),
        autocommit=conn.get_autocommit(),
        charset=conn.character_set_name(),
    )
    cur = conn.cursor()

    cur.execute(
        """CREATE TABLE items (
             id INT AUTO_INCREMENT PRIMARY KEY,
             name VARCHAR(40) NOT NULL UNIQUE,
             price DECIMAL(10,2),
             qty SMALLINT UNSIGNED,
             added DATETIME(3),
             span TIME,
             day DATE,
             data BLOB,
             ratio FLOAT,
             note TEXT CHARACTER SET utf8mb4
           )"""
    )
    t.result("create", cur)

    cur.execute(
        "INSERT INTO items (name, price, qty, added, span, day, data, ratio, note) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            "first",
            decimal.Decimal("19.99"),
            3,
            datetime.datetime(2024, 2, 29, 12, 30, 45, 123000),
            datetime.timedelta(hours=-5, minutes=-3),
            datetime.date(2000, 1, 1),
            b"\x00\x01\xfe\xff",
            0.25,
            "naïve ☃ 😀",
        ),
    )
    t.result("insert one", cur)
    t.add("insert_id", insert_id=conn.insert_id(), affected=conn.affected_rows())

    rows = [("item-%03d" % i, decimal.Decimal(i) / 4, i % 7, None) for i in range(50)]
    cur.executemany("INSERT INTO items (name, price, qty, note) VALUES (%s, %s, %s, %s)", rows)
    t.result("executemany", cur)
    conn.commit()

    cur.execute("SELECT * FROM items ORDER BY id LIMIT 5")
    t.result("select", cur)
    cur.execute("SELECT COUNT(*), SUM(price), AVG(qty), MAX(name) FROM items")
    t.result("aggregate", cur)
    cur.execute("SELECT * FROM items WHERE name = %s", ("first",))
    t.result("parameterised select", cur)

    # executemany with a non-INSERT statement runs one statement per row.
    cur.executemany("UPDATE items SET qty = qty + %s WHERE name = %s", [(1, "first"), (2, "item-001"), (3, "nope")])
    t.result("executemany update", cur)

    # Upsert: affected rows 1 for insert, 2 for update.
    for q in (5, 6):
        cur.execute(
            "INSERT INTO items (name, qty) VALUES ('upsert', %s) ON DUPLICATE KEY UPDATE qty = VALUES(qty)",
            (q,),
        )
        t.result("upsert", cur)

    # Transactions.
    conn.commit()
    cur.execute("INSERT INTO items (name) VALUES ('rolled back')")
    cur.execute("SELECT COUNT(*) FROM items")
    t.result("count in transaction", cur)
    conn.rollback()
    cur.execute("SELECT COUNT(*) FROM items WHERE name = 'rolled back'")
    t.result("after rollback", cur)
    conn.begin()
    cur.execute("DELETE FROM items WHERE name LIKE 'item-04%'")
    t.result("delete", cur)
    conn.commit()
    cur.execute("SELECT COUNT(*) FROM items")
    t.result("after commit", cur)

    # Warnings.
    cur.execute("INSERT IGNORE INTO items (name, qty) VALUES ('first', 1), ('neg', -1)")
    t.result("insert ignore", cur)
    cur.execute("SELECT 1/0, CAST('12abc' AS SIGNED)")
    t.result("warnings on select", cur)

    # Errors.
    t.error("no such table", lambda: cur.execute("SELECT * FROM missing_table"))
    t.error("duplicate key", lambda: cur.execute("INSERT INTO items (name) VALUES ('first')"))
    t.error("syntax", lambda: cur.execute("SELEKT 1"))
    t.error("not null", lambda: cur.execute("INSERT INTO items (name) VALUES (NULL)"))
    t.error("out of range", lambda: cur.execute("INSERT INTO items (name, qty) VALUES ('big', 70000)"))
    t.error(
        "signal",
        lambda: cur.execute("SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'from signal', MYSQL_ERRNO = 3999"),
    )
    conn.rollback()

    # Multiple result sets.
    cur.execute("SELECT 1 AS a; SELECT 'two' AS b, 2.5 AS c; UPDATE items SET qty = qty WHERE id < 0")
    t.result("multi 1", cur, warnings=False)
    while cur.nextset():
        t.result("multi next", cur, warnings=False)

    # Stored procedure with several result sets.
    cur.execute(
        "CREATE PROCEDURE totals(IN lim INT) BEGIN "
        "SELECT id, name FROM items ORDER BY id LIMIT lim; "
        "SELECT SUM(qty) AS q FROM items; END"
    )
    cur.callproc("totals", (3,))
    t.result("callproc", cur, warnings=False)
    while cur.nextset():
        t.result("callproc next", cur, warnings=False)

    # Dict and unbuffered cursors.
    with conn.cursor(pymysql.cursors.DictCursor) as dc:
        dc.execute("SELECT id, name, price FROM items WHERE id <= 3 ORDER BY id")
        t.result("dict cursor", dc)
    with conn.cursor(pymysql.cursors.SSCursor) as ss:
        ss.execute("SELECT seq, REPEAT('x', seq % 200) FROM seq_1_to_20000")
        count = 0
        total = 0
        for row in ss:
            count += 1
            total += len(row[1])
        t.add("unbuffered", count=count, total=total, description=ss.description)

    # LOAD DATA LOCAL INFILE.
    fd, path = tempfile.mkstemp(suffix=".csv")
    with os.fdopen(fd, "w") as f:
        for i in range(2000):
            f.write("csv-%d\t%d\n" % (i, i % 100))
        f.write("bad-row\tnot-a-number\n")
    try:
        cur.execute(
            "LOAD DATA LOCAL INFILE %s INTO TABLE items (name, qty)",
            (path,),
        )
        t.result("load data local", cur)
    finally:
        os.unlink(path)
    conn.commit()
    cur.execute("SELECT COUNT(*), SUM(qty) FROM items WHERE name LIKE 'csv-%' OR name = 'bad-row'")
    t.result("after load", cur)

    # Connection utilities.
    conn.ping(reconnect=False)
    conn.select_db("heatsink_test")
    cur.execute("SELECT DATABASE()")
    t.result("select_db", cur)
    conn.autocommit(True)
    cur.execute("SELECT @@autocommit")
    t.result("autocommit", cur)
    cur.close()
    conn.close()

    json.dump(t.steps, sys.stdout, indent=1, sort_keys=True, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
