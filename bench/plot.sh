#!/usr/bin/env bash
# Plots kvserve_bench results: output tokens/s against p99 TPOT (ms), one
# line per JSON file (a configuration, named by its --label), one point per
# load level of its sweep, each point marked with its concurrency (or rate).
# The usual serving trade-off: further right is slower per token, higher is
# more throughput; a better configuration sits up and to the left.
#
#   bash bench/plot.sh OUT.png RESULT.json [RESULT.json ...]
# Needs gnuplot (Debian gnuplot-nox) and python3.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: bash bench/plot.sh OUT.png RESULT.json [RESULT.json ...]" >&2
  exit 2
fi
png=$1
shift
command -v gnuplot >/dev/null || {
  echo "bench/plot.sh: gnuplot is not installed (apt-get install gnuplot-nox)" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One data file per result: "tpot_p99_ms tokens_per_s point_label", plus its title.
python3 - "$tmp" "$@" <<'EOF'
import json, os, sys
tmp, files = sys.argv[1], sys.argv[2:]
with open(os.path.join(tmp, "titles"), "w") as titles:
    for i, path in enumerate(files):
        doc = json.load(open(path))
        title = doc["label"] or os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(tmp, f"{i}.dat"), "w") as out:
            for r in doc["runs"]:
                tpot = r["latency_ms"]["tpot"]["p99"]
                if tpot is None or r["requests"]["completed"] == 0:
                    continue
                load = r["load"]
                point = (f"c={load['concurrency']}" if load["mode"] == "closed"
                         else f"{load['request_rate']:g}/s")
                out.write(f"{tpot} {r['throughput']['output_tokens_per_s']} {point}\n")
        titles.write(title.replace('"', "'") + "\n")
EOF

workload=$(python3 - "$1" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))["workload"]
if w["kind"] == "shared_prefix":
    print(f"shared prefix: {w['groups']} groups x {w['prefix_len']}-token prefix + "
          f"{w['suffix_len']}, {w['output_len']} out")
else:
    print(f"{w['kind']} workload, {w['input_len']} in / {w['output_len']} out tokens")
EOF
)

{
  echo "set terminal pngcairo size 900,560 font 'sans,10'"
  echo "set output '$png'"
  echo "set title \"Throughput against p99 TPOT over a concurrency sweep\\n{/*0.9 $workload}\""
  echo "set xlabel 'p99 time per output token (ms)'"
  echo "set ylabel 'output tokens/s'"
  echo "set grid"
  echo "set key outside right top"
  echo "set xrange [0:*]"
  echo "set yrange [0:*]"
  colors=('#1f77b4' '#d62728' '#2ca02c' '#ff7f0e' '#9467bd' '#8c564b' '#e377c2' '#17becf')
  points=(7 5 9 11 13 15 4 6)
  plots=()
  i=0
  while IFS= read -r title; do
    style="lw 2 lc rgb '${colors[$((i % 8))]}' pt ${points[$((i % 8))]} ps 1.2"
    plots+=("'$tmp/$i.dat' using 1:2 with linespoints $style title \"$title\"")
    plots+=("'$tmp/$i.dat' using 1:2:3 with labels offset 0.8,0.6 font ',8' notitle")
    i=$((i + 1))
  done <"$tmp/titles"
  (
    IFS=,
    echo "plot ${plots[*]}"
  )
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
