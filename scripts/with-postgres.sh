#!/usr/bin/env bash
# Run a command with a PostgreSQL server available to it.
#
#   scripts/with-postgres.sh CMD [ARGS...]
#
# If CORRAL_TEST_PG_URL is already set, CMD simply runs against that server
# (and CORRAL_TEST_PG_CTL is not set: tests never restart an outside server).
# Otherwise a throwaway cluster is created in a fresh temporary directory,
# started on a free TCP port on 127.0.0.1 only (trust auth, no durability),
# CORRAL_TEST_PG_URL is exported for CMD, and the cluster is stopped and
# deleted when CMD finishes, whatever happens. CMD's exit code is returned.
#
# PostgreSQL binaries are looked up on PATH, then in /usr/lib/postgresql/*/bin
# (highest version first). When missing and running as root on Debian, the
# `postgresql` package is installed with apt-get.
set -euo pipefail

me="with-postgres"
say() { echo "$me: $*" >&2; }
die() { echo "$me: error: $*" >&2; exit 1; }

[ $# -gt 0 ] || die "usage: $0 CMD [ARGS...]"

if [ -n "${CORRAL_TEST_PG_URL:-}" ]; then
    unset CORRAL_TEST_PG_CTL CORRAL_TEST_PG_DATA CORRAL_TEST_PG_LOG CORRAL_TEST_PG_AS
    masked=$(printf '%s' "$CORRAL_TEST_PG_URL" | sed -E 's#(://[^:/@]*):[^@]*@#\1:***@#')
    say "tests use the PostgreSQL server from CORRAL_TEST_PG_URL: $masked"
    exec "$@"
fi

PG_LIB_ROOT=${CORRAL_PG_LIB_ROOT:-/usr/lib/postgresql}

# Prints the directory holding initdb and pg_ctl, or fails.
find_bindir() {
    local p d
    if p=$(command -v initdb 2>/dev/null); then
        d=$(dirname -- "$(readlink -f -- "$p")")
        if [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
            echo "$d"
            return 0
        fi
    fi
    while IFS= read -r d; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
            echo "$d"
            return 0
        fi
    done < <(ls -d "$PG_LIB_ROOT"/*/bin 2>/dev/null | sort -V -r)
    return 1
}

if ! BINDIR=$(find_bindir); then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "PostgreSQL server binaries (initdb, pg_ctl) not found; install them (Debian: apt-get install postgresql) or set CORRAL_TEST_PG_URL"
    fi
    say "PostgreSQL not found; installing the Debian 'postgresql' package"
    apt-get update -qq </dev/null >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql </dev/null >/dev/null
    BINDIR=$(find_bindir) || die "PostgreSQL binaries still not found after installing the postgresql package"
fi

PG_ISREADY="$BINDIR/pg_isready"
[ -x "$PG_ISREADY" ] || PG_ISREADY=$(command -v pg_isready 2>/dev/null || true)

# PostgreSQL refuses to run as root: run the server as the unprivileged
# `postgres` system user (created by the Debian package; created here if absent).
AS=()
if [ "$(id -u)" -eq 0 ]; then
    if ! id -u postgres >/dev/null 2>&1; then
        say "creating system user 'postgres' to own the throwaway cluster"
        useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home \
            --shell /bin/sh postgres
    fi
    if command -v runuser >/dev/null 2>&1; then
        AS=(runuser -u postgres --)
    elif command -v setpriv >/dev/null 2>&1; then
        AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)
    else
        die "running as root but neither runuser nor setpriv is available to drop privileges"
    fi
fi

WORKDIR=""
DATA=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [ -n "$DATA" ] && [ -f "$DATA/postmaster.pid" ]; then
        local pid
        pid=$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null || true)
        if ! (cd "$WORKDIR" && "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -m fast -w -t 20 stop) >/dev/null 2>&1; then
            (cd "$WORKDIR" && "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -m immediate -w -t 10 stop) >/dev/null 2>&1 \
                || { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; } || true
        fi
    fi
    if [ -n "$WORKDIR" ]; then
        rm -rf -- "$WORKDIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# A fresh directory the server user can write to (TMPDIR may be private to us).
for base in "${TMPDIR:-/tmp}" /tmp; do
    WORKDIR=$(mktemp -d "$base/corral-pg.XXXXXX")
    chmod 700 "$WORKDIR"
    if [ ${#AS[@]} -gt 0 ]; then
        chown postgres: "$WORKDIR"
        if ! "${AS[@]}" test -w "$WORKDIR" 2>/dev/null; then
            rm -rf -- "$WORKDIR"
            WORKDIR=""
            continue
        fi
    fi
    break
done
[ -n "$WORKDIR" ] || die "no temporary directory writable by the postgres user"
DATA="$WORKDIR/data"
LOG="$WORKDIR/server.log"
ORIG_PWD=$PWD
cd "$WORKDIR"  # the server user must be able to stat its working directory

if ! "${AS[@]}" "$BINDIR/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$WORKDIR/initdb.log" 2>&1; then
    cat "$WORKDIR/initdb.log" >&2
    die "initdb failed"
fi
cat >>"$DATA/postgresql.conf" <<CONF

# throwaway test cluster (scripts/with-postgres.sh)
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORKDIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF

free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

PORT=""
for attempt in 1 2 3 4 5; do
    candidate=$(free_port)
    if "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -o "-p $candidate" -w -t 60 start >/dev/null 2>&1; then
        PORT=$candidate
        break
    fi
    # Lost a race for the port (or another failure): try again on a new port.
    [ -f "$DATA/postmaster.pid" ] && "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
done
if [ -z "$PORT" ]; then
    tail -n 30 "$LOG" >&2 || true
    die "could not start the throwaway PostgreSQL cluster"
fi

if [ -n "$PG_ISREADY" ]; then
    deadline=$((SECONDS + 60))
    until "$PG_ISREADY" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 30 "$LOG" >&2 || true
            die "PostgreSQL on 127.0.0.1:$PORT did not accept connections within 60s"
        fi
        sleep 0.1
    done
fi

export CORRAL_TEST_PG_URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
# Tests that restart or crash the server they own use these (never set for an
# outside server): pg_ctl, the data directory, its log, and the command prefix
# that runs pg_ctl as the server's user (empty when not root).
export CORRAL_TEST_PG_CTL="$BINDIR/pg_ctl"
export CORRAL_TEST_PG_DATA="$DATA"
export CORRAL_TEST_PG_LOG="$LOG"
export CORRAL_TEST_PG_AS="${AS[*]:-}"
version=$("$BINDIR/postgres" --version | awk '{print $3}')
say "tests use a throwaway PostgreSQL $version at $CORRAL_TEST_PG_URL (removed afterwards)"

cd "$ORIG_PWD"
set +e
"$@"
rc=$?
set -e
exit "$rc"
