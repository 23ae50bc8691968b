#!/usr/bin/env bash
# Renders kvserve.conf.template for a set of kvserve replicas, to stdout.
#
#   render.sh [OPTIONS] HOST:HTTP_PORT:GRPC_PORT...               (static mode)
#   render.sh [OPTIONS] --resolver ADDR --dns NAME:HTTP_PORT:GRPC_PORT  (dns mode)
#
# Options:
#   --http-listen ADDR   nginx's HTTP listen (anything `listen` takes); 8000
#   --grpc-listen ADDR   nginx's gRPC listen; 50051
#   --access-log PATH    or off; /var/log/nginx/kvserve.access.log
#   --config FILE        the replicas' kvserve config (or a ConfigMap holding
#                        it): client_max_body_size = its server.max_body_bytes
#   --max-body SIZE      the same, given directly (8MiB, 32MiB, 1000000);
#                        default 8MiB, kvserve's default
# Static mode: each replica's address (an IP; a host name must resolve when
# nginx starts) with its server.http_port and server.grpc_port. Dns mode: one
# name resolving to every replica, looked up while running through the
# resolver at ADDR (IP[:PORT]). The template explains both.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
http_listen=8000
grpc_listen=50051
access_log=/var/log/nginx/kvserve.access.log
max_body=8MiB
resolver=""
dns=""
replicas=()
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "render.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --http-listen) [[ $# -ge 2 ]] || usage; http_listen=$2; shift 2 ;;
    --grpc-listen) [[ $# -ge 2 ]] || usage; grpc_listen=$2; shift 2 ;;
    --access-log) [[ $# -ge 2 ]] || usage; access_log=$2; shift 2 ;;
    --max-body) [[ $# -ge 2 ]] || usage; max_body=$2; shift 2 ;;
    --config)
      [[ $# -ge 2 ]] || usage
      [[ -f "$2" ]] || die "--config: no file $2"
      # The first `max_body_bytes:` key (under server:), comment stripped.
      max_body=$(awk '/^[ \t]*max_body_bytes[ \t]*:/ {
                        sub(/^[^:]*:[ \t]*/, ""); sub(/[ \t]*#.*/, ""); gsub(/["'\'']/, "");
                        print; exit }' "$2")
      [[ -n "$max_body" ]] || max_body=8MiB   # not set: kvserve's default
      shift 2 ;;
    --resolver) [[ $# -ge 2 ]] || usage; resolver=$2; shift 2 ;;
    --dns) [[ $# -ge 2 ]] || usage; dns=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "render.sh: unknown flag $1" >&2; usage ;;
    *)
      [[ "$1" =~ ^[A-Za-z0-9._-]+:[0-9]+:[0-9]+$ ]] || die "replica '$1' is not HOST:HTTP_PORT:GRPC_PORT"
      replicas+=("$1"); shift ;;
  esac
done

if [[ -n "$dns" || -n "$resolver" ]]; then
  mode=dns
  [[ -n "$dns" && -n "$resolver" ]] || die "dns mode needs both --resolver and --dns"
  [[ ${#replicas[@]} -eq 0 ]] || die "dns mode takes no replica list (--dns names them all)"
  [[ "$dns" =~ ^[A-Za-z0-9._-]+:[0-9]+:[0-9]+$ ]] || die "--dns '$dns' is not NAME:HTTP_PORT:GRPC_PORT"
  [[ "$resolver" =~ ^[][A-Za-z0-9._:-]+$ ]] || die "--resolver '$resolver' is not an address"
else
  mode=static
  [[ ${#replicas[@]} -gt 0 ]] || { echo "render.sh: no replicas given" >&2; usage; }
fi

# kvserve's byte sizes (config.cc ParseByteSize): a number with an optional
# unit, IEC (KiB, Mi, ...) = 1024^n, SI and bare letters = 1000^n, any case.
bytes=$(awk -v s="$max_body" 'BEGIN {
  if (match(s, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
  v = substr(s, 1, RLENGTH); u = tolower(substr(s, RLENGTH + 1)); sub(/^[ \t]+/, "", u)
  m["b"] = 1; m["k"] = m["kb"] = 1e3; m["m"] = m["mb"] = 1e6; m["g"] = m["gb"] = 1e9
  m["t"] = m["tb"] = 1e12; m["ki"] = m["kib"] = 2^10; m["mi"] = m["mib"] = 2^20
  m["gi"] = m["gib"] = 2^30; m["ti"] = m["tib"] = 2^40
  if (u == "") f = 1; else if (u in m) f = m[u]; else exit 1
  b = v * f; if (b < 1 || (f == 1 && v != int(v))) exit 1
  printf "%.0f\n", b }') || die "max body size '$max_body' is not a byte size (8MiB, 32MiB, 1000000)"

# The replica list travels as "host:http:grpc" words; awk keeps the lines of
# the chosen mode, repeats each replica line once per replica and fills the
# single-valued placeholders (comment lines are copied as they are).
dns_host=${dns%%:*}
dns_ports=${dns#*:}
awk -v mode="$mode" -v http_listen="$http_listen" -v grpc_listen="$grpc_listen" \
    -v access_log="$access_log" -v replicas="${replicas[*]}" -v max_body="$bytes" \
    -v resolver="$resolver" -v dns_http="$dns_host:${dns_ports%%:*}" \
    -v dns_grpc="$dns_host:${dns_ports#*:}" '
  BEGIN {
    n = split(replicas, r, " ")
    print "# Rendered by deploy/nginx/render.sh (" mode " mode) from kvserve.conf.template: edit that and re-render."
    keep = 1
  }
  /^# @if / { keep = ($3 == mode); next }
  /^# @endif/ { keep = 1; next }
  !keep { next }
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
    gsub(/@MAX_BODY@/, max_body)
    gsub(/@RESOLVER@/, resolver)
    gsub(/@DNS_HTTP@/, dns_http)
    gsub(/@DNS_GRPC@/, dns_grpc)
    print
  }' "$here/kvserve.conf.template"
