#!/usr/bin/env bash
# Where the time goes on the fio → NBD gateway → OSD path: one step of fio's nbd engine against
# a Carmine memory-store OSD, profiled machine-wide with perf (both cores), then broken down by
# process and by the hottest symbols of each.
#
# Placement as in the comparisons: OSD reactor on cpu 1; fio and the NBD gateway on cpu 0.
# Usage: bench/profile-fio-nbd.sh [RW] [BS] [QD] [SECONDS] [OUTPUT_DIR]
# Needs root, fio, and perf (apt-get install linux-perf).
set -euo pipefail
rw=${1:-randread}; bs=${2:-4k}; qd=${3:-64}; secs=${4:-8}
out=${5:-carmine-bench/profile-$rw-$bs-qd$qd-$(date -u +%Y%m%d-%H%M%S)}
carmine=${CARMINE:-target/release/carmine}
mkdir -p "$out"; dir="$out/cluster"
port=$((20000 + RANDOM % 20000))
"$carmine" cluster up --dir "$dir" --cpu-set 1 --memory-limit 4G > /dev/null
cleanup() {
  [ -n "${gw:-}" ] && kill "$gw" 2>/dev/null || true
  "$carmine" cluster down --dir "$dir" > /dev/null || true
}
trap cleanup EXIT
"$carmine" volume create bench --size 1G --dir "$dir" > /dev/null
taskset -c 0 "$carmine" nbd serve --export bench --listen "127.0.0.1:$port" --dir "$dir" > /dev/null 2>&1 &
gw=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
uri="nbd://127.0.0.1:$port/bench"
taskset -c 0 fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G > /dev/null
taskset -c 0 fio --name=profile --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
  --size=1G --time_based --runtime=$((secs + 2)) --output-format=json --output="$out/fio.json" > /dev/null &
fio_pid=$!
sleep 1
perf record -a -g -F 999 -o "$out/perf.data" -- sleep "$secs" 2> /dev/null
wait "$fio_pid"
{
  echo "# $rw $bs qd$qd, ${secs}s, perf record -a -g -F 999 (both cores)"
  python3 - "$out/fio.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
s = j["read"] if j["read"]["io_bytes"] else j["write"]
print("fio: %.0f IOPS, mean clat %.1f us" % (s["iops"], s["clat_ns"]["mean"] / 1000))
PY
  echo; echo "## Samples by process"
  perf report -i "$out/perf.data" --no-children --sort comm --stdio 2> /dev/null | grep -v '^#' | grep -v '^$' | head -12
  for comm in osd0-r0 carmine fio; do
    echo; echo "## Hottest symbols in $comm"
    perf report -i "$out/perf.data" --no-children --comm "$comm" --sort dso,sym --stdio -g none 2> /dev/null \
      | grep -v '^#' | grep -v '^$' | head -25
  done
} > "$out/profile.md"
cat "$out/profile.md"
