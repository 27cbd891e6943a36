#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh Debian 12 machine (run as root):
# redis-server, PostgreSQL 15, MariaDB, RabbitMQ, etcd, a C compiler, chromium and its driver, and the venv with the package, every extra and the dev dependency group.
# Idempotent and quick when nothing changed. The tests start their own servers on
# random ports, so no system-wide server is left running.
set -euo pipefail

(
    cd "$(dirname "${BASH_SOURCE[0]}")/.."

    export DEBIAN_FRONTEND=noninteractive
    missing=()
    [[ -x /usr/bin/redis-server ]] || missing+=(redis-server)
    [[ -x /usr/lib/postgresql/15/bin/postgres ]] || missing+=(postgresql-15)
    # RabbitMQ is a broker in the beat, worker and Dramatiq matrices; etcd is a store.
    [[ -x /usr/sbin/rabbitmq-server ]] || missing+=(rabbitmq-server)
    [[ -x /usr/bin/etcd ]] || missing+=(etcd-server etcd-client)
    # MariaDB is the MySQL-family store the tests run on.
    [[ -x /usr/sbin/mariadbd ]] || missing+=(mariadb-server)
    # The fake and shifted wall clocks of the tests are small preloaded C shims
    # (harness/fakeclock.py, harness/clock_shift.py), compiled at test time.
    command -v cc >/dev/null || missing+=(gcc)
    # The TLS test makes its own certificate.
    command -v openssl >/dev/null || missing+=(openssl)
    # The console's browser tests drive Debian's chromium through its chromedriver.
    [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || missing+=(chromium chromium-driver)
    # Debian's python3 has no venv module without this package.
    command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null \
        || missing+=(python3 python3-venv)

    if ((${#missing[@]})); then
        echo "setup: installing ${missing[*]}"
        # Package scripts would start a system Redis and a PostgreSQL cluster on the
        # default ports; policy-rc.d exiting 101 tells them not to start any service.
        own_policy=
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod +x /usr/sbin/policy-rc.d
            own_policy=1
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        if [[ -n $own_policy ]]; then
            rm -f /usr/sbin/policy-rc.d
            trap - EXIT
        fi
        # Belt and braces for a machine whose init ignored policy-rc.d: stop any
        # cluster the package created and started.
        if command -v pg_lsclusters >/dev/null; then
            pg_lsclusters --no-header | while read -r version cluster _port status _rest; do
                if [[ $status == online* ]]; then
                    pg_ctlcluster "$version" "$cluster" stop
                fi
            done
        fi
    fi

    [[ -x .venv/bin/python ]] || python3 -m venv .venv

    # Reinstall only when pyproject.toml changed: a hash, not a timestamp, because a
    # fresh clone gives every file a new mtime.
    stamp=.venv/.celery-leader-pyproject.sha256
    wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [[ ! -f $stamp || $(<"$stamp") != "$wanted" ]]; then
        echo "setup: installing the package with every extra and the dev group into .venv"
        .venv/bin/pip install -q --disable-pip-version-check 'pip>=25.1'
        .venv/bin/pip install -q --disable-pip-version-check -e '.[celery,dramatiq,redis,postgres,django,metrics,etcd,mysql,console]' --group dev
        echo "$wanted" >"$stamp"
    fi
)
