#!/usr/bin/env bash
# Runs heatsink's whole test suite: formatting, lints, unit and integration tests
# against a private MariaDB that the tests start and stop themselves.
# Installs what the tests need on Debian when it is missing (run as root or with sudo).
# The tests run `python3` from PATH with PyMySQL (tests/python/) and PyYAML
# (tests/sidecar_files.rs): for Debian's own python3, which refuses pip (PEP 668),
# they come from apt (python3-pymysql, python3-yaml); for another python3 (a venv,
# pyenv) that lacks them, from its pip.
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
# python_has MODULE: the python3 the tests run can import it.
python_has() { python3 -c "import $1" >/dev/null 2>&1; }
# Does that python3 read Debian's packages (/usr/lib/python3/dist-packages)?
python_reads_debian() {
  python3 -c 'import sys; sys.exit(0 if "/usr/lib/python3/dist-packages" in sys.path else 1)' 2>/dev/null
}
command -v python3 >/dev/null 2>&1 || need+=(python3)
if ! command -v python3 >/dev/null 2>&1 || python_reads_debian; then
  python_has pymysql || need+=(python3-pymysql)
  python_has yaml || need+=(python3-yaml)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo_cmd apt-get update -qq
  # Do not let the package start a system-wide server: the tests run their own.
  printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
  $sudo_cmd chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
  $sudo_cmd rm -f /usr/sbin/policy-rc.d
fi
# Whatever apt could not provide for this python3: its own pip, and on a python3 that
# is externally managed (PEP 668) and still lacks them, pip with --break-system-packages.
pip_need=()
python_has pymysql || pip_need+=(pymysql)
# PyYAML: tests/sidecar_files.rs reads the compose and Prometheus files with it.
python_has yaml || pip_need+=(pyyaml)
if [ ${#pip_need[@]} -gt 0 ]; then
  echo "installing with $(command -v python3) -m pip: ${pip_need[*]}"
  python3 -m pip install -q "${pip_need[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${pip_need[@]}"
  python_has pymysql && python_has yaml \
    || { echo "python3 ($(command -v python3)) still cannot import pymysql and yaml" >&2; exit 1; }
fi

cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --all-targets "$@"
