#!/usr/bin/env bash
# Native store vs the raw device, in one run on this machine:
#   1. fio, O_DIRECT + io_uring, on a file of the store's size (written once first, like the
#      store's backing file), pinned to the OSD's core: 4K random write and read at depths 1,
#      16, 64, and 64K sequential write and read at depths 1 and 16; writes also *durable*,
#      with an fdatasync after every `depth` writes (a group commit of the whole queue: the
#      most the store's group commit could batch, so the baseline most generous to raw);
#   2. `carmine bench --store native` (1 OSD, 1 reactor on that core, client on the other),
#      with fdatasync per group commit and without;
# and writes summary.md with both side by side: durable store writes against durable raw
# writes, everything else against plain raw. Usage: bench/native-vs-raw.sh OUT_DIR
# [DEVICE_SIZE=4G] [VOLUME=1G] [STEP_SECS=5]
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [DEVICE_SIZE] [VOLUME] [STEP_SECS]}
size=${2:-4G}
volume=${3:-1G}
step=${4:-5}
carmine=${CARMINE:-target/release/carmine}
mkdir -p "$out"
command -v fio >/dev/null || { echo "needs fio (apt-get install fio)" >&2; exit 1; }
raw="$out/raw.dat"
echo "preparing $size raw file"
fallocate -l "$size" "$raw"
dd if=/dev/zero of="$raw" bs=8M count=$(( $(stat -c %s "$raw") / 8388608 )) oflag=direct conv=notrunc status=none
: > "$out/raw.tsv"
raw_fio() { # NAME RW BS QD [fio options...]
  local name=$1 rw=$2 bs=$3 qd=$4
  shift 4
  taskset -c 1 fio --name=raw --filename="$raw" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --ioengine=io_uring --direct=1 --time_based --runtime="$step" --ramp_time=1 "$@" \
    --output-format=json > "$out/fio-$name-$qd.json"
  python3 - "$out/fio-$name-$qd.json" "$name" "$qd" >> "$out/raw.tsv" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
k = "write" if "write" in sys.argv[2] else "read"
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{j[k]['iops']:.0f}\t{j[k]['clat_ns']['mean']/1000:.1f}")
PY
}
for qd in 1 16 64; do
  raw_fio randwrite randwrite 4k $qd
  raw_fio randwrite-durable randwrite 4k $qd --fdatasync=$qd
  raw_fio randread randread 4k $qd
done
for qd in 1 16; do
  raw_fio seqwrite write 64k $qd
  raw_fio seqwrite-durable write 64k $qd --fdatasync=$qd
  raw_fio seqread read 64k $qd
done
rm -f "$raw"
for mode in fsync nofsync; do
  extra=()
  [ $mode = nofsync ] && extra=(--no-fsync)
  "$carmine" bench --store native --device-size "$size" --volume-size "$volume" \
    --workloads randwrite,randread,seqwrite,seqread --random-depths 1,16,64 --seq-depths 1,16 \
    --no-early-exit --no-ceiling --osd-cpu 1 --client-cpu 0 \
    --step-secs "$step" --ramp-secs 1 "${extra[@]}" --output "$out/carmine-$mode" > "$out/carmine-$mode.log" 2>&1 || true
  rm -rf "$out/carmine-$mode/cluster/osd.0.store"
done
python3 - "$out" > "$out/summary.md" <<'PY'
import json, sys, os
out = sys.argv[1]
raw = {}
for line in open(os.path.join(out, "raw.tsv")):
    rw, qd, iops, lat = line.split("\t")
    raw[(rw, int(qd))] = (float(iops), float(lat))
runs = {}
for mode in ("fsync", "nofsync"):
    p = os.path.join(out, f"carmine-{mode}", "results.json")
    if os.path.exists(p):
        for r in json.load(open(p))["rows"]:
            u = r["usage"]
            c = r["carmine"]
            user = c["iops"] * r["bs"] * u["wall_secs"]
            wa = u["disk_written_bytes"] / user if user and r["workload"].endswith("write") else None
            runs[(mode, r["workload"], r["depth"])] = (c["iops"], c["lat_mean_us"], wa)
print("| workload | qd | raw fio IOPS | raw mean us | raw durable IOPS | raw durable mean us | native (fdatasync) IOPS | % of raw durable | mean us | write amp | native (no fsync) IOPS | % of raw | mean us | write amp |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for rw, depths in (("randwrite", (1, 16, 64)), ("randread", (1, 16, 64)),
                   ("seqwrite", (1, 16)), ("seqread", (1, 16))):
    for qd in depths:
        ri, rl = raw.get((rw, qd), (0, 0))
        di, dl = raw.get((rw + "-durable", qd), (0, 0))
        cells = [rw, str(qd), f"{ri:.0f}", f"{rl:.1f}",
                 f"{di:.0f}" if di else "-", f"{dl:.1f}" if di else "-"]
        for mode in ("fsync", "nofsync"):
            i, l, wa = runs.get((mode, rw, qd), (0, 0, None))
            # Durable store writes are held against durable raw writes; reads and the
            # no-fsync mode against plain raw.
            base = di if (mode == "fsync" and di) else ri
            cells += [f"{i:.0f}", f"{100*i/base:.0f}%" if base else "-", f"{l:.1f}", f"{wa:.2f}" if wa else "-"]
        print("| " + " | ".join(cells) + " |")
PY
cat "$out/summary.md"
