#!/bin/sh
# The database on first start, as upstream's mysql image makes it: a data folder, the database
# MYSQL_DATABASE (when set), and root reachable over TCP with MYSQL_ROOT_PASSWORD, or with no
# password when MYSQL_ALLOW_EMPTY_PASSWORD is set (KFP's install); then the server in the
# foreground. Every start replays the same idempotent statements.
# Arguments are those upstream's Deployments pass: `--datadir DIR` (Katib, KFP), and MySQL 8.4's
# `--authentication-policy=mysql_native_password --mysql-native-password=ON --disable-log-bin`
# (KFP): MariaDB's accounts use native passwords and it keeps no binary log unless asked, so
# these three ask for what it does already and are accepted as they are. Any other argument is
# refused, naming it.
set -eu
datadir=/var/lib/mysql/datadir
while [ $# -gt 0 ]; do
  case "$1" in
  --datadir) datadir="$2"; shift 2 ;;
  --datadir=*) datadir="${1#--datadir=}"; shift ;;
  --authentication-policy=mysql_native_password | --mysql-native-password=ON | --disable-log-bin) shift ;;
  *) echo "gpupipe-mariadb: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "${MYSQL_ALLOW_EMPTY_PASSWORD:-}" ] && [ -z "${MYSQL_ROOT_PASSWORD:-}" ]; then
  MYSQL_ROOT_PASSWORD=""
else
  : "${MYSQL_ROOT_PASSWORD:?gpupipe-mariadb: neither MYSQL_ROOT_PASSWORD nor MYSQL_ALLOW_EMPTY_PASSWORD is set}"
fi
mkdir -p "$datadir"
if [ ! -d "${datadir}/mysql" ]; then
  echo "gpupipe-mariadb: initialising ${datadir}"
  mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
    --skip-test-db >/tmp/install-db.log 2>&1 || { cat /tmp/install-db.log >&2; exit 1; }
fi
pw="$(printf '%s' "$MYSQL_ROOT_PASSWORD" | sed "s/'/''/g")"
umask 077
{
  if [ -n "${MYSQL_DATABASE:-}" ]; then
    printf 'CREATE DATABASE IF NOT EXISTS `%s`;\n' "$MYSQL_DATABASE"
  fi
  cat <<SQL
CREATE USER IF NOT EXISTS 'root'@'%';
ALTER USER 'root'@'localhost' IDENTIFIED BY '${pw}';
ALTER USER 'root'@'%' IDENTIFIED BY '${pw}';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
} >/tmp/init.sql
exec mariadbd --datadir="$datadir" --init-file=/tmp/init.sql --bind-address=0.0.0.0 \
  --socket=/run/mysqld/mysqld.sock --skip-name-resolve
