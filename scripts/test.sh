#!/usr/bin/env bash
# Runs heatsink's whole test suite: formatting, lints, unit and integration tests
# against a private MariaDB that the tests start and stop themselves.
# Installs what the tests need on Debian when it is missing (run as root or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
need=()
[ -x /usr/sbin/mariadbd ] || command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need+=(mariadb-client)
command -v sysbench >/dev/null 2>&1 || need+=(sysbench)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# tests/cluster.rs: a 3-node Galera cluster, state transfer by rsync.
[ -f /usr/lib/galera/libgalera_smm.so ] || need+=(galera-4)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo_cmd apt-get update -qq
  # Do not let the package start a system-wide server: the tests run their own.
  printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
  $sudo_cmd chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
  $sudo_cmd rm -f /usr/sbin/policy-rc.d
fi
python3 -c 'import pymysql' 2>/dev/null || python3 -m pip install -q pymysql
# PyYAML: tests/sidecar_files.rs reads the compose and Prometheus files with it.
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml

cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --all-targets "$@"
