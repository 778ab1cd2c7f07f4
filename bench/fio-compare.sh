#!/usr/bin/env bash
# One run, same box, same fio, same steps: Carmine through its NBD gateway (fio nbd engine),
# memory and native store, next to a real Ceph 16.2 classic OSD with BlueStore on a sparse file
# and with MemStore (fio rbd engine).
# 4K random read/write and 64K sequential read/write at queue depths 1, 16, 64; 1 GiB image or
# volume, prefilled. Servers on cpu 1 (Carmine OSD reactor / ceph-osd); fio (and the NBD
# gateway, which plays librbd's role) on cpu 0.
#
# Usage: bench/fio-compare.sh [RUNTIME_SECONDS] [OUTPUT_DIR]
# Needs root and: apt-get install fio ceph-mon ceph-osd ceph-mgr ceph-common qemu-utils libnbd-bin
set -euo pipefail
runtime=${1:-5}
out=${2:-carmine-bench/fio-compare-$(date -u +%Y%m%d-%H%M%S)}
carmine=${CARMINE:-target/release/carmine}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"; out=$(cd "$out" && pwd)

steps="randread:4k randwrite:4k read:64k write:64k"
# Which object stores to run on each side (env): Ceph bluestore/memstore, Carmine memory/native.
CEPH_STORES=${CEPH_STORES:-"bluestore memstore"}
CARMINE_STORES=${CARMINE_STORES:-"memory native"}
depths="1 16 64"

# fio_sweep NAME ENGINE_ARGS...: runs every step, one JSON per step under $out/NAME/.
fio_sweep() {
  local name=$1; shift
  mkdir -p "$out/$name"
  taskset -c 0 fio --name=prefill "$@" --rw=write --bs=1M --iodepth=8 --size=1G > /dev/null
  for spec in $steps; do
    local rw=${spec%%:*} bs=${spec##*:}
    for qd in $depths; do
      taskset -c 0 fio --name="$rw-$bs-qd$qd" "$@" --rw="$rw" --bs="$bs" --iodepth="$qd" --size=1G \
        --time_based --runtime="$runtime" --ramp_time=1 --output-format=json \
        --output="$out/$name/$rw-$bs-qd$qd.json" > /dev/null
      echo "$name $rw $bs qd$qd done" >&2
    done
  done
}

# Ceph, one throw-away cluster per object store.
for store in $CEPH_STORES; do
  ceph_dir="$out/ceph-$store-cluster"
  trap '"$here/ceph/vstart-ceph.sh" down "$ceph_dir" || true' EXIT
  eval "$("$here/ceph/vstart-ceph.sh" up "$ceph_dir" "$store" 1 | grep '^CEPH_CONF=')"
  export CEPH_CONF
  for _ in $(seq 60); do ceph pg stat 2>/dev/null | grep -q "active+clean" && ! ceph pg stat | grep -q "unknown\|creating\|peering" && break; sleep 1; done
  rbd create --size 1G rbd/bench
  fio_sweep "ceph-$store" --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench
  "$here/ceph/vstart-ceph.sh" down "$ceph_dir"
  trap - EXIT
done

# Carmine, one throw-away cluster per store (native: a 4 GiB backing file, fdatasync on).
for store in $CARMINE_STORES; do
  cdir="$out/carmine-$store-cluster"
  port=$((20000 + RANDOM % 20000))
  "$carmine" cluster up --dir "$cdir" --cpu-set 1 --memory-limit 4G --store "$store" --device-size 4G > /dev/null
  trap '[ -n "${gw:-}" ] && kill "$gw" 2>/dev/null; "$carmine" cluster down --dir "$cdir" > /dev/null || true' EXIT
  "$carmine" volume create bench --size 1G --dir "$cdir" > /dev/null
  taskset -c 0 "$carmine" nbd serve --export bench --listen "127.0.0.1:$port" --dir "$cdir" > /dev/null 2>&1 &
  gw=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  fio_sweep "carmine-$store" --ioengine=nbd --uri="nbd://127.0.0.1:$port/bench"
  kill "$gw"; wait "$gw" 2>/dev/null || true; gw=
  "$carmine" cluster down --dir "$cdir" > /dev/null
  rm -f "$cdir"/osd.*.store
  trap - EXIT
done

systems="$(for s in $CEPH_STORES; do echo -n "ceph-$s "; done)$(for s in $CARMINE_STORES; do echo -n "carmine-$s "; done)"
python3 - "$out" "$steps" "$depths" "$systems" > "$out/table.md" <<'PY'
import json, sys, os
out, steps, depths, systems = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
def side(name, rw, bs, qd):
    j = json.load(open(os.path.join(out, name, f"{rw}-{bs}-qd{qd}.json")))["jobs"][0]
    s = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
    return s["iops"], s["clat_ns"]["mean"] / 1000, s["clat_ns"]["percentile"].get("99.000000", 0) / 1000
ceph = [s for s in systems if s.startswith("ceph-")]
carm = [s for s in systems if s.startswith("carmine-")]
head = ["workload", "qd"]
for s in systems:
    head += [f"{s} IOPS", "mean µs", "p99 µs"]
head += [f"{k} / {c}" for k in carm for c in ceph]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for spec in steps:
    rw, bs = spec.split(":")
    for qd in depths:
        r = {s: side(s, rw, bs, qd) for s in systems}
        cells = [f"{rw} {bs}", qd]
        for s in systems:
            cells += [f"{r[s][0]:,.0f}", f"{r[s][1]:.0f}", f"{r[s][2]:.0f}"]
        cells += [f"{r[k][0]/max(r[c][0],1):.1f}×" for k in carm for c in ceph]
        print("| " + " | ".join(cells) + " |")
PY
cat "$out/table.md"
