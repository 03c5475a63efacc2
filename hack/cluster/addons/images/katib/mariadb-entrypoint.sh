#!/bin/sh
# Katib's database on first start: a data folder under the claim, the `katib` database and root
# reachable over TCP with MYSQL_ROOT_PASSWORD (as upstream's mysql image makes them); then the
# server in the foreground. Every start replays the same idempotent statements. Arguments are
# upstream's (`--datadir DIR`).
set -eu
datadir=/var/lib/mysql/datadir
while [ $# -gt 0 ]; do
  case "$1" in
  --datadir) datadir="$2"; shift 2 ;;
  --datadir=*) datadir="${1#--datadir=}"; shift ;;
  *) echo "katib-mariadb: unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${MYSQL_ROOT_PASSWORD:?katib-mariadb: MYSQL_ROOT_PASSWORD is not set}"
db="${MYSQL_DATABASE:-katib}"
mkdir -p "$datadir"
if [ ! -d "${datadir}/mysql" ]; then
  echo "katib-mariadb: initialising ${datadir}"
  mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
    --skip-test-db >/tmp/install-db.log 2>&1 || { cat /tmp/install-db.log >&2; exit 1; }
fi
pw="$(printf '%s' "$MYSQL_ROOT_PASSWORD" | sed "s/'/''/g")"
umask 077
cat >/tmp/init.sql <<SQL
CREATE DATABASE IF NOT EXISTS \`${db}\`;
CREATE USER IF NOT EXISTS 'root'@'%';
ALTER USER 'root'@'localhost' IDENTIFIED BY '${pw}';
ALTER USER 'root'@'%' IDENTIFIED BY '${pw}';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
exec mariadbd --datadir="$datadir" --init-file=/tmp/init.sql --bind-address=0.0.0.0 \
  --socket=/run/mysqld/mysqld.sock --skip-name-resolve
