#!/usr/bin/env bash
# A/B: mimalloc with THP (default) vs MIMALLOC_ALLOW_THP=0, alternated.
# Its outputs went to /tmp/thp; the reports were copied here as r<round>-<mode>-<store>.md,
# the refill lines as refill-ab.txt, and summary.txt is the table of means the decision quotes.
cd /work/main
c=target/release/carmine
for r in 1 2 3; do
  for mode in thp nothp; do
    if [ $mode = nothp ]; then export MIMALLOC_ALLOW_THP=0; else unset MIMALLOC_ALLOW_THP; fi
    for store in memory native; do
      $c bench --osds 3 --size 3 --store $store --workloads randwrite,randread,seqwrite --depths 1,64 \
        --step-secs 4 --ramp-secs 1 --no-early-exit --no-ceiling --volume-size 1G --device-size 3G \
        --osd-cpu 1 --client-cpu 0 --output /tmp/thp/r$r-$mode-$store >/tmp/thp/r$r-$mode-$store.log 2>&1
      echo "r$r $mode $store exit $?"
    done
    CARMINE=$c bash bench/refill.sh native 64 2>&1 | sed "s/^/r$r $mode refill: /"
  done
done
