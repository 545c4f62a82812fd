#!/usr/bin/env bash
# Starts a private MariaDB (temporary data directory, free loopback port) with the
# example schema, creates the tables and triggers the example rules need (every kind),
# and runs heatsink in front of it on 127.0.0.1:6033 (HEATSINK_DEMO_LISTEN to change)
# with the rules in rules/ (given explicitly: without --rules heatsink applies none),
# its admin port on 127.0.0.1:6032 (HEATSINK_DEMO_ADMIN; loopback only, no password)
# and its metrics on 127.0.0.1:9633 (HEATSINK_DEMO_METRICS). Ctrl-C stops both.
# Installs mariadb-server on Debian when it is missing (root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

listen=${HEATSINK_DEMO_LISTEN:-127.0.0.1:6033}
admin=${HEATSINK_DEMO_ADMIN:-127.0.0.1:6032}
metrics=${HEATSINK_DEMO_METRICS:-127.0.0.1:9633}
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! { [ -x /usr/sbin/mariadbd ] && command -v mariadb >/dev/null 2>&1; }; then
  echo "installing mariadb-server"
  $sudo_cmd apt-get update -qq
  printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
  $sudo_cmd chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq mariadb-server mariadb-client >/dev/null
  $sudo_cmd rm -f /usr/sbin/policy-rc.d
fi

cargo build --release --quiet --bin heatsink
# shellcheck source=lib/mariadb.sh
source scripts/lib/mariadb.sh
hs_install_traps
mariadb_start
mariadb --no-defaults -uroot --socket="$MARIADB_SOCKET" < examples/demo/schema.sql
target/release/heatsink migrate --rules rules/ \
  --backend-url "mysql://root@127.0.0.1:$MARIADB_PORT/demo" --apply

cat <<TXT

MariaDB (private, port $MARIADB_PORT) has database 'demo' with tables 'hits',
'profile_visits_log' and 'plays'.
heatsink listens on $listen with the rules in rules/. Try:

  mariadb -h${listen%:*} -P${listen##*:} -udemo -pdemo demo \\
    -e "UPDATE hits SET cnt = cnt + 1 WHERE slug = 'home'; SELECT * FROM hits"
  mariadb -h${listen%:*} -P${listen##*:} -udemo -pdemo demo \\
    -e "INSERT INTO profile_visits_log (uid, visitor_uid, last_update) VALUES (5, 42, NOW(6));
        SELECT * FROM profile_visits_log WHERE uid = 5 ORDER BY last_update DESC"
  mariadb -h${listen%:*} -P${listen##*:} -udemo -pdemo demo \\
    -e "SELECT track_id, country, COUNT(*) AS total FROM plays
        WHERE track_id = 1 AND created_at BETWEEN NOW() - INTERVAL 7 DAY AND NOW()
        GROUP BY track_id, country"

The admin port (no password: it listens on loopback only):

  mariadb -h${admin%:*} -P${admin##*:} -uadmin -e "SHOW RULES"
  mariadb -h${admin%:*} -P${admin##*:} -uadmin -e "SHOW RULE STATS"

Metrics: http://$metrics/metrics   Stop: Ctrl-C
TXT
# In the background while the script waits for it, so that Ctrl-C or a TERM to this
# script stops heatsink and MariaDB by pid (hs_run).
hs_run target/release/heatsink serve --listen "$listen" --backend "127.0.0.1:$MARIADB_PORT" \
  --rules rules/ --admin "$admin" --metrics "$metrics"
