#!/usr/bin/env bash
# Client I/O while an OSD is lost and refilled in the background, in one run on this machine:
# a 3-OSD memory-store cluster (STORE=native: native stores on 3 GiB files; OSDs on cpu 1), a
# 1 GiB volume filled with random bytes, fio's
# nbd engine writing 4 KiB at random at depth 16 through `carmine nbd serve` (both on cpu 0)
# for 30 s (over the first SPAN of the volume), with IOPS logged per second. 8 s in, osd.2 is killed with SIGKILL and restarted
# 1 s later with an empty store; `cluster status` is polled until it counts every object
# recovered. Writes OUT_DIR/summary: the refill time, the client's IOPS per second and the
# objects left to recover every half second (fio's logs stay in a temporary directory).
# Usage: bench/recovery-under-load.sh OUT_DIR [RATE_MIB=128] [SPAN=1G] [BUSY_RATE_MIB=16]
# (rate 0: no limit; a span smaller than the volume leaves most objects to the background, at
# the rate; the busy rate applies while clients are active on an OSD's reactor, 0: the rate)
# VOLUME=4G: a larger volume (with the memory store, MEMORY_LIMIT per OSD, default 2G).
# EVENT=add: instead of the kill, a fourth OSD is added (`osd add --in`) and started 8 s in,
# and the PGs placed on it are filled the same way. With STORE=native, the killed OSD comes
# back on a freshly made store file, as after a disk replacement.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [RATE_MIB]}
rate=${2:-128}
span=${3:-1G}
busy=${4:-16}
carmine=$(realpath "${CARMINE:-target/release/carmine}")
command -v fio >/dev/null || { echo "needs fio (apt-get install fio)" >&2; exit 1; }
dir=$(mktemp -d /tmp/carmine-recovery-XXXX)
export CARMINE_DIR=$dir/cluster
mkdir -p "$out"
out=$(realpath "$out")
trap '"$carmine" cluster down --dir "$CARMINE_DIR" >/dev/null 2>&1; kill $nbd 2>/dev/null; rm -rf "$dir"' EXIT
if [ "${STORE:-memory}" = native ]; then
  store_opts=(--store native --device-size 3G)
else
  store_opts=(--store memory --memory-limit "${MEMORY_LIMIT:-2G}")
fi
"$carmine" cluster up --osds 3 "${store_opts[@]}" --pg-num 64 --cpu-set 1 \
  --recovery-rate-mib "$rate" --recovery-busy-rate-mib "$busy" >/dev/null
"$carmine" volume create v --size "${VOLUME:-1G}" >/dev/null
head -c "${VOLUME:-1G}" /dev/urandom | "$carmine" volume write v -f - -q >/dev/null
taskset -c 0 "$carmine" nbd serve --export v --listen 127.0.0.1:10809 >"$dir/nbd.log" 2>&1 &
nbd=$!
sleep 1
(cd "$dir" && taskset -c 0 fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:10809/v \
  --rw=randwrite --bs=4k --iodepth=16 --time_based --runtime=30 --size="$span" \
  --write_iops_log=w --log_avg_msec=1000 --output-format=terse >fio.out 2>&1) &
fio=$!
sleep 8
event=${EVENT:-kill}
if [ "$event" = add ]; then
  t0=$(date +%s.%N)
  "$carmine" osd add --host 127.0.0.1 --in >/dev/null
  if [ "${STORE:-memory}" = native ]; then
    "$carmine" store mkfs --device "$CARMINE_DIR/osd.3.store" --size 3G >/dev/null
  fi
else
  kill -9 "$(cat "$CARMINE_DIR/osd.2.pid")"
  t0=$(date +%s.%N)
  sleep 1
  if [ "${STORE:-memory}" = native ]; then
    rm "$CARMINE_DIR/osd.2.store"
    "$carmine" store mkfs --device "$CARMINE_DIR/osd.2.store" --size 3G >/dev/null
  fi
fi
"$carmine" cluster up --cpu-set 1 --recovery-rate-mib "$rate" --recovery-busy-rate-mib "$busy" >/dev/null
start=$(date +%s.%N)
: >"$dir/status.log"
# Until objects were counted to recover and none is left; bounded: ten minutes at most.
counted=
for _ in $(seq 1 1200); do
  s=$("$carmine" cluster status 2>/dev/null | grep "pg states")
  echo "$(echo "$(date +%s.%N) - $start" | bc) $s" >>"$dir/status.log"
  echo "$s" | grep -qE "; [1-9][0-9]* objects to recover|, [1-9][0-9]* misplaced" && counted=1
  [ -n "$counted" ] && echo "$s" | grep -qE "; 0 objects to recover, 0 misplaced, [1-9][0-9]* recovered" && break
  sleep 0.5
done
t1=$(date +%s.%N)
if [ "$event" = add ]; then
  what="osd.3 added ~8 s into fio, its PGs filled $(echo "$t1 - $t0" | bc) s after the add"
else
  what="osd.2 killed ~8 s into fio, refilled $(echo "$t1 - $t0" | bc) s after the kill"
fi
echo "rate $rate MiB/s ($busy while clients are active), writes over $span: $what" >"$out/summary"
wait $fio
echo "IOPS per second:" >>"$out/summary"
awk -F, '{printf "%d:%d ", $1/1000, $2} END {print ""}' "$dir/w_iops.1.log" >>"$out/summary"
echo "objects to recover + misplaced, seconds after the restart:" >>"$out/summary"
sed -E 's/^([0-9.]+) .*; ([0-9]+) objects to recover, ([0-9]+) misplaced.*/\1:\2+\3/' "$dir/status.log" |
  awk -F: '{printf "%.1f:%s ", $1, $2} END {print ""}' >>"$out/summary"
cat "$out/summary"
