#!/bin/sh
# The database on every start, as upstream's mysql image makes it on its first: a data folder,
# the database MYSQL_DATABASE (when set), the account MYSQL_USER with MYSQL_PASSWORD granted that
# database only (when set), root with MYSQL_ROOT_PASSWORD from MYSQL_ROOT_HOST (default '%', as
# the image's; `localhost`: from inside the pod only) and from nowhere else (a root@'%' left by an
# earlier start, and mariadb-install-db's root@127.0.0.1, ::1 and host name, which have no
# password, are dropped), then the `.sql` files of /docker-entrypoint-initdb.d in name order; then the server in
# the foreground. The statements are idempotent and replayed on each start, so a changed Secret
# takes effect at the next start. Unlike the image, an empty root password
# (MYSQL_ALLOW_EMPTY_PASSWORD) is refused: the test cluster's Secrets are generated
# (hack/credentials.sh).
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
[ -z "${MYSQL_ALLOW_EMPTY_PASSWORD:-}" ] ||
  { echo "gpupipe-mariadb: MYSQL_ALLOW_EMPTY_PASSWORD is set: root gets a password here (MYSQL_ROOT_PASSWORD)" >&2; exit 2; }
: "${MYSQL_ROOT_PASSWORD:?gpupipe-mariadb: MYSQL_ROOT_PASSWORD is not set (or empty)}"
tmp="${TMPDIR:-/tmp}"
initdb="${GPUPIPE_INITDB_DIR:-/docker-entrypoint-initdb.d}"
mkdir -p "$datadir"
if [ ! -d "${datadir}/mysql" ]; then
  echo "gpupipe-mariadb: initialising ${datadir}"
  mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
    --skip-test-db >"${tmp}/install-db.log" 2>&1 || { cat "${tmp}/install-db.log" >&2; exit 1; }
fi
# A value inside a quoted SQL string.
sql_string() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e "s/'/''/g"; }
# A name inside backquotes.
# shellcheck disable=SC2016  # backquotes, not an expansion
sql_name() { printf '%s' "$1" | sed 's/`/``/g'; }
pw="$(sql_string "$MYSQL_ROOT_PASSWORD")"
root_host="$(sql_string "${MYSQL_ROOT_HOST:-%}")"
umask 077
{
  if [ -n "${MYSQL_DATABASE:-}" ]; then
    # shellcheck disable=SC2016  # backquotes, not an expansion
    printf 'CREATE DATABASE IF NOT EXISTS `%s`;\n' "$(sql_name "$MYSQL_DATABASE")"
  fi
  printf "ALTER USER 'root'@'localhost' IDENTIFIED BY '%s';\n" "$pw"
  if [ "${MYSQL_ROOT_HOST:-%}" != localhost ]; then
    printf "CREATE USER IF NOT EXISTS 'root'@'%s';\n" "$root_host"
    printf "ALTER USER 'root'@'%s' IDENTIFIED BY '%s';\n" "$root_host" "$pw"
    printf "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%s' WITH GRANT OPTION;\n" "$root_host"
  fi
  # mariadb-install-db also makes root@127.0.0.1, root@::1 and root@<the first pod's name>,
  # without a password: root is left at localhost and MYSQL_ROOT_HOST only (a root@'%' from an
  # earlier start goes too where MYSQL_ROOT_HOST is not '%'). FLUSH PRIVILEGES below reloads.
  printf "DELETE FROM mysql.global_priv WHERE User = 'root' AND Host NOT IN ('localhost', '%s');\n" "$root_host"
  printf "DELETE FROM mysql.proxies_priv WHERE User = 'root' AND Host NOT IN ('localhost', '%s');\n" "$root_host"
  if [ -n "${MYSQL_USER:-}" ]; then
    [ "$MYSQL_USER" != root ] || { echo "gpupipe-mariadb: MYSQL_USER must not be root" >&2; exit 2; }
    : "${MYSQL_PASSWORD:?gpupipe-mariadb: MYSQL_USER is set without MYSQL_PASSWORD}"
    user="$(sql_string "$MYSQL_USER")"
    printf "CREATE USER IF NOT EXISTS '%s'@'%%';\n" "$user"
    printf "ALTER USER '%s'@'%%' IDENTIFIED BY '%s';\n" "$user" "$(sql_string "$MYSQL_PASSWORD")"
    if [ -n "${MYSQL_DATABASE:-}" ]; then
      printf "GRANT ALL PRIVILEGES ON \`%s\`.* TO '%s'@'%%';\n" "$(sql_name "$MYSQL_DATABASE")" "$user"
    fi
  fi
  for f in "$initdb"/*.sql; do
    [ -f "$f" ] || continue
    cat "$f"
    echo
  done
  echo "FLUSH PRIVILEGES;"
} >"${tmp}/init.sql"
exec mariadbd --datadir="$datadir" --init-file="${tmp}/init.sql" --bind-address=0.0.0.0 \
  --socket=/run/mysqld/mysqld.sock --skip-name-resolve
