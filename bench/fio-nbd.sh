#!/usr/bin/env bash
# fio's nbd engine against a Carmine NBD export: 4K random read/write and 64K sequential
# read/write at queue depths 1, 16, 64. Until `carmine bench --target fio-nbd` exists this is
# the reproducible command line behind the NBD table in BENCHMARKS.md.
#
# Placement on a 2-core box: OSD reactor on cpu 1; fio and the NBD gateway share cpu 0.
# Usage: bench/fio-nbd.sh [RUNTIME_SECONDS] [OUTPUT_DIR]
set -euo pipefail
runtime=${1:-5}
out=${2:-carmine-bench/fio-nbd-$(date -u +%Y%m%d-%H%M%S)}
carmine=${CARMINE:-target/release/carmine}
mkdir -p "$out"
dir="$out/cluster"
port=$((20000 + RANDOM % 20000))

"$carmine" cluster up --dir "$dir" --cpu-set 1 --memory-limit 4G > "$out/cluster-up.txt"
cleanup() {
  [ -n "${gw:-}" ] && kill "$gw" 2>/dev/null || true
  "$carmine" cluster down --dir "$dir" > /dev/null || true
}
trap cleanup EXIT
"$carmine" volume create bench --size 1G --dir "$dir" > /dev/null
taskset -c 0 "$carmine" nbd serve --export bench --listen "127.0.0.1:$port" --dir "$dir" > "$out/nbd.txt" 2>&1 &
gw=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
uri="nbd://127.0.0.1:$port/bench"

# Prefill so reads return data.
taskset -c 0 fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G > /dev/null

printf '| workload | qd | IOPS | MiB/s | mean clat us | p99 clat us |\n|---|---|---|---|---|---|\n' > "$out/table.md"
for spec in randread:4k randwrite:4k read:64k write:64k; do
  rw=${spec%%:*}; bs=${spec##*:}
  for qd in 1 16 64; do
    json="$out/$rw-$bs-qd$qd.json"
    taskset -c 0 fio --name="$rw-$bs-qd$qd" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" \
      --iodepth="$qd" --size=1G --time_based --runtime="$runtime" --ramp_time=1 \
      --output-format=json --output="$json" > /dev/null
    python3 - "$json" "$rw" "$bs" "$qd" >> "$out/table.md" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
clat = side["clat_ns"]
print(f"| {sys.argv[2]} {sys.argv[3]} | {sys.argv[4]} | {side['iops']:,.0f} | {side['bw_bytes']/2**20:,.0f} | "
      f"{clat['mean']/1000:.1f} | {clat['percentile'].get('99.000000', 0)/1000:.1f} |")
PY
  done
done
cat "$out/table.md"
