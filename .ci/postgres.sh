#!/usr/bin/env bash
# A throwaway PostgreSQL server for the observation-store tests.
#
#   eval "$(bash .ci/postgres.sh)"     # install if needed, start, print the export line
#   bash .ci/postgres.sh stop          # stop the server (the data directory stays)
#
# Installs PostgreSQL with apt-get when no initdb is found, initialises a cluster in
# ${COSTAWARE_PG_DIR:-${TMPDIR:-/tmp}/costaware-pg}, starts it on 127.0.0.1 (port
# ${COSTAWARE_PG_PORT:-54329}, or the next free one), creates the user `costaware`
# (password `costaware`) and the database `costaware_test`, and prints
#
#   export COSTAWARE_TEST_POSTGRES_URL=postgresql+psycopg://costaware:costaware@127.0.0.1:PORT/costaware_test
#
# on stdout (or `false` when it fails). Everything else goes to stderr. Idempotent: a second run reuses the cluster
# and, when it is already up, only checks that it answers. As root, the server runs as
# the `postgres` user (PostgreSQL refuses to run as root); otherwise as the caller.
# The cluster trades durability for speed (fsync=off): it is for tests only.
set -euo pipefail

exec 3>&1 1>&2 # fd 3: the export line; stdout now goes to stderr
# On failure print `false`, so that `eval "$(bash .ci/postgres.sh)"` fails too (under
# `set -e` it stops the caller) instead of evaluating nothing and skipping the tests.
trap 'status=$?; if ((status != 0)); then echo false >&3; fi' EXIT

log() { printf 'postgres.sh: %s\n' "$*"; }
die() {
	log "error: $*"
	exit 1
}

root_dir=${COSTAWARE_PG_DIR:-${TMPDIR:-/tmp}/costaware-pg}
case $root_dir in /*) ;; *) root_dir=$PWD/$root_dir ;; esac
data_dir=$root_dir/data
log_file=$root_dir/server.log
want_port=${COSTAWARE_PG_PORT:-54329}
cd / # the server user may not be allowed into the caller's directory

find_bindir() {
	local d best
	best=$(for d in /usr/lib/postgresql/*/bin; do
		if [[ -x $d/initdb && -x $d/pg_ctl ]]; then echo "$d"; fi
	done | sort -V | tail -n 1) # the highest major version
	if [[ -z $best ]] && command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		best=$(dirname "$(readlink -f "$(command -v initdb)")")
	fi
	[[ -n $best ]] && echo "$best"
}

if ! bindir=$(find_bindir); then
	[[ $(id -u) -eq 0 ]] || die "PostgreSQL is not installed and installing it needs root."
	command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and apt-get is missing."
	log "installing PostgreSQL with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends postgresql postgresql-client >/dev/null
	bindir=$(find_bindir) || die "apt-get installed postgresql, but no initdb was found."
fi

if [[ $(id -u) -eq 0 ]]; then
	if ! id -u postgres >/dev/null 2>&1; then
		useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
	fi
	as_server() { runuser -u postgres -- "$@"; }
	server_user=postgres
else
	as_server() { "$@"; }
	server_user=$(id -un)
fi

pg_ctl=$bindir/pg_ctl
major=$("$bindir/postgres" --version | sed -E 's/.* ([0-9]+)(\.[0-9]+)*.*/\1/')

if [[ ${1:-} == stop ]]; then
	if [[ -d $data_dir ]] && as_server "$pg_ctl" -D "$data_dir" status >/dev/null 2>&1; then
		as_server "$pg_ctl" -D "$data_dir" -m fast -w stop
	else
		log "no server running in $data_dir"
	fi
	exit 0
fi

port_in_use() { timeout 2 bash -c "exec 9<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

if [[ -d $data_dir ]] && as_server "$pg_ctl" -D "$data_dir" status >/dev/null 2>&1; then
	port=$(sed -n 4p "$data_dir/postmaster.pid")
	log "server already running in $data_dir on port $port"
else
	if [[ ! -s $data_dir/PG_VERSION || $(cat "$data_dir/PG_VERSION") != "$major" ]]; then
		log "initialising a PostgreSQL $major cluster in $data_dir"
		rm -rf "$data_dir"
		mkdir -p "$root_dir"
		chmod 700 "$root_dir"
		[[ $(id -u) -eq 0 ]] && chown "$server_user:" "$root_dir"
		as_server "$bindir/initdb" -D "$data_dir" -U postgres -E UTF8 --no-locale \
			--auth-local=trust --auth-host=scram-sha-256 --no-sync >/dev/null
	fi
	port=$want_port
	while port_in_use "$port"; do
		port=$((port + 1))
		((port < want_port + 50)) || die "no free port in $want_port..$port"
	done
	log "starting the server on 127.0.0.1:$port (log: $log_file)"
	# 3>&-: the server must not inherit fd 3 (the caller's `$(...)` pipe), or the caller's
	# command substitution waits for the server to exit, i.e. forever.
	if ! as_server "$pg_ctl" -D "$data_dir" -l "$log_file" -w -t 60 -o \
		"-p $port -c listen_addresses=127.0.0.1 -k $root_dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
		start >/dev/null 3>&-; then
		tail -n 30 "$log_file" || true
		die "the server did not start"
	fi
fi

# The role and the database (idempotent); over the Unix socket, where the superuser is trusted.
as_server "$bindir/psql" -h "$root_dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt <<'SQL'
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'costaware') THEN
        CREATE ROLE costaware LOGIN PASSWORD 'costaware';
    ELSE
        ALTER ROLE costaware LOGIN PASSWORD 'costaware';
    END IF;
END
$$;
SELECT 'CREATE DATABASE costaware_test OWNER costaware'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'costaware_test')\gexec
SQL

# The check the tests depend on: a password login over TCP.
PGPASSWORD=costaware PGCONNECT_TIMEOUT=10 "$bindir/psql" -h 127.0.0.1 -p "$port" -U costaware \
	-d costaware_test -v ON_ERROR_STOP=1 -qAt -c 'SELECT 1' >/dev/null ||
	die "cannot log in as costaware over 127.0.0.1:$port"

log "ready: postgresql://costaware@127.0.0.1:$port/costaware_test"
echo "export COSTAWARE_TEST_POSTGRES_URL=postgresql+psycopg://costaware:costaware@127.0.0.1:$port/costaware_test" >&3
