#!/usr/bin/env bash
# Renders kvserve.conf.template for a set of kvserve replicas, to stdout.
#
#   render.sh [--http-listen ADDR] [--grpc-listen ADDR] [--access-log PATH|off] \
#             HOST:HTTP_PORT:GRPC_PORT...
#
# ADDR is anything nginx's `listen` takes (8000, 127.0.0.1:8000). Each
# replica is a host name or IPv4 address with its server.http_port and
# server.grpc_port. Defaults: --http-listen 8000, --grpc-listen 50051,
# --access-log /var/log/nginx/kvserve.access.log.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
http_listen=8000
grpc_listen=50051
access_log=/var/log/nginx/kvserve.access.log
replicas=()
usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --http-listen) [[ $# -ge 2 ]] || usage; http_listen=$2; shift 2 ;;
    --grpc-listen) [[ $# -ge 2 ]] || usage; grpc_listen=$2; shift 2 ;;
    --access-log) [[ $# -ge 2 ]] || usage; access_log=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "render.sh: unknown flag $1" >&2; usage ;;
    *)
      if [[ ! "$1" =~ ^[A-Za-z0-9._-]+:[0-9]+:[0-9]+$ ]]; then
        echo "render.sh: replica '$1' is not HOST:HTTP_PORT:GRPC_PORT" >&2
        exit 2
      fi
      replicas+=("$1"); shift ;;
  esac
done
[[ ${#replicas[@]} -gt 0 ]] || { echo "render.sh: no replicas given" >&2; usage; }

# The replica list travels as "host:http:grpc" words; awk repeats each
# replica line once per replica and fills the single-valued placeholders
# (comment lines are copied as they are).
awk -v http_listen="$http_listen" -v grpc_listen="$grpc_listen" \
    -v access_log="$access_log" -v replicas="${replicas[*]}" '
  BEGIN {
    n = split(replicas, r, " ")
    print "# Rendered by deploy/nginx/render.sh from kvserve.conf.template: edit that and re-render."
  }
  /^[ \t]*#/ { print; next }
  /@HTTP_REPLICA@/ || /@GRPC_REPLICA@/ {
    for (i = 1; i <= n; i++) {
      split(r[i], part, ":")
      line = $0
      gsub(/@HTTP_REPLICA@/, part[1] ":" part[2], line)
      gsub(/@GRPC_REPLICA@/, part[1] ":" part[3], line)
      print line
    }
    next
  }
  {
    gsub(/@HTTP_LISTEN@/, http_listen)
    gsub(/@GRPC_LISTEN@/, grpc_listen)
    gsub(/@ACCESS_LOG@/, access_log)
    print
  }' "$here/kvserve.conf.template"
