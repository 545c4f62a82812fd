#!/usr/bin/env python3
"""Runs a list of SQL statements with PyMySQL and prints, for each, a canonical JSON
line: affected rows, OK info text, warning count, last insert id, column metadata and
rows, or the error. The statements (a JSON list on stdin) may contain `{t}` (replaced
by --table) and `{db}` (replaced by --db). With --show-table, table names equal to
--table in the column metadata are printed as --show-table, so that a run against a
reference table and a run against the logical table through the proxy print
identical transcripts.

Usage: rule_pymysql.py --host H --port P --user U --password PW --db DB
       --table T [--show-table S] [--autocommit 0|1]
"""

import argparse
import json
import sys

import pymysql


def as_text(v):
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return v


def canon(v):
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v).hex()}
    if isinstance(v, (int, str)) or v is None:
        return v
    return {type(v).__name__: str(v)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--show-table")
    ap.add_argument("--autocommit", type=int, default=1)
    args = ap.parse_args()
    statements = json.load(sys.stdin)

    conn = pymysql.connect(
        host=args.host,
        port=args.port,
        user=args.user,
        password=args.password,
        database=args.db,
        autocommit=bool(args.autocommit),
        connect_timeout=10,
        read_timeout=30,
        write_timeout=30,
    )
    rename = lambda name: args.show_table if args.show_table and name == args.table else name
    for template in statements:
        sql = template.replace("{t}", args.table).replace("{db}", args.db)
        entry = {"sql": template}
        cur = conn.cursor()
        try:
            cur.execute(sql)
            res = cur._result
            entry["rowcount"] = cur.rowcount
            entry["info"] = as_text(res.message) if res.message else ""
            entry["warnings"] = res.warning_count
            entry["lastrowid"] = cur.lastrowid
            if getattr(res, "fields", None):
                entry["fields"] = [
                    {
                        "catalog": as_text(f.catalog),
                        "db": as_text(f.db),
                        "table": rename(f.table_name),
                        "org_table": rename(f.org_table),
                        "name": f.name,
                        "org_name": f.org_name,
                        "charsetnr": f.charsetnr,
                        "length": f.length,
                        "type": f.type_code,
                        "flags": f.flags,
                        "scale": f.scale,
                    }
                    for f in res.fields
                ]
                entry["rows"] = [[canon(v) for v in row] for row in cur.fetchall()]
        except pymysql.err.MySQLError as e:
            entry["error"] = [e.args[0], str(e.args[1]) if len(e.args) > 1 else ""]
        finally:
            cur.close()
        print(json.dumps(entry, sort_keys=True))
    if not args.autocommit:
        conn.commit()
    conn.close()


if __name__ == "__main__":
    main()
