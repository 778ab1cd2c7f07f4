#!/usr/bin/env bash
# A throw-away single-node Ceph from Debian's packages on 127.0.0.1, for side-by-side runs:
# 1 mon, 1 mgr, OSDS classic OSDs (BlueStore on sparse files, or MemStore), one pool "rbd" of
# SIZE copies (min_size a majority), no auth.
#
#   bench/ceph/vstart-ceph.sh up   DIR [bluestore|memstore] [OSD_CPUS] [OSDS] [SIZE]
#                                                              # prints CEPH_CONF=...
#   bench/ceph/vstart-ceph.sh down DIR                         # stops exactly those pids
#
# Debian's ceph-osd is built without tcmalloc, which costs it 28-41% on 4 KiB random I/O on
# this kind of machine; tcmalloc is preloaded into the OSDs when libgoogle-perftools4 is
# installed (CEPH_TCMALLOC=0 turns that off). The script prints TCMALLOC=yes|no.
#
# Needs: apt-get install ceph-mon ceph-osd ceph-mgr ceph-common (run as root).
set -euo pipefail
cmd=${1:?up|down}; dir=${2:?directory}
store=${3:-bluestore}; osd_cpus=${4:-}; osds=${5:-1}; size=${6:-1}
min_size=$((size - size / 2))
tcmalloc=""
for lib in /usr/lib/*/libtcmalloc.so.4 /usr/lib/libtcmalloc.so.4; do
  if [ -e "$lib" ] && [ "${CEPH_TCMALLOC:-1}" != 0 ]; then tcmalloc=$lib; break; fi
done

down() {
  for p in "$dir"/*.pid; do
    [ -f "$p" ] || continue
    pid=$(cat "$p")
    if grep -qa -- "$dir" "/proc/$pid/cmdline" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  done
  for p in "$dir"/*.pid; do
    [ -f "$p" ] || continue
    pid=$(cat "$p")
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$p"
  done
}

if [ "$cmd" = down ]; then down; exit 0; fi

mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
down
rm -rf "${dir:?}"/{mon.a,osd.*,mgr.x,run,*.log,ceph.conf,monmap,keyring}
mkdir -p "$dir"/{mon.a,mgr.x,run}
fsid=$(cat /proc/sys/kernel/random/uuid)
# The mon's port: outside the 6800-7300 range the OSD and mgr bind, and free now.
port=$((40000 + RANDOM % 20000))
while ss -ltn 2>/dev/null | grep -q ":$port "; do port=$((40000 + RANDOM % 20000)); done
conf="$dir/ceph.conf"
cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
osd pool default size = $size
osd pool default min size = $min_size
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/\$name.log
pid file = $dir/\$name.pid
ms bind msgr2 = false
keyring = $dir/keyring
[client]
# librbd's cache would acknowledge writes from the client's memory once fio's first flush
# switched it to writeback (measured: 4k randwrite qd1 13.6K IOPS with it, 1.6K without;
# qd16 15.5K vs 7.0K): not the durable write Carmine acknowledges. Off, like for like.
rbd cache = false
[mon.a]
mon data = $dir/mon.a
[mgr.x]
mgr data = $dir/mgr.x
[osd]
osd class update on start = false
osd data = $dir/\$name
osd objectstore = $store
bluestore block path = $dir/\$name.block
bluestore block create = true
bluestore block size = 8589934592
bluestore fsck on mkfs = false
memstore device bytes = 4294967296
CONF

ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' > /dev/null
monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" > /dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -c "$conf" -i a
for _ in $(seq 50); do ceph -c "$conf" -s > /dev/null 2>&1 && break; sleep 0.2; done
ceph-mgr -c "$conf" -i x
for _ in $(seq "$osds"); do
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph -c "$conf" osd new "$uuid")
  mkdir -p "$dir/osd.$id"
  ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" > "$dir/osd-mkfs.$id.log" 2>&1
  run=(ceph-osd -c "$conf" -i "$id")
  if [ -n "$osd_cpus" ]; then run=(taskset -c "$osd_cpus" "${run[@]}"); fi
  if [ -n "$tcmalloc" ]; then run=(env LD_PRELOAD="$tcmalloc" "${run[@]}"); fi
  # An OSD's first command to the mon at boot is sometimes refused ("wrong fsid", seen with
  # several OSDs starting one after another) and the OSD exits; a second start works.
  for attempt in 1 2 3; do
    "${run[@]}" && break
    [ "$attempt" = 3 ] && { echo "osd.$id did not start" >&2; exit 1; }
    sleep 1
  done
done
for _ in $(seq 150); do ceph -c "$conf" osd stat 2>/dev/null | grep -q "$osds up" && break; sleep 0.2; done
ceph -c "$conf" osd pool create rbd 32 32 > /dev/null 2>&1
ceph -c "$conf" osd pool set rbd size "$size" --yes-i-really-mean-it > /dev/null 2>&1
ceph -c "$conf" osd pool set rbd min_size "$min_size" > /dev/null 2>&1
rbd -c "$conf" pool init rbd
echo "CEPH_CONF=$conf"
echo "TCMALLOC=$([ -n "$tcmalloc" ] && echo yes || echo no)"
