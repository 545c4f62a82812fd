"""A legacy application in miniature.

It bumps a hot counter and appends to a "last visitors" log, one autocommit statement
at a time, exactly as it would against MariaDB directly. Pointed at heatsink instead,
the increments land on counter slot rows and the log appends on a fixed-size ring
(see rules/counters.toml and rules/rings.toml) without a change here.

Settings (environment):
  DB_HOST, DB_PORT       where to connect (the heatsink sidecar)   [127.0.0.1, 6033]
  DB_USER, DB_PASSWORD   the database's own credentials            [demo, demo]
  DB_NAME                default database                          [demo]
  INTERVAL               seconds between iterations                [0.2]
  ITERATIONS             iterations before exiting; 0 = forever    [0]
  REPORT_EVERY           iterations between progress lines         [50]

A progress line reads the counter and the latest visitors back through the proxy:
  iterations=50 failures=0 home.cnt=50 latest_visitors=5
With ITERATIONS > 0 the exit status is 1 when any statement failed (and it gives up
after 5 failures).
"""

import os
import random
import signal
import sys
import time

import pymysql


def setting(name, default):
    value = os.environ.get(name, "")
    return value if value != "" else default


def connect():
    return pymysql.connect(
        host=setting("DB_HOST", "127.0.0.1"),
        port=int(setting("DB_PORT", "6033")),
        user=setting("DB_USER", "demo"),
        password=setting("DB_PASSWORD", "demo"),
        database=setting("DB_NAME", "demo"),
        autocommit=True,
        connect_timeout=5,
    )


def report(cur, done, failures):
    cur.execute("SELECT cnt FROM hits WHERE slug = %s", ("home",))
    row = cur.fetchone()
    cur.execute(
        "SELECT visitor_uid FROM profile_visits_log WHERE uid = %s ORDER BY last_update DESC",
        (5,),
    )
    latest = cur.fetchall()
    print(
        f"iterations={done} failures={failures} "
        f"home.cnt={row[0] if row else None} latest_visitors={len(latest)}",
        flush=True,
    )


def main():
    # PID 1 in a container: exit promptly on `docker compose stop`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    interval = float(setting("INTERVAL", "0.2"))
    iterations = int(setting("ITERATIONS", "0"))
    report_every = max(1, int(setting("REPORT_EVERY", "50")))

    conn = None
    done = failures = 0
    while iterations == 0 or done < iterations:
        try:
            if conn is None:
                conn = connect()
            with conn.cursor() as cur:
                cur.execute("UPDATE hits SET cnt = cnt + 1 WHERE slug = %s", ("home",))
                cur.execute(
                    "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) "
                    "VALUES (%s, %s, NOW(6))",
                    (5, random.randint(1, 1_000_000)),
                )
                done += 1
                if done % report_every == 0 or done == iterations:
                    report(cur, done, failures)
        except pymysql.err.MySQLError as e:
            # The proxy or the database restarting, or a statement a rule refuses
            # (error 1105 names the rule): report it, reconnect, carry on.
            failures += 1
            print(f"statement failed: {e}", file=sys.stderr, flush=True)
            if conn is not None:
                try:
                    conn.close()
                except pymysql.err.Error:
                    pass
                conn = None
            if iterations and failures >= 5:
                break
            time.sleep(1)
            continue
        if interval > 0:
            time.sleep(interval)
    if conn is not None:
        conn.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
