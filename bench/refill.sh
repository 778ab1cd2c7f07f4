#!/usr/bin/env bash
# How long a lost copy takes to come back, and what it costs: a 3-OSD cluster (all OSDs on
# cpu 1, no rate limit, no client), a 1 GiB volume of random bytes, then osd.2 is killed with
# SIGKILL and comes back empty (memory store: by restarting; native store: on a freshly made
# store file, as after a disk replacement). `cluster status` is polled every 0.1 s until every
# PG is active and no object is left to recover. Prints the refill time, the CPU the three OSDs
# spent meanwhile and osd.2's peak RSS.
# Usage: bench/refill.sh STORE(native|memory) PG_NUM [more `cluster up` options...]
# (e.g. `--recovery-max-active 1`). CARMINE: the binary (target/release/carmine).
set -euo pipefail
store=${1:?usage: $0 STORE PG_NUM [cluster up options]}
pg=${2:?usage: $0 STORE PG_NUM [cluster up options]}
shift 2
c=$(realpath "${CARMINE:-target/release/carmine}")
dir=$(mktemp -d /tmp/carmine-refill-XXXX)
export CARMINE_DIR=$dir/cluster
trap '"$c" cluster down >/dev/null 2>&1; rm -rf "$dir"' EXIT
"$c" cluster up --osds 3 --store "$store" --pg-num "$pg" --cpu-set 1 --recovery-rate-mib 0 \
  --recovery-busy-rate-mib 0 "$@" >/dev/null
"$c" volume create v --size 1G >/dev/null
head -c 1G /dev/urandom | "$c" volume write v -f - -q >/dev/null
kill -9 "$(cat "$CARMINE_DIR/osd.2.pid")"
sleep 0.5
if [ "$store" = native ]; then
  rm "$CARMINE_DIR/osd.2.store"
  "$c" store mkfs --device "$CARMINE_DIR/osd.2.store" --size 4G >/dev/null
fi
cpu() {
  local t=0 i f
  for i in 0 1 2; do
    read -ra f <"/proc/$(cat "$CARMINE_DIR/osd.$i.pid")/stat"
    t=$((t + f[13] + f[14]))
  done
  echo $t
}
"$c" cluster up "$@" >/dev/null
t0=$(date +%s.%N)
c0=$(cpu)
line=
for _ in $(seq 1 600); do
  line=$("$c" cluster status 2>/dev/null | grep "pg states" || true)
  echo "$line" | grep -q "0 peering.*; 0 objects to recover, 0 misplaced, [1-9]" && break
  sleep 0.1
done
t1=$(date +%s.%N)
c1=$(cpu)
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$(cat "$CARMINE_DIR/osd.2.pid")/status")
echo "$store, $pg PGs $*: refilled in $(echo "$t1 - $t0" | bc) s, OSD CPU $(echo "scale=2; ($c1 - $c0) / $(getconf CLK_TCK)" | bc) s, osd.2 peak RSS $hwm MiB"
echo "  ${line# }"
